"""Frame stacking for pixel observations, as a VecEnv wrapper.

Every uint8 image entry [C, H, W] becomes the last `k` frames stacked on the channel axis [k*C, H, W],
oldest first. At an episode's start the first frame fills the whole stack (as DrQ-v2 does), which is
also how FrameReplay rebuilds stacks from single stored frames. State entries pass through unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from robotrl.core.env import Obs, StepResult, VecEnv
from robotrl.core.spec import TensorSpec, pixel_keys


class FrameStack:
    def __init__(self, env: VecEnv, k: int):
        if k < 1:
            raise ValueError(f"agent.frame_stack must be >= 1, got {k}")
        self.keys = pixel_keys(env.obs_spec)
        if not self.keys:
            raise ValueError(
                f"frame stacking needs pixel observations; task {env.name!r} gives {sorted(env.obs_spec)} "
                "(set task.obs=pixels or task.obs=state+pixels)"
            )
        self.env, self.k = env, k
        self.name, self.num_envs, self.action_dim, self.has_success = (
            env.name,
            env.num_envs,
            env.action_dim,
            env.has_success,
        )
        self.control = getattr(env, "control", None)
        self.obs_spec = dict(env.obs_spec)
        for key in self.keys:
            c, h, w = env.obs_spec[key].shape
            self.obs_spec[key] = TensorSpec((k * c, h, w), torch.uint8)
        self._stacks: dict[str, torch.Tensor] = {}

    def _fresh(self, frame: torch.Tensor) -> torch.Tensor:
        return frame.repeat(1, self.k, 1, 1)

    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed=seed)
        self._stacks = {key: self._fresh(obs[key]) for key in self.keys}
        return {**obs, **self._stacks}

    def step(self, action: torch.Tensor) -> StepResult:
        result = self.env.step(action)
        done = (result.terminated | result.truncated).view(-1, 1, 1, 1)
        next_obs, obs = dict(result.next_obs), dict(result.obs)
        for key in self.keys:
            channels = result.next_obs[key].shape[1]
            stacked_next = torch.cat([self._stacks[key][:, channels:], result.next_obs[key]], 1)
            next_obs[key] = stacked_next
            obs[key] = torch.where(done, self._fresh(result.obs[key]), stacked_next)
            self._stacks[key] = obs[key]
        return StepResult(obs, next_obs, result.reward, result.terminated, result.truncated, result.success)

    def render(self) -> np.ndarray:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
