"""Returns after a fixed number of env steps: robotrl SAC next to stable-baselines3 SAC (its defaults),
both run by this script on the same machine.

Figures per env: mean deterministic evaluation return (10 episodes) per seed for each library, and
`ratio` = robotrl's mean over seeds / SB3's. Goal: ours at least SB3's at equal steps (ratio >= 1 on
positive-return tasks). Full run: 100k steps on HalfCheetah-v5 and Hopper-v5; --quick: 3k steps on
Pendulum-v1 (ratio is then computed on -return, since Pendulum returns are negative: higher is better).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args


def robotrl_return(env_id: str, steps: int, seed: int, precision: str) -> float:
    from robotrl.tasks.configs import GymTaskConfig

    from robotrl.agents import SACConfig
    from robotrl.config import TrainConfig
    from robotrl.runtime.loop import train

    cfg = TrainConfig(
        agent=SACConfig(precision=precision),
        task=GymTaskConfig(env_id=env_id),
        seed=seed,
        total_steps=steps,
        learning_starts=min(5_000, steps // 10),
        eval_interval=10**9,
        eval_episodes=10,
        checkpoint_interval=10**9,
        checkpoint_replay=False,
        video=False,
        progress=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        return train(cfg, Path(tmp))["eval/return"]


def sb3_return(env_id: str, steps: int, seed: int) -> float:
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.evaluation import evaluate_policy

    model = SB3SAC("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0)
    model.learn(steps)
    mean, _ = evaluate_policy(model, gym.make(env_id), n_eval_episodes=10, deterministic=True)
    return float(mean)


def main() -> None:
    def extra(p):
        p.add_argument("--seeds", type=int, default=2)
        p.add_argument("--steps", type=int, default=100_000)
        p.add_argument("--envs", default="HalfCheetah-v5,Hopper-v5")
        p.add_argument("--precision", default="fp32")

    args = parse_args(__doc__, extra)
    envs, steps, seeds = args.envs.split(","), args.steps, args.seeds
    if args.quick:
        envs, steps, seeds = ["Pendulum-v1"], 3_000, 1
    figures: dict = {"steps": steps, "seeds": seeds, "precision": args.precision}
    ratios = []
    for env_id in envs:
        ours = [robotrl_return(env_id, steps, s, args.precision) for s in range(1, seeds + 1)]
        theirs = [sb3_return(env_id, steps, s) for s in range(1, seeds + 1)]
        mean_ours, mean_theirs = sum(ours) / len(ours), sum(theirs) / len(theirs)
        ratio = mean_ours / mean_theirs if mean_theirs > 0 else mean_theirs / mean_ours
        ratios.append(ratio)
        figures[env_id] = {
            "robotrl": [round(r, 1) for r in ours],
            "sb3": [round(r, 1) for r in theirs],
            "robotrl_mean": round(mean_ours, 1),
            "sb3_mean": round(mean_theirs, 1),
            "ratio": round(ratio, 3),
        }
    figures["min_ratio"] = round(min(ratios), 3)
    emit("sac_returns", figures, args.save)


if __name__ == "__main__":
    main()
