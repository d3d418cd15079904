"""Plain and ensembled multilayer perceptrons.

`EnsembleMLP` evaluates N independent networks in one batched pass (`torch.baddbmm`), which is what
makes an N-critic SAC cost about as many kernel launches as a single critic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False) -> nn.Sequential:
    """ReLU MLP; with `layer_norm`, each hidden layer is Linear -> LayerNorm -> ReLU."""
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden:
        layers.append(nn.Linear(last, width))
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        layers.append(nn.ReLU())
        last = width
    layers.append(nn.Linear(last, out_dim))
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """N independent linear layers: input [N, B, in] (or [B, in], broadcast) -> [N, B, out]."""

    def __init__(self, num_members: int, in_dim: int, out_dim: int):
        super().__init__()
        self.num_members, self.in_dim, self.out_dim = num_members, in_dim, out_dim
        self.weight = nn.Parameter(torch.empty(num_members, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Same scheme as nn.Linear, member by member.
        bound = 1.0 / math.sqrt(self.in_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num_members, -1, -1)
        return torch.baddbmm(self.bias, x, self.weight)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, in_dim={self.in_dim}, out_dim={self.out_dim}"


class EnsembleMLP(nn.Module):
    """N ReLU MLPs of the same shape evaluated together; output [N, B, out_dim]."""

    def __init__(self, num_members: int, in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False):
        super().__init__()
        if num_members < 1:
            raise ValueError(f"an ensemble needs at least one member, got num_members={num_members}")
        layers: list[nn.Module] = []
        last = in_dim
        for width in hidden:
            layers.append(EnsembleLinear(num_members, last, width))
            if layer_norm:
                layers.append(nn.LayerNorm(width))  # shared affine across members, as in DroQ/RLPD
            layers.append(nn.ReLU())
            last = width
        layers.append(EnsembleLinear(num_members, last, out_dim))
        self.layers = nn.Sequential(*layers)
        self.num_members = num_members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
