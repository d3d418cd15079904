"""SAC with hindsight relabelling on gymnasium-robotics' Fetch tasks: robotrl next to stable-baselines3's SAC with
HerReplayBuffer, both run by this script on the same machine, at equal env steps and equal settings.

    python bench/her_fetch.py [--quick] [--seeds 2] [--first-seed 1] [--reach-steps 5000] [--push-steps 50000]
                              [--eval-every 500] [--jobs 2] [--save] [OVERRIDE ...]

Both libraries get SB3 zoo's FetchReach settings (HER_SETTINGS): 4 relabelled "future" goals per real one,
gamma 0.95, tau 0.05, learning rate 1e-3, 64x64 networks, batch 256, 1000 random steps, observations
normalised (robotrl's agent.obs_norm; SB3 through VecNormalize, as the zoo does). Every `--eval-every` env
steps each run evaluates its deterministic policy on 20 fresh episodes and records the success rate.

Figures: per task and seed each library's success curve; `reach_steps_to_90_ratio` = robotrl's mean env steps
to a first evaluation at >= 90% success on FetchReach-v4 over SB3's (a run that never gets there counts its
step budget plus one evaluation interval; goal: at most 1.0), and `push_success_ratio` = robotrl's mean final
success on FetchPush-v4 over SB3's (goal: at least 1.0; null where SB3's is 0, both values reported).
--quick: 2,000 steps on each task, one seed, the same keys.

Every (library, task, seed) run is its own process on one thread, `--jobs` side by side. Positional OVERRIDEs are
Hydra overrides for robotrl's runs (after HER_SETTINGS; a later one of a key wins), composed before any run
starts, so a bad one fails naming it; `robotrl_overrides` records them. SB3's side keeps HER_SETTINGS.
"""

from __future__ import annotations

import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, merge_overrides, parse_args, refuse_keys, run_logged, train_config

REACH, PUSH = "FetchReach-v4", "FetchPush-v4"
EVAL_EPISODES = 20
# SB3 zoo's FetchReach hyperparameters (rl-baselines3-zoo hyperparams/her.yml), given to both libraries
GAMMA, TAU, LEARNING_RATE, HIDDEN, BATCH, LEARNING_STARTS, RELABELLED_GOALS = 0.95, 0.05, 1e-3, 64, 256, 1000, 4
HER_SETTINGS = [
    f"her_ratio={RELABELLED_GOALS / (RELABELLED_GOALS + 1)}",  # SB3's n_sampled_goal=4: 4 of 5 relabelled
    f"agent.gamma={GAMMA}",
    f"agent.tau={TAU}",
    f"agent.actor_lr={LEARNING_RATE}",
    f"agent.critic_lr={LEARNING_RATE}",
    f"agent.alpha_lr={LEARNING_RATE}",
    f"agent.actor_hidden=[{HIDDEN},{HIDDEN}]",
    f"agent.critic_hidden=[{HIDDEN},{HIDDEN}]",
    f"agent.batch_size={BATCH}",
    f"learning_starts={LEARNING_STARTS}",
    "agent.obs_norm=true",
]
BENCH_KEYS = {
    "task": "task=gym",
    "task.env_id": "the bench's two tasks",
    "seed": "--seeds, --first-seed",
    "total_steps": "--reach-steps, --push-steps",
    "eval_interval": "--eval-every",
    "eval_episodes": f"{EVAL_EPISODES}, fixed",
}


def run_overrides(env_id: str, steps: int, seed: int, eval_every: int, overrides: list[str]) -> list[str]:
    defaults = [
        "task=gym",
        f"task.env_id={env_id}",
        f"seed={seed}",
        f"total_steps={steps}",
        f"eval_interval={eval_every}",
        f"eval_episodes={EVAL_EPISODES}",
        "checkpoint_interval=1000000000",
        "checkpoint_replay=false",
        "threads=1",
        "video=false",
        "progress=false",
    ]
    return merge_overrides(defaults, HER_SETTINGS, overrides)


def robotrl_curve(env_id: str, steps: int, seed: int, eval_every: int, overrides: list[str], workdir: Path) -> list:
    """[(env step, success), ...] of one robotrl run, from its metrics.csv."""
    import csv

    run_dir = workdir / f"robotrl_{env_id}_s{seed}"
    cmd = [sys.executable, "-m", "robotrl.train", *run_overrides(env_id, steps, seed, eval_every, overrides)]
    run_logged([*cmd, f"hydra.run.dir={run_dir}"], run_dir.with_suffix(".log"))
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["key"] == "eval/success"]


def sb3_curve(env_id: str, steps: int, seed: int, eval_every: int, workdir: Path) -> list:
    log = workdir / f"sb3_{env_id}_s{seed}.log"
    run_logged([sys.executable, __file__, "--sb3-run", env_id, str(steps), str(seed), str(eval_every)], log)
    return [tuple(point) for point in json.loads(log.read_text().strip().splitlines()[-1])["curve"]]


def sb3_run(env_id: str, steps: int, seed: int, eval_every: int) -> None:
    """In a child process: SB3 SAC + HerReplayBuffer with HER_SETTINGS on one thread; prints {"curve": ...} last."""
    import gymnasium as gym
    import gymnasium_robotics
    import numpy as np
    import torch
    from stable_baselines3 import SAC, HerReplayBuffer
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    gym.register_envs(gymnasium_robotics)
    torch.set_num_threads(1)
    env = VecNormalize(DummyVecEnv([lambda: gym.make(env_id)]), norm_obs=True, norm_reward=False)
    eval_env = gym.make(env_id)
    curve = []

    def success_rate() -> float:
        wins = 0
        for episode in range(EVAL_EPISODES):
            obs, _ = eval_env.reset(seed=10_000 + seed * 100 + episode)
            done, info = False, {}
            while not done:
                batch = {k: np.asarray(v)[None] for k, v in obs.items()}
                action, _ = model.predict(env.normalize_obs(batch), deterministic=True)
                obs, _, terminated, truncated, info = eval_env.step(action[0])
                done = terminated or truncated
            wins += bool(info.get("is_success", False))
        return wins / EVAL_EPISODES

    class EvalEvery(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                curve.append((self.num_timesteps, success_rate()))
            return True

    model = SAC(
        "MultiInputPolicy",
        env,
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=RELABELLED_GOALS, goal_selection_strategy="future"),
        gamma=GAMMA,
        tau=TAU,
        learning_rate=LEARNING_RATE,
        batch_size=BATCH,
        learning_starts=LEARNING_STARTS,
        policy_kwargs=dict(net_arch=[HIDDEN, HIDDEN]),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(steps, callback=EvalEvery())
    print(json.dumps({"curve": curve}), flush=True)


def steps_to(curve: list, threshold: float, budget: int, eval_every: int) -> int:
    """The env step of the first evaluation at or above `threshold`; never reached: the budget plus one interval."""
    return next((step for step, success in curve if success >= threshold), budget + eval_every)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--sb3-run":
        sb3_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return

    def extra(p):
        p.add_argument("--seeds", type=int, default=2)
        p.add_argument("--first-seed", type=int, default=1)
        p.add_argument("--reach-steps", type=int, default=5_000)
        p.add_argument("--push-steps", type=int, default=50_000)
        p.add_argument("--eval-every", type=int, default=500)
        p.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")

    args = parse_args(__doc__, extra, overrides=True)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    budgets = {REACH: args.reach_steps, PUSH: args.push_steps}
    if args.quick:
        seeds, budgets = range(1, 2), {REACH: 2_000, PUSH: 2_000}
    for name in ("seeds", "jobs", "eval_every", "reach_steps", "push_steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    refuse_keys(args.overrides, BENCH_KEYS)
    for env_id, steps in budgets.items():  # every run's overrides composed before any starts
        train_config(run_overrides(env_id, steps, seeds[0], args.eval_every, args.overrides), f"robotrl {env_id} run")
    figures: dict = {
        "steps": budgets,
        "seeds": list(seeds),
        "eval_every": args.eval_every,
        "robotrl_overrides": merge_overrides(HER_SETTINGS, args.overrides),
    }
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        workdir = Path(tmp)
        runs = [(e, s) for e in budgets for s in seeds]
        ours = {r: pool.submit(robotrl_curve, r[0], budgets[r[0]], r[1], args.eval_every, args.overrides, workdir)
                for r in runs}  # fmt: skip
        theirs = {r: pool.submit(sb3_curve, r[0], budgets[r[0]], r[1], args.eval_every, workdir) for r in runs}
        curves = {env_id: {"robotrl": [], "sb3": []} for env_id in budgets}
        for env_id, seed in runs:
            curves[env_id]["robotrl"].append(ours[env_id, seed].result())
            curves[env_id]["sb3"].append(theirs[env_id, seed].result())
    for env_id, sides in curves.items():
        figures[env_id] = {side: [[list(p) for p in curve] for curve in sides[side]] for side in sides}

    def mean(values):
        return sum(values) / len(values)

    reach = {side: mean([steps_to(c, 0.9, budgets[REACH], args.eval_every) for c in curves[REACH][side]])
             for side in ("robotrl", "sb3")}  # fmt: skip
    push = {side: mean([c[-1][1] if c else 0.0 for c in curves[PUSH][side]]) for side in ("robotrl", "sb3")}
    figures["reach_steps_to_90"] = reach
    figures["push_final_success"] = push
    figures["reach_steps_to_90_ratio"] = round(reach["robotrl"] / reach["sb3"], 3)
    figures["push_success_ratio"] = round(push["robotrl"] / push["sb3"], 3) if push["sb3"] > 0 else None
    emit("her_fetch", figures, args.save)


if __name__ == "__main__":
    main()
