"""Simulated tasks and adapters behind robotrl's VecEnv contract (imported as robotrl.tasks)."""

from __future__ import annotations

from typing import Any

from robotrl.tasks.configs import ArmTaskConfig, GymTaskConfig, HandTaskConfig

ARM_TASKS = {
    "panda_reach": "robotrl.tasks.panda_reach:PandaReach",
    "panda_push": "robotrl.tasks.panda_push:PandaPush",
    "panda_pick_cube": "robotrl.tasks.panda_pick_cube:PandaPickCube",
    "panda_peg_insert": "robotrl.tasks.panda_peg_insert:PandaPegInsert",
}
HAND_TASKS = {"hand_reorient": "robotrl.tasks.hand_reorient:HandReorient"}
SIM_TASKS = {**ARM_TASKS, **HAND_TASKS}  # built-in tasks on a SimBackend
TASK_CONFIGS: dict[str, type] = {
    "gym": GymTaskConfig,
    **{name: ArmTaskConfig for name in ARM_TASKS},
    **{name: HandTaskConfig for name in HAND_TASKS},
}


def make_task(task_cfg: Any, num_envs: int = 1):
    """The ArmTask object a built-in task config names (for scripted experts and tests)."""
    import importlib

    module, cls = SIM_TASKS[task_cfg.name].split(":")
    return getattr(importlib.import_module(module), cls)(task_cfg, num_envs)


def make_env(task_cfg: Any, num_envs: int = 1, render: bool = False):
    """Build the VecEnv a task config describes; unknown task names list the available ones."""
    name = getattr(task_cfg, "name", None)
    if name == "gym":
        from robotrl.tasks.gym_env import GymVecEnv

        return GymVecEnv(task_cfg, num_envs=num_envs, render=render)
    if name in SIM_TASKS:
        from robotrl.tasks.arm_task import TaskVecEnv

        return TaskVecEnv(make_task(task_cfg, num_envs))
    raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(sorted(TASK_CONFIGS))}")


def _register_gymnasium_ids() -> None:
    try:
        from robotrl.tasks.gym_api import register_envs
    except ImportError:  # gymnasium absent: the Hydra path still works
        return
    register_envs()


_register_gymnasium_ids()
