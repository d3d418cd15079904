"""Action distributions for stochastic actors."""

from __future__ import annotations

import functools
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

    def expand(self, n: int) -> TanhNormal:
        """The same distribution for n independent draws: parameters [n, ...]."""
        return TanhNormal(self.mean.expand(n, *self.mean.shape), self.log_std.expand(n, *self.log_std.shape))

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


@functools.lru_cache(maxsize=16)
def ar1_mix(steps: int, rho: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """L [steps, steps] with eps = L xi: L[k, j] = rho^(k-j), times sqrt(1 - rho^2) for j >= 1, so L L^T is the
    AR(1) correlation rho^|k-l|. Cached: an actor builds its distribution every step and every update, with
    the same few (steps, rho); callers must not modify it."""
    k = torch.arange(steps, device=device, dtype=dtype)
    mix = (rho ** (k[:, None] - k[None, :]).clamp(min=0)).tril()
    mix[:, 1:] *= math.sqrt(1.0 - rho * rho)
    return mix


class TimeCorrelatedTanhNormal(TanhNormal):
    """A tanh-Gaussian over a chunk of `steps` actions whose noise is correlated in time: per action entry,
    the standard-normal noise follows a stationary AR(1) process over the chunk's steps,
    eps_0 = xi_0, eps_k = rho * eps_{k-1} + sqrt(1 - rho^2) * xi_k, xi iid N(0, 1),
    so each entry keeps the marginal std `std` while consecutive steps are correlated by `rho` (rho = 0: the
    independent TanhNormal). Mean and log-std are [..., steps * action_dim], step-major as a flattened chunk.

    The density is exact: the whitening above has unit diagonal Jacobian apart from the sqrt(1 - rho^2) scale
    of the k >= 1 innovations, so log p = sum log N(xi) - sum log std - (steps - 1) * action_dim *
    0.5 * log(1 - rho^2) - the tanh correction. For the same per-entry std that is higher than the
    independent density: correlated noise has lower entropy (`entropy_offset`).
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, steps: int, rho: float):
        super().__init__(mean, log_std)
        if steps < 1 or mean.shape[-1] % steps:
            raise ValueError(f"a chunk of {steps} steps does not divide {mean.shape[-1]} action entries")
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"the noise correlation must be in [0, 1), got {rho}")
        self.steps, self.rho = steps, float(rho)
        self._mix = ar1_mix(steps, self.rho, mean.dtype, mean.device)

    @staticmethod
    def entropy_offset(steps: int, action_dim: int, rho: float) -> float:
        """Joint entropy of the correlated noise minus that of independent noise with the same stds (<= 0)."""
        return 0.5 * (steps - 1) * action_dim * math.log1p(-rho * rho)

    def _chunked(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.steps, -1))

    def rsample_with_log_prob(self) -> tuple[torch.Tensor, torch.Tensor]:
        innovations = self._chunked(torch.randn_like(self.mean))  # xi [..., steps, A]
        noise = torch.einsum("kj,...ja->...ka", self._mix, innovations)
        pre_tanh = self.mean + self.std * noise.flatten(-2)
        return torch.tanh(pre_tanh), self._log_prob(pre_tanh, innovations.flatten(-2))

    def log_prob_pre_tanh(self, pre_tanh: torch.Tensor) -> torch.Tensor:
        noise = self._chunked((pre_tanh - self.mean) / self.std)
        scale = math.sqrt(1.0 - self.rho * self.rho)
        innovations = torch.cat([noise[..., :1, :], (noise[..., 1:, :] - self.rho * noise[..., :-1, :]) / scale], -2)
        return self._log_prob(pre_tanh, innovations.flatten(-2))

    def _log_prob(self, pre_tanh: torch.Tensor, innovations: torch.Tensor) -> torch.Tensor:
        action_dim = self.mean.shape[-1] // self.steps
        return super()._log_prob(pre_tanh, innovations) - self.entropy_offset(self.steps, action_dim, self.rho)

    def expand(self, n: int) -> TimeCorrelatedTanhNormal:
        wide = super().expand(n)
        return TimeCorrelatedTanhNormal(wide.mean, wide.log_std, self.steps, self.rho)
