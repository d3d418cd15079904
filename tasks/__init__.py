"""Simulated tasks and adapters behind robotrl's VecEnv contract (imported as robotrl.tasks)."""

from __future__ import annotations

from typing import Any

from robotrl.tasks.configs import GymTaskConfig

TASK_CONFIGS: dict[str, type] = {"gym": GymTaskConfig}


def make_env(task_cfg: Any, num_envs: int = 1, render: bool = False):
    """Build the VecEnv a task config describes; unknown task names list the available ones."""
    name = getattr(task_cfg, "name", None)
    if name == "gym":
        from robotrl.tasks.gym_env import GymVecEnv

        return GymVecEnv(task_cfg, num_envs=num_envs, render=render)
    raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(sorted(TASK_CONFIGS))}")
