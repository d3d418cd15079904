"""Action distributions for stochastic actors."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_LOG_2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class TanhNormal:
    """A diagonal Gaussian squashed by tanh into (-1, 1).

    The log-density correction uses log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), which stays
    finite where tanh saturates, instead of log(1 - a^2 + eps).
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean
        self.log_std = log_std
        self.std = log_std.exp()

    def rsample_with_log_prob(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized sample and its log-density, summed over the action dimension: [..., 1]."""
        noise = torch.randn_like(self.mean)
        pre_tanh = self.mean + self.std * noise
        return torch.tanh(pre_tanh), self._log_prob(pre_tanh, noise)

    def log_prob_pre_tanh(self, pre_tanh: torch.Tensor) -> torch.Tensor:
        noise = (pre_tanh - self.mean) / self.std
        return self._log_prob(pre_tanh, noise)

    def _log_prob(self, pre_tanh: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        gaussian = -0.5 * noise.pow(2) - self.log_std - _HALF_LOG_2PI
        squash = 2.0 * (_LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))
        return (gaussian - squash).sum(-1, keepdim=True)

    @property
    def mode(self) -> torch.Tensor:
        return torch.tanh(self.mean)
