"""Simulated task speed, next to gymnasium-robotics FetchPickAndPlace-v4 measured in the same run.

Figures (one CPU core: torch and MuJoCo on one thread, 25 Hz control like Fetch, random actions):
- `tasks_steps_per_s`: env steps/s of every built-in task with state observations and one env;
- `tasks_batched_steps_per_s`: env steps/s with `num_envs=16` stepped in one process on the same single
  core (the backend is batched: per-step torch work is shared by the 16 envs, physics is not);
- `fetch_pick_and_place_steps_per_s`: Fetch's env steps/s (one env: gymnasium-robotics has no batching);
- `min_arm_ratio`: the slowest arm task's batched env-steps/s over Fetch's (the goal's figure), and
  `min_arm_ratio_single_env` the same with one env;
- `threaded_steps_per_s`: panda_pick_cube with 16 envs and `sim_threads=2` (uses both cores);
- `pixel_fps_84`: 84x84 frames/s from the front camera of panda_reach.
Goals: min_arm_ratio >= 2, pixel_fps_84 >= 300.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args

BATCH = 16


def task_steps_per_s(name: str, steps: int, num_envs: int = 1, sim_threads: int = 1) -> float:
    import torch
    from robotrl.tasks import TASK_CONFIGS, make_env

    env = make_env(TASK_CONFIGS[name](name=name, sim_threads=sim_threads), num_envs=num_envs)
    env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)
    actions = torch.rand(steps, num_envs, env.action_dim, generator=generator) * 2 - 1
    for i in range(20):
        env.step(actions[i])
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    rate = steps * num_envs / (time.perf_counter() - start)
    env.close()
    return rate


def fetch_steps_per_s(steps: int) -> float:
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    env = gym.make("FetchPickAndPlace-v4")
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def pixel_fps(frames: int, size: int = 84) -> float:
    from robotrl.tasks import make_task
    from robotrl.tasks.configs import ArmTaskConfig

    task = make_task(ArmTaskConfig(name="panda_reach"), 1)
    task.backend.render("front", size, size)
    start = time.perf_counter()
    for _ in range(frames):
        task.backend.render("front", size, size)
    rate = frames / (time.perf_counter() - start)
    task.backend.close()
    return rate


def main() -> None:
    args = parse_args(__doc__)
    import torch

    torch.set_num_threads(1)  # one CPU core, as the goal is stated
    from robotrl.tasks import ARM_TASKS, SIM_TASKS

    steps = 500 if args.quick else 5_000
    batched_steps = steps // 8
    figures: dict = {"steps": steps, "threads": 1, "batched_num_envs": BATCH}
    fetch = fetch_steps_per_s(steps)
    figures["fetch_pick_and_place_steps_per_s"] = round(fetch, 1)
    single = {name: task_steps_per_s(name, steps) for name in SIM_TASKS}
    batched = {name: task_steps_per_s(name, batched_steps, BATCH) for name in SIM_TASKS}
    figures["tasks_steps_per_s"] = {name: round(rate, 1) for name, rate in single.items()}
    figures["tasks_batched_steps_per_s"] = {name: round(rate, 1) for name, rate in batched.items()}
    figures["min_arm_ratio"] = round(min(batched[name] for name in ARM_TASKS) / fetch, 2)
    figures["min_arm_ratio_single_env"] = round(min(single[name] for name in ARM_TASKS) / fetch, 2)
    figures["threaded_steps_per_s"] = round(task_steps_per_s("panda_pick_cube", batched_steps, BATCH, 2), 1)
    figures["pixel_fps_84"] = round(pixel_fps(200 if args.quick else 2_000), 1)
    emit("sim_speed", figures, args.save)


if __name__ == "__main__":
    main()
