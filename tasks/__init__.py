"""Simulated tasks and adapters behind robotrl's VecEnv contract (imported as robotrl.tasks)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

# MuJoCo chooses its GL backend once, when it is first imported: EGL renders headless (videos, pixel
# observations) unless the user set MUJOCO_GL. Set here, before any module of this package imports mujoco
# (tasks/memory.py measures a scene with it before a backend exists).
os.environ.setdefault("MUJOCO_GL", "egl")

from robotrl.tasks.arm_task import TaskVecEnv
from robotrl.tasks.configs import ArmTaskConfig, GymTaskConfig, HandTaskConfig
from robotrl.tasks.gym_api import register_envs

from robotrl.core.deploy_spec import DeploySpec, DeploySpecError, write_deploy_spec

log = logging.getLogger(__name__)

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


def task_class(name: str) -> type:
    """The ArmTask class of built-in task `name`: its module imports no simulator (the backends are imported
    when a task is built)."""
    if name not in SIM_TASKS:
        raise ValueError(f"task {name!r} is not a built-in simulated task ({', '.join(sorted(SIM_TASKS))})")
    module, cls = SIM_TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_task(task_cfg: Any, num_envs: int = 1):
    """The ArmTask object a built-in task config names (for scripted experts and tests)."""
    return task_class(task_cfg.name)(task_cfg, num_envs)


def deploy_spec_for(task_cfg: Any, frame_stack: int = 1, env: Any = None) -> DeploySpec:
    """The deploy spec of a policy trained on built-in task `task_cfg` by an agent stacking `frame_stack` camera
    frames. Built from the task's class and config; the offsets of points the tool holds (peg_insert's peg tip)
    are measured after a reset in `env` (the task's env, already built: its observation layout is checked
    against the spec's too) or else in a one-env MuJoCo scene built for it, state only. ValueError for a task
    no robot runs (`gym`)."""
    if task_cfg.name not in SIM_TASKS:
        raise ValueError(f"task {task_cfg.name!r} is not a simulated arm task; a robot runs those")
    cls = task_class(task_cfg.name)
    held = None
    if env is not None:
        task = _inner_task(env)
        if cls.held_sites:
            env.reset(seed=0)
            held = task.measure_held_offsets()
    elif cls.held_sites:
        state_only = _replaced(task_cfg, obs="state", backend="mujoco", sim_threads=1)
        scene = TaskVecEnv(make_task(state_only, 1))
        try:
            scene.reset(seed=0)
            held = scene.task.measure_held_offsets()
        finally:
            scene.close()
    spec = cls.deploy_spec(task_cfg, frame_stack, held)
    if env is not None and (spec.obs_spec() != dict(env.obs_spec) or spec.action_dim != env.action_dim):
        raise AssertionError(  # a task whose observation_entries disagree with what it observes: a bug
            f"task {task_cfg.name!r}: its deploy spec observes {spec.obs_spec()} with {spec.action_dim} actions, its "
            f"env {dict(env.obs_spec)} with {env.action_dim}"
        )
    return spec


def write_deploy_spec_for_run(task_cfg: Any, frame_stack: int, run_dir: str | Path) -> Path | None:
    """Write the deploy spec of a run (robotrl-train's, robotrl-learner's) on built-in task `task_cfg`, its agent
    stacking `frame_stack` frames, into `run_dir` when it starts; None (nothing written) for a task no robot runs
    (`gym`)."""
    if task_cfg.name not in SIM_TASKS:
        return None
    spec = deploy_spec_for(task_cfg, frame_stack)
    path = write_deploy_spec(spec, run_dir)
    log.info("deploy spec: %s", path)
    return path


class TaskFunctions(NamedTuple):
    """A task's functions a robot needs: `score(obs) -> (reward, success)` from observation entries (None where
    the task cannot score from them), `draw_goals(count, objects, generator) -> goals` (None: draws none)."""

    score: Callable | None
    draw_goals: Callable | None


def task_functions(spec: DeploySpec) -> TaskFunctions:
    """The score and goal draw of the task `spec` names, from its module's pure torch functions (`score_from_obs`,
    `draw_episode_goals`) under the spec's task settings: nothing is built, no simulator imported."""
    cls = task_class(spec.task)
    module = importlib.import_module(cls.__module__)
    try:
        task_cfg = TASK_CONFIGS[spec.task](**spec.task_config)
    except TypeError as error:
        raise DeploySpecError(f"task_config does not fit task {spec.task!r}'s settings: {error}") from None
    score = draw = None
    if spec.score_reads:
        function = _module_function(module, "score_from_obs")

        def score(obs):
            return function(obs, task_cfg)

    if spec.drawn_goals:
        draw = _module_function(module, "draw_episode_goals")
    return TaskFunctions(score, draw)


def _module_function(module, name: str) -> Callable:
    function = getattr(module, name, None)
    if function is None:
        raise DeploySpecError(f"{module.__name__} defines no {name}(), which its deploy spec relies on")
    return function


def _inner_task(env: Any):
    """The ArmTask under `env`'s wrappers (FrameStack and others)."""
    inner = env
    while not hasattr(inner, "task") and hasattr(inner, "env"):
        inner = inner.env
    task = getattr(inner, "task", None)
    if task is None:
        raise ValueError(f"{getattr(env, 'name', env)!r} is not a simulated arm task's env")
    return task


def _replaced(cfg: Any, **changes: Any) -> Any:
    if dataclasses.is_dataclass(cfg):
        return dataclasses.replace(cfg, **changes)
    return type(cfg)(**{**vars(cfg), **changes})


def make_env(task_cfg: Any, num_envs: int = 1, render: bool = False):
    """Build the VecEnv a task config describes; unknown task names list the available ones."""
    name = getattr(task_cfg, "name", None)
    if name == "gym":
        # lazy (start-up time): the gymnasium adapter, and the headless-rendering settings it makes, for task=gym
        from robotrl.tasks.gym_env import GymVecEnv

        return GymVecEnv(task_cfg, num_envs=num_envs, render=render)
    if name in SIM_TASKS:
        return TaskVecEnv(make_task(task_cfg, num_envs))
    raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(sorted(TASK_CONFIGS))}")


register_envs()  # gymnasium ids such as robotrl/PandaReach-v0 (they build through make_env)
