"""The environment contract the training loop, evaluation and actors are written against.

Every env is batched (`num_envs` leading dimension), speaks torch tensors, takes actions in [-1, 1]
and resets finished episodes itself: `step` returns the true last observation of a finished episode in
`next_obs` (what the replay buffer needs) and the first observation of the new one in `obs` (what the
policy acts on next). Implementations live in robotrl.tasks; nothing here imports a simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from robotrl.core.spec import ObsSpec

Obs = dict[str, torch.Tensor]


class EnvCancelled(RuntimeError):
    """A step or reset that was waiting (for a person to reset a robot's scene) ended because its caller asked
    it to stop; nothing is wrong with the env, the session is ending."""


@dataclass
class StepResult:
    obs: Obs  # observation to act on next (reset observation where an episode ended)
    next_obs: Obs  # observation reached by this step (final observation where an episode ended)
    reward: torch.Tensor  # [E] float32
    terminated: torch.Tensor  # [E] bool
    truncated: torch.Tensor  # [E] bool
    success: torch.Tensor  # [E] bool, the task's success criterion at this step
    # Set by an intervention wrapper (robotrl/hil): which envs' actions an operator replaced this step, and
    # the actions actually executed (the operator's where intervened, else the policy's). None: no wrapper.
    intervened: torch.Tensor | None = None  # [E] bool
    action: torch.Tensor | None = None  # [E, A]


class VecEnv(Protocol):
    name: str
    num_envs: int
    obs_spec: ObsSpec
    action_dim: int
    has_success: bool  # whether `success` means anything for this task
    # How an action moves the robot: ee_delta | joint_delta | joint_position; None where the env does not say
    # (a gym env). A teleop operator's commands are end-effector motions and need ee_delta.
    control: str | None

    def reset(self, seed: int | None = None) -> Obs: ...

    def step(self, action: torch.Tensor) -> StepResult: ...

    def render(self) -> np.ndarray:
        """An RGB frame (H, W, 3) uint8 of the first env, for videos."""
        ...

    def close(self) -> None: ...


ACTION_TOLERANCE = 1e-6


def check_action(env_name: str, action: torch.Tensor, num_envs: int, action_dim: int) -> torch.Tensor:
    """The action as float32 on the CPU, or ValueError naming the env and the bad value.

    Wrong shapes, NaN/inf and values outside [-1, 1] are rejected, never clipped: clipping is the safety
    shield's decision, and a silent clip would hide a broken policy.
    """
    if not isinstance(action, torch.Tensor) or tuple(action.shape) != (num_envs, action_dim):
        shape = list(action.shape) if isinstance(action, torch.Tensor) else type(action).__name__
        raise ValueError(f"{env_name}: action must have shape [{num_envs}, {action_dim}], got {shape}")
    action = action.detach().to("cpu", torch.float32)
    if not torch.isfinite(action).all():
        raise ValueError(f"{env_name}: non-finite action {action.tolist()}")
    if (action.abs() > 1.0 + ACTION_TOLERANCE).any():
        raise ValueError(f"{env_name}: action outside [-1, 1]: {action.tolist()}")
    return action
