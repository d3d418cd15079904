"""Simulated task speed, next to gymnasium-robotics FetchPickAndPlace-v4 measured in the same run.

Figures: env steps/s for every built-in task with state observations (zero actions, one env, one
thread, 25 Hz control like Fetch), Fetch's env steps/s with random actions, `min_arm_ratio` (the slowest
arm task over Fetch) and `pixel_fps_84` (84x84 frames/s from the front camera of panda_reach).
Goals: min_arm_ratio >= 2, pixel_fps_84 >= 300.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args


def task_steps_per_s(name: str, steps: int) -> float:
    import torch
    from robotrl.tasks import make_env
    from robotrl.tasks.configs import ArmTaskConfig

    env = make_env(ArmTaskConfig(name=name))
    env.reset(seed=0)
    action = torch.zeros(1, env.action_dim)
    for _ in range(20):
        env.step(action)
    start = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    rate = steps / (time.perf_counter() - start)
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
    from robotrl.tasks import ARM_TASKS

    steps = 500 if args.quick else 5_000
    figures: dict = {"steps": steps, "threads": 1}
    fetch = fetch_steps_per_s(steps)
    figures["fetch_pick_and_place_steps_per_s"] = round(fetch, 1)
    rates = {name: task_steps_per_s(name, steps) for name in ARM_TASKS}
    figures["tasks_steps_per_s"] = {name: round(rate, 1) for name, rate in rates.items()}
    figures["min_arm_ratio"] = round(min(rates.values()) / fetch, 2)
    figures["pixel_fps_84"] = round(pixel_fps(200 if args.quick else 2_000), 1)
    emit("sim_speed", figures, args.save)


if __name__ == "__main__":
    main()
