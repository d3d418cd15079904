"""Adapter from gymnasium envs to robotrl's batched torch VecEnv.

Actions arrive in [-1, 1] and are mapped affinely onto the env's Box bounds. Box observations become
{"state": ...}; Dict observations (gymnasium-robotics goal envs) keep one entry per key, flattened.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import torch
from robotrl.tasks.configs import GymTaskConfig
from robotrl.tasks.gym_goal import GymGoalTask, is_goal_env
from robotrl.tasks.gym_ids import resolve_env_id

from robotrl.core.env import Obs, StepResult, check_action
from robotrl.core.memory import GB, available_ram, resident_bytes
from robotrl.core.spec import TensorSpec

# Headless rendering: EGL needs no display and no extra packages on these machines.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import gymnasium as gym


def _make_one(cfg: GymTaskConfig, env_id: str, render: bool) -> gym.Env:
    kwargs = dict(cfg.kwargs)
    if render:
        kwargs.update(render_mode="rgb_array")
        if _accepts_render_size(env_id):
            kwargs.setdefault("width", cfg.render_width)
            kwargs.setdefault("height", cfg.render_height)
    try:
        return gym.make(env_id, max_episode_steps=cfg.max_episode_steps, **kwargs)
    except gym.error.Error as err:
        raise ValueError(f"task.env_id={cfg.env_id!r} cannot be made by gymnasium: {err}") from err


def _accepts_render_size(env_id: str) -> bool:
    entry = gym.spec(env_id).entry_point
    return isinstance(entry, str) and "mujoco" in entry


def _obs_spec_of(space: gym.Space, env_id: str) -> dict[str, TensorSpec]:
    if isinstance(space, gym.spaces.Box):
        return {"state": TensorSpec((int(np.prod(space.shape)),))}
    if isinstance(space, gym.spaces.Dict):
        spec = {}
        for key, sub in space.spaces.items():
            if not isinstance(sub, gym.spaces.Box):
                raise ValueError(f"{env_id}: observation entry {key!r} is {sub}, only Box entries are supported")
            spec[key] = TensorSpec((int(np.prod(sub.shape)),))
        return spec
    raise ValueError(f"{env_id}: observation space {space} is not supported (Box or Dict of Box)")


PROBE_ENVS = 8  # envs built before the memory of the rest is estimated from them


def _make_all(cfg: GymTaskConfig, num_envs: int, render: bool) -> list[gym.Env]:
    """`num_envs` envs (the first renders). Beyond PROBE_ENVS, the memory of the rest is projected from what
    envs 2..PROBE_ENVS took (resident growth, or Python's own allocations where larger: a small env's growth can
    hide in pages the process already had), and a `num_envs` the available RAM cannot hold fails, named,
    before it is built: a gymnasium env's footprint is unknown until one exists."""
    env_id = resolve_env_id(cfg.env_id)
    envs = [_make_one(cfg, env_id, render)]
    if num_envs <= PROBE_ENVS:
        return envs + [_make_one(cfg, env_id, False) for _ in range(num_envs - 1)]
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        rss, heap = resident_bytes(), tracemalloc.get_traced_memory()[0]
        envs += [_make_one(cfg, env_id, False) for _ in range(PROBE_ENVS - 1)]
        per_env = max(resident_bytes() - rss, tracemalloc.get_traced_memory()[0] - heap) / (PROBE_ENVS - 1)
    finally:
        if not tracing:
            tracemalloc.stop()
    need, free = per_env * (num_envs - PROBE_ENVS), available_ram()
    if need > free:
        for env in envs:
            env.close()
        raise MemoryError(
            f"num_envs={num_envs} of {cfg.env_id} needs about {need / GB:.1f} GB more ({per_env / 1024:.0f} KB an "
            f"env, measured on the first {PROBE_ENVS}), but the available RAM is {free / GB:.1f} GB; at most about "
            f"{PROBE_ENVS + int(free // max(per_env, 1)):,} envs fit"
        )
    return envs + [_make_one(cfg, env_id, False) for _ in range(num_envs - PROBE_ENVS)]


class GymVecEnv:
    """`num_envs` gymnasium envs stepped in turn, reset individually when their episode ends."""

    def __init__(self, cfg: GymTaskConfig, num_envs: int = 1, render: bool = False):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.cfg = cfg
        self.name = f"gym:{cfg.env_id}"
        self.envs = _make_all(cfg, num_envs, render)
        self.num_envs = num_envs
        first = self.envs[0]
        action_space = first.action_space
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(
                f"task.env_id={cfg.env_id!r} has action space {action_space}; robotrl's agents need a "
                "continuous (Box) action space"
            )
        low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError(f"task.env_id={cfg.env_id!r} has unbounded actions ({action_space}); bounds are required")
        self.action_dim = low.size
        self._action_shape = action_space.shape
        self._low = low.astype(np.float64)
        self._scale = (high.astype(np.float64) - self._low) / 2.0  # float32's width of +-3.4e38 overflows
        self.obs_spec = _obs_spec_of(first.observation_space, cfg.env_id)
        self._dict_obs = isinstance(first.observation_space, gym.spaces.Dict)
        self.has_success = False  # becomes True once an env reports `success` or `is_success`
        self.control = None  # the env's own action semantics, unknown here
        # a goal env's goal side, for hindsight relabelling (her_ratio); relabelling needs the episode length
        steps = cfg.max_episode_steps or (first.spec.max_episode_steps if first.spec is not None else None)
        self.task = GymGoalTask(first, cfg.env_id, steps) if is_goal_env(first) and steps else None

    # -- conversions -----------------------------------------------------------------------------
    def _obs_to_arrays(self, raw) -> dict[str, np.ndarray]:
        items = raw.items() if self._dict_obs else (("state", raw),)
        out = {}
        for key, value in items:
            arr = np.asarray(value, dtype=np.float32).reshape(-1)
            expected = self.obs_spec[key].shape[0]
            if arr.size != expected:
                raise ValueError(f"{self.name}: observation[{key!r}] has {arr.size} values, expected {expected}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{self.name}: observation[{key!r}] is not finite: {arr.tolist()}")
            out[key] = arr
        return out

    def _stack(self, per_env: list[dict[str, np.ndarray]]) -> Obs:
        return {k: torch.from_numpy(np.stack([o[k] for o in per_env])) for k in self.obs_spec}

    def _success(self, info: dict) -> bool:
        for key in ("success", "is_success"):
            if key in info:
                self.has_success = True
                return bool(info[key])
        return False

    # -- VecEnv ----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Obs:
        per_env = []
        for i, env in enumerate(self.envs):
            raw, _ = env.reset(seed=None if seed is None else seed + i)
            per_env.append(self._obs_to_arrays(raw))
        return self._stack(per_env)

    def step(self, action: torch.Tensor) -> StepResult:
        checked = check_action(self.name, action, self.num_envs, self.action_dim).double().numpy()
        act = self._low + (checked + 1.0) * self._scale
        next_obs, reset_obs = [], []
        reward = np.empty(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        success = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            raw, r, term, trunc, info = env.step(act[i].reshape(self._action_shape))
            arrays = self._obs_to_arrays(raw)
            next_obs.append(arrays)
            if not np.isfinite(r):
                raise ValueError(f"{self.name}: env {i} returned a non-finite reward {r}")
            reward[i], terminated[i], truncated[i] = r, term, trunc
            success[i] = self._success(info)
            if term or trunc:
                raw, _ = env.reset()
                arrays = self._obs_to_arrays(raw)
            reset_obs.append(arrays)
        return StepResult(
            obs=self._stack(reset_obs),
            next_obs=self._stack(next_obs),
            reward=torch.from_numpy(reward),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            success=torch.from_numpy(success),
        )

    def render(self) -> np.ndarray:
        frame = self.envs[0].render()
        if frame is None:
            raise RuntimeError(f"{self.name} was not created with rendering enabled")
        return np.asarray(frame, dtype=np.uint8)

    def close(self) -> None:
        for env in self.envs:
            env.close()
