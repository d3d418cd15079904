"""Running standardisation of state features, kept as module buffers so that checkpoints and the weights a
learner publishes carry it to every actor and to deployment."""

from __future__ import annotations

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    """(x - mean) / sqrt(var + eps), clipped to [-clip, clip], with the mean and variance of every row shown to
    `observe` so far (Chan et al.'s parallel merge, so batches of any size combine exactly).

    Before anything was observed it is the identity. Rows holding a NaN or an infinity are left out of the
    statistics (masked, without a device sync), so one bad observation cannot poison them for the rest of a
    run. The clip bounds what a feature that sat still in the data seen so far (a cube nobody has pushed yet)
    can feed the networks once it moves, as SB3's VecNormalize does with the same defaults.
    """

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        if dim < 1:
            raise ValueError(f"a normalizer needs at least one feature, got dim={dim}")
        if not clip > 0:
            raise ValueError(f"the normalizer's clip must be > 0, got {clip}")
        if not eps > 0:
            raise ValueError(f"the normalizer's eps must be > 0 (it keeps a constant feature finite), got {eps}")
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Fold the finite rows of `x` [N, dim] into the statistics."""
        if x.dim() != 2 or x.shape[1] != self.mean.shape[0]:
            raise ValueError(f"the normalizer takes [N, {self.mean.shape[0]}] features, got {list(x.shape)}")
        x = x.float()
        finite = torch.isfinite(x).all(dim=-1, keepdim=True)  # [N, 1]
        x = torch.where(finite, x, torch.zeros((), device=x.device))
        n_new = finite.sum().float()
        weight = finite.float()
        safe_n = n_new.clamp(min=1.0)
        batch_mean = (x * weight).sum(0) / safe_n
        batch_m2 = ((x - batch_mean).pow(2) * weight).sum(0)
        total = self.count + n_new
        safe_total = total.clamp(min=1.0)
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_m2 + delta.pow(2) * self.count * n_new / safe_total
        seen = total > 0  # nothing finite seen yet: stay the identity
        self.mean.copy_(torch.where(seen, self.mean + delta * n_new / safe_total, self.mean))
        self.var.copy_(torch.where(seen, m2 / safe_total, self.var))
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) * torch.rsqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    def extra_repr(self) -> str:
        return f"dim={self.mean.shape[0]}, clip={self.clip}"
