"""A task's scripted expert driven through a batch of episodes, one per env: its success rate, how deep contacts
penetrate and whether the physics diverged. What bench/substeps.py and the tests judge a physics setting by (fewer,
longer physics steps per control step: task.control_substeps and task.physics_dt)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from robotrl.tasks.arm_task import TaskVecEnv
from robotrl.tasks.configs import ArmTaskConfig


@dataclass(frozen=True)
class ExpertRollout:
    success_rate: float  # episodes the expert succeeded in at least once, over all
    deepest_penetration_m: float | None  # the deepest contact seen at any control step; None: not reported
    # the deepest contact of each control step, averaged over the steps: sustained sinking (a cube into the table or
    # the fingers), which a single transient contact does not move much; None: not reported
    mean_penetration_m: float | None
    diverged: bool  # the physics blew up (MuJoCo's bad-acceleration warning): the setting is unusable
    env_steps_per_s: float  # control steps of all envs per wall-clock second, the expert's own math included


def roll_out_expert(cfg: ArmTaskConfig, episodes: int, seed: int = 0) -> ExpertRollout:
    """One episode per env of `episodes` batched envs of task `cfg`, the scripted expert acting."""
    from robotrl.tasks import make_task

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    task = make_task(cfg, num_envs=episodes)
    env = TaskVecEnv(task)
    try:
        env.reset(seed=seed)
        won = torch.zeros(episodes, dtype=torch.bool)
        running = torch.ones(episodes, dtype=torch.bool)  # an env whose episode ended is auto-reset: stop counting it
        depths: list[float] = []
        start = time.perf_counter()
        steps = 0
        for _ in range(task.episode_steps):
            try:
                result = env.step(task.expert_action())
            except FloatingPointError:
                return ExpertRollout(0.0, None, None, True, 0.0)
            steps += 1
            won |= result.success & running
            running &= ~(result.terminated | result.truncated)
            depth = task.backend.deepest_penetration()
            if depth is not None:
                depths.append(depth)
        rate = steps * episodes / (time.perf_counter() - start)
        deepest, mean = (max(depths), sum(depths) / len(depths)) if depths else (None, None)
        return ExpertRollout(float(won.float().mean()), deepest, mean, False, rate)
    finally:
        env.close()
