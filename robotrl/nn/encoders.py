"""Observation encoders: turn an observation dict into the flat feature vector a head consumes."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from robotrl.data.spec import ObsSpec


class StateEncoder(nn.Module):
    """Flattens and concatenates the state entries of an observation dict, in a fixed key order.

    Nothing is learned here; it exists so that agents see one interface whether the observation is a
    single vector or a dict of proprioception, object state and goals.
    """

    def __init__(self, obs_spec: ObsSpec):
        super().__init__()
        self.keys = sorted(obs_spec)
        for key in self.keys:
            if obs_spec[key].dtype == torch.uint8:
                raise ValueError(
                    f"StateEncoder cannot take image entry {key!r} (uint8 {obs_spec[key].shape}); "
                    "use a pixel agent such as agent=drqv2"
                )
        self.out_dim = sum(math.prod(obs_spec[k].shape) for k in self.keys)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if len(self.keys) == 1:
            x = obs[self.keys[0]]
            return x.reshape(x.shape[0], -1)
        return torch.cat([obs[k].reshape(obs[k].shape[0], -1) for k in self.keys], dim=-1)
