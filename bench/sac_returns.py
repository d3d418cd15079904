"""Returns after a fixed number of env steps: robotrl SAC next to stable-baselines3 SAC (its defaults),
both run by this script on the same machine.

    python bench/sac_returns.py [--quick] [--envs HalfCheetah-v5,Hopper-v5] [--seeds 2] [--first-seed 1]
                                [--steps 100000] [--jobs 2] [--save] [OVERRIDE ...]

Every (library, env, seed) run is its own process on one thread, `--jobs` of them side by side (one per
core), so a 100k-step pair costs about 25 minutes of wall-clock on two cores instead of 50.

Figures per env: mean deterministic evaluation return (10 episodes) per seed for each library, and
`ratio` = robotrl's mean over seeds / SB3's. Goal: ours at least SB3's at equal steps (ratio >= 1 on
positive-return tasks). Full run: 100k steps on HalfCheetah-v5 and Hopper-v5; --quick: 3k steps on
Pendulum-v1 (ratio is then computed on -return, since Pendulum returns are negative: higher is better).

robotrl runs `robotrl-train task=gym` with LOCOMOTION (bench/common.py: learning_starts=100 agent.init_alpha=1.0
agent.log_std_min=-20) and then the positional OVERRIDEs, Hydra overrides as robotrl-train takes them
(`agent.init_alpha=0.1` undoes one, `agent.batch_size=512` adds one; a later one wins over an earlier one of the
same key); `robotrl_overrides` in the JSON line records the list the runs got. Every run's overrides are composed
before any run starts: an unknown key or a bad value fails naming it. SB3's side keeps its defaults.
"""

from __future__ import annotations

import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LOCOMOTION, emit, merge_overrides, parse_args, refuse_keys, run_logged, train_config

# What the bench's own options set: an override of one of these keys exits naming the option.
BENCH_KEYS = {"task": "task=gym", "task.env_id": "--envs", "seed": "--seeds, --first-seed", "total_steps": "--steps"}


def run_overrides(env_id: str, steps: int, seed: int, overrides: list[str]) -> list[str]:
    """One robotrl run's overrides, one per key: the bench's defaults, then `overrides` (each later one winning)."""
    defaults = [
        "task=gym",
        f"task.env_id={env_id}",
        f"seed={seed}",
        f"total_steps={steps}",
        f"learning_starts={min(5_000, steps // 10)}",
        "eval_interval=1000000000",
        "eval_episodes=10",
        "checkpoint_interval=1000000000",
        "checkpoint_replay=false",
        "threads=1",
        "video=false",
        "progress=false",
    ]
    return merge_overrides(defaults, overrides)


def robotrl_return(env_id: str, steps: int, seed: int, overrides: list[str], workdir: Path) -> float:
    run_dir = workdir / f"robotrl_{env_id}_s{seed}"
    cmd = [sys.executable, "-m", "robotrl.train", *run_overrides(env_id, steps, seed, overrides)]
    run_logged([*cmd, f"hydra.run.dir={run_dir}"], run_dir.with_suffix(".log"))
    return json.loads((run_dir / "summary.json").read_text())["eval/return"]


def sb3_return(env_id: str, steps: int, seed: int, workdir: Path) -> float:
    log = workdir / f"sb3_{env_id}_s{seed}.log"
    run_logged([sys.executable, __file__, "--sb3-run", env_id, str(steps), str(seed)], log)
    return json.loads(log.read_text().strip().splitlines()[-1])["return"]


def sb3_run(env_id: str, steps: int, seed: int) -> None:
    """In a child process: SB3 SAC with its defaults, one thread; prints {"return": ...} last."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    model = SB3SAC("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0)
    model.learn(steps)
    mean, _ = evaluate_policy(model, gym.make(env_id), n_eval_episodes=10, deterministic=True)
    print(json.dumps({"return": float(mean)}), flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--sb3-run":
        sb3_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return

    def extra(p):
        p.add_argument("--seeds", type=int, default=2)
        p.add_argument("--first-seed", type=int, default=1)
        p.add_argument("--steps", type=int, default=100_000)
        p.add_argument("--envs", default="HalfCheetah-v5,Hopper-v5")
        p.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")

    args = parse_args(__doc__, extra, overrides=True)
    envs, steps, seeds = args.envs.split(","), args.steps, range(args.first_seed, args.first_seed + args.seeds)
    if args.quick:
        envs, steps, seeds = ["Pendulum-v1"], 3_000, range(1, 2)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    refuse_keys(args.overrides, BENCH_KEYS)
    overrides = merge_overrides(LOCOMOTION, args.overrides)
    for env_id in envs:  # every run's overrides composed before any starts: a bad one fails naming it
        train_config(run_overrides(env_id, steps, seeds[0], overrides), f"robotrl {env_id} run")
    figures: dict = {"steps": steps, "seeds": list(seeds), "robotrl_overrides": overrides}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        workdir = Path(tmp)
        ours = {(e, s): pool.submit(robotrl_return, e, steps, s, overrides, workdir) for e in envs for s in seeds}
        theirs = {(e, s): pool.submit(sb3_return, e, steps, s, workdir) for e in envs for s in seeds}
        ratios = []
        for env_id in envs:
            mine = [ours[env_id, s].result() for s in seeds]
            sb3 = [theirs[env_id, s].result() for s in seeds]
            mean_ours, mean_theirs = sum(mine) / len(mine), sum(sb3) / len(sb3)
            ratio = mean_ours / mean_theirs if mean_theirs > 0 else mean_theirs / mean_ours
            ratios.append(ratio)
            figures[env_id] = {
                "robotrl": [round(r, 1) for r in mine],
                "sb3": [round(r, 1) for r in sb3],
                "robotrl_mean": round(mean_ours, 1),
                "sb3_mean": round(mean_theirs, 1),
                "ratio": round(ratio, 3),
            }
    figures["min_ratio"] = round(min(ratios), 3)
    emit("sac_returns", figures, args.save)


if __name__ == "__main__":
    main()
