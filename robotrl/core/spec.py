"""Shapes and dtypes of observations and actions, shared by envs, buffers and agents."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorSpec:
    """One tensor's per-item shape (no batch dimension) and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def check(self, name: str, value: torch.Tensor, batch_dims: int = 1) -> None:
        """Raise ValueError naming `name` unless `value` has this spec's shape after `batch_dims` dims."""
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
        if tuple(value.shape[batch_dims:]) != self.shape or value.dim() != batch_dims + len(self.shape):
            raise ValueError(f"{name}: expected shape [batch]{list(self.shape)}, got {list(value.shape)}")


ObsSpec = Mapping[str, TensorSpec]

# An observation entry for the critic alone (sim2real/privileged.py): the physics an env runs with, which a robot
# does not observe. Agents act without it, and a deployed policy never has one.
PRIVILEGED = "privileged"


def actor_spec(obs_spec: ObsSpec) -> dict[str, TensorSpec]:
    """`obs_spec` without its privileged entry: what an agent acts on."""
    return {key: spec for key, spec in obs_spec.items() if key != PRIVILEGED}


def check_obs(obs_spec: ObsSpec, obs: Mapping[str, torch.Tensor], batch_dims: int = 1) -> None:
    """Validate an observation dict against its spec, naming the first key that does not fit."""
    if set(obs) != set(obs_spec):
        raise ValueError(f"observation keys {sorted(obs)} do not match the spec's {sorted(obs_spec)}")
    for key, spec in obs_spec.items():
        spec.check(f"observation[{key!r}]", obs[key], batch_dims)


def pixel_keys(obs_spec: ObsSpec) -> list[str]:
    """The image entries of an observation spec (uint8 [C, H, W]), sorted."""
    return sorted(k for k, s in obs_spec.items() if s.dtype == torch.uint8 and len(s.shape) == 3)
