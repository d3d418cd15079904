"""Frame stacking for pixel observations, as a VecEnv wrapper.

Every uint8 image entry [C, H, W] becomes the last `k` frames stacked on the channel axis [k*C, H, W],
oldest first. At an episode's start the first frame fills the whole stack (as DrQ-v2 does), which is
also how FrameReplay rebuilds stacks from single stored frames. State entries pass through unchanged.
The stacking step itself is `fresh_stack` and `push_frame` (any leading dimensions), which the robot env
(hardware/robot_observation.py) uses too, so a robot stacks its camera frames exactly as training did.
"""

from __future__ import annotations

import numpy as np
import torch

from robotrl.core.env import Obs, StepResult, VecEnv
from robotrl.core.spec import TensorSpec, pixel_keys


def fresh_stack(frame: torch.Tensor, k: int) -> torch.Tensor:
    """An episode's first stack: [..., C, H, W] -> [..., k*C, H, W], the frame repeated k times."""
    return torch.cat([frame] * k, dim=-3)


def push_frame(stack: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """The next stack: the oldest frame of [..., k*C, H, W] dropped, `frame` [..., C, H, W] appended last."""
    return torch.cat([stack[..., frame.shape[-3] :, :, :], frame], dim=-3)


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

    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed=seed)
        self._stacks = {key: fresh_stack(obs[key], self.k) for key in self.keys}
        return {**obs, **self._stacks}

    def step(self, action: torch.Tensor) -> StepResult:
        result = self.env.step(action)
        done = (result.terminated | result.truncated).view(-1, 1, 1, 1)
        next_obs, obs = dict(result.next_obs), dict(result.obs)
        for key in self.keys:
            stacked_next = push_frame(self._stacks[key], result.next_obs[key])
            next_obs[key] = stacked_next
            obs[key] = torch.where(done, fresh_stack(result.obs[key], self.k), stacked_next)
            self._stacks[key] = obs[key]
        return StepResult(obs, next_obs, result.reward, result.terminated, result.truncated, result.success)

    def render(self) -> np.ndarray:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
