"""Plain and ensembled multilayer perceptrons.

`EnsembleMLP` evaluates N independent networks in one batched pass (`torch.baddbmm`), which is what
makes an N-critic SAC cost about as many kernel launches as a single critic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def full_precision(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply `layer` in float32 even inside an autocast region.

    Output heads (Q-values, action means) stay in float32 under bf16 mixed precision: a bf16 Q of 500
    is only resolved to +-2, coarser than the TD errors it must learn from. The heads are a tiny share of
    the FLOPs, so this costs nothing measurable.
    """
    with torch.autocast(device_type=x.device.type, enabled=False):
        return layer(x.float())


def _hidden_stack(linear, in_dim: int, hidden: Sequence[int], layer_norm: bool) -> tuple[nn.Sequential, int]:
    """Linear -> (LayerNorm) -> ReLU for each width; returns the stack and its output width."""
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden:
        layers.append(linear(last, width))
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        layers.append(nn.ReLU())
        last = width
    return nn.Sequential(*layers), last


class MLP(nn.Module):
    """ReLU MLP with a float32 output layer; with `layer_norm`, hidden layers are Linear-LayerNorm-ReLU."""

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False):
        super().__init__()
        self.hidden, last = _hidden_stack(nn.Linear, in_dim, hidden, layer_norm)
        self.head = nn.Linear(last, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return full_precision(self.head, self.hidden(x))


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False) -> MLP:
    return MLP(in_dim, hidden, out_dim, layer_norm)


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

    def forward(self, x: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """With `frozen`, gradients reach `x` but not the weights (the layer acts as a fixed function)."""
        weight, bias = (self.weight.detach(), self.bias.detach()) if frozen else (self.weight, self.bias)
        if self.out_dim == 1 and x.device.type == "cpu":
            # A scalar head (a Q-value) as a weighted sum: on a CPU, baddbmm runs it as a batched GEMV and
            # its input gradient as an outer-product bmm, together ~3x slower than a multiply and a sum.
            return torch.sum(x * weight.transpose(1, 2), dim=-1, keepdim=True) + bias
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num_members, -1, -1)
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, in_dim={self.in_dim}, out_dim={self.out_dim}"


class EnsembleMLP(nn.Module):
    """N ReLU MLPs of the same shape evaluated together; output [N, B, out_dim]."""

    def __init__(self, num_members: int, in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False):
        super().__init__()
        if num_members < 1:
            raise ValueError(f"an ensemble needs at least one member, got num_members={num_members}")
        # LayerNorm's affine parameters are shared across members, as in DroQ/RLPD.
        linear = functools.partial(EnsembleLinear, num_members)
        self.hidden, last = _hidden_stack(linear, in_dim, hidden, layer_norm)
        self.head = EnsembleLinear(num_members, last, out_dim)
        self.num_members = num_members

    def forward(self, x: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """[N, B, out_dim]; with `frozen`, no weight receives a gradient (only the input does)."""
        if not frozen:
            return full_precision(self.head, self.hidden(x))
        for layer in self.hidden:
            if isinstance(layer, EnsembleLinear):
                x = layer(x, frozen=True)
            elif isinstance(layer, nn.LayerNorm):
                x = F.layer_norm(x, layer.normalized_shape, layer.weight.detach(), layer.bias.detach(), layer.eps)
            else:
                x = layer(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.head(x.float(), frozen=True)
