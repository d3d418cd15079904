"""Generalized state-dependent exploration (gSDE; Raffin, Kober and Stulp, 2021) for tanh-squashed actors.

The exploration noise is a linear function of the actor's latent features (its last hidden layer):

    pre_tanh = mean(s) + latent(s) @ W,    W[i, j] ~ N(0, std[i, j]^2),    action = tanh(pre_tanh)

While W is held fixed the action is a deterministic, smooth function of the state, so a robot explores
with smooth motions instead of white noise. Given the state, the pre-tanh action is Gaussian with
per-dimension variance `(latent^2) @ (std^2)`; that marginal is what the learner's log-probability uses
(`GSDE.distribution`), and it samples independent noise per batch row (no noise matrix at all).

Two pieces, one job each:
- `GSDE` (an `nn.Module`): the learned `log_std` parameter, the std parameterization and the
  distribution the learner differentiates.
- `GSDENoise`: the actor's noise state, one W per parallel env, resampled on the actor's clock: every
  `sample_freq` env steps of that env and whenever its episode starts. It never changes because the
  learner ran an update. Deployment code can call `resample(env_ids)` whenever it wants fresh noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from robotrl.nn.distributions import TanhNormal

# exp() parameterization: log_std is clamped here before exp so that std^2 stays finite in float32 even
# if the parameter drifts far (expln needs no clamp: it grows like log(x) above 0).
_EXP_LOG_STD_MAX = 10.0
_EXP_LOG_STD_MIN = -20.0
_VARIANCE_EPS = 1e-6  # added to the action variance, as SB3, so log_prob stays finite at latent == 0


def expln(log_std: torch.Tensor) -> torch.Tensor:
    """exp(x) for x <= 0 and log1p(x) + 1 for x > 0: positive, continuous with a continuous first
    derivative at 0, and growing only logarithmically, so a long run cannot blow the std up."""
    below = torch.exp(log_std.clamp(max=0.0))
    above = torch.log1p(log_std.clamp(min=0.0)) + 1.0
    return torch.where(log_std <= 0, below, above)


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class GSDE(nn.Module):
    """The gSDE exploration parameters of one actor and the action distribution they define.

    latent_dim: width of the latent features (the actor's last hidden layer).
    full_std: one std per (feature, action) pair, log_std [latent_dim, action_dim]; otherwise one per
        feature shared by every action dimension, log_std [latent_dim, 1].
    use_expln: std = expln(log_std) (bounded growth) instead of exp(log_std).
    learn_features: let the log-probability's gradient reach the latent features; by default they are
        detached, so the exploration parameters do not reshape the features the mean head uses.
    """

    def __init__(
        self,
        latent_dim: int,
        action_dim: int,
        full_std: bool = True,
        use_expln: bool = True,
        learn_features: bool = False,
        log_std_init: float = -2.0,
    ):
        super().__init__()
        _check_positive_int("latent_dim", latent_dim)
        _check_positive_int("action_dim", action_dim)
        if not math.isfinite(log_std_init):
            raise ValueError(f"log_std_init must be finite, got {log_std_init}")
        self.latent_dim, self.action_dim = latent_dim, action_dim
        self.full_std, self.use_expln, self.learn_features = full_std, use_expln, learn_features
        self.log_std = nn.Parameter(torch.full((latent_dim, action_dim if full_std else 1), float(log_std_init)))

    def extra_repr(self) -> str:
        return (
            f"latent_dim={self.latent_dim}, action_dim={self.action_dim}, full_std={self.full_std}, "
            f"use_expln={self.use_expln}, learn_features={self.learn_features}"
        )

    def std(self) -> torch.Tensor:
        """The std of every noise-matrix entry, [latent_dim, action_dim] (float32)."""
        if self.use_expln:
            std = expln(self.log_std)
        else:
            std = self.log_std.clamp(_EXP_LOG_STD_MIN, _EXP_LOG_STD_MAX).exp()
        return std.expand(self.latent_dim, self.action_dim)

    def _latent(self, latent: torch.Tensor) -> torch.Tensor:
        if latent.dim() != 2 or latent.shape[-1] != self.latent_dim:
            raise ValueError(f"latent features must have shape [B, {self.latent_dim}], got {list(latent.shape)}")
        latent = latent.float()
        return latent if self.learn_features else latent.detach()

    def variance(self, latent: torch.Tensor) -> torch.Tensor:
        """Per-dimension variance of the pre-tanh action given the latent: (latent^2) @ (std^2) + eps."""
        latent = self._latent(latent)
        with torch.autocast(device_type=latent.device.type, enabled=False):
            return latent.pow(2) @ self.std().pow(2) + _VARIANCE_EPS

    def distribution(self, mean: torch.Tensor, latent: torch.Tensor) -> TanhNormal:
        """The state-conditional action distribution: tanh(N(mean, variance(latent))), float32.

        Its `rsample_with_log_prob` draws independent noise per row, as the learner wants; its log-
        probability is the analytic density of the noise-matrix exploration given the state.
        """
        if mean.shape != (latent.shape[0], self.action_dim):
            raise ValueError(f"mean must have shape [{latent.shape[0]}, {self.action_dim}], got {list(mean.shape)}")
        return TanhNormal(mean.float(), 0.5 * self.variance(latent).log())

    @torch.no_grad()
    def sample_matrices(self, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`count` independent noise matrices, [count, latent_dim, action_dim], from the current std."""
        std = self.std().detach()
        eps = torch.randn(count, *std.shape, generator=generator, device=std.device, dtype=std.dtype)
        return eps * std

    @staticmethod
    def noise(latent: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
        """Row b's pre-tanh exploration noise latent[b] @ matrices[b]: [B, action_dim]."""
        with torch.autocast(device_type=latent.device.type, enabled=False):
            return torch.bmm(latent.float().unsqueeze(1), matrices).squeeze(1)


class GSDENoise:
    """One gSDE noise matrix per parallel env, resampled on the actor's clock.

    `advance(episode_start)` is called once per env step (after the env stepped) with the [E] mask of
    envs whose next action starts a new episode. An env gets a fresh matrix when its episode starts and
    after it has acted `sample_freq` times on the current one; otherwise its matrix stays exactly the same,
    however many learner updates happen in between. `resample(env_ids)` draws fresh matrices on demand
    (deployment code: at a new trial, after a human takeover, ...).

    Matrices are drawn from the std the `GSDE` module has at resample time, with this object's own
    `torch.Generator` (seeded at construction), so exploration noise does not shift the learner's RNG.
    """

    def __init__(self, gsde: GSDE, num_envs: int, sample_freq: int, seed: int):
        _check_positive_int("num_envs", num_envs)
        _check_positive_int("sde_sample_freq", sample_freq)
        self.gsde, self.num_envs, self.sample_freq = gsde, num_envs, sample_freq
        device = gsde.log_std.device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        self.steps_on_matrix = torch.zeros(num_envs, dtype=torch.long)  # actions taken on each env's matrix
        self.matrices = gsde.sample_matrices(num_envs, self.generator)  # [E, latent_dim, action_dim]

    def resample(self, env_ids: Sequence[int] | torch.Tensor | None = None) -> None:
        """Fresh noise matrices for `env_ids` (all envs when None); their step counts restart at 0."""
        if env_ids is None:
            ids = torch.arange(self.num_envs)
        else:
            ids = torch.as_tensor(env_ids, dtype=torch.long).flatten().cpu()
            if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_envs):
                raise ValueError(f"env_ids must be in [0, {self.num_envs}), got {ids.tolist()}")
        if not ids.numel():
            return
        self.matrices[ids.to(self.matrices.device)] = self.gsde.sample_matrices(ids.numel(), self.generator)
        self.steps_on_matrix[ids] = 0

    def advance(self, episode_start: torch.Tensor) -> None:
        """Count one env step for every env; resample those due or whose episode starts next."""
        episode_start = torch.as_tensor(episode_start).cpu()
        if episode_start.shape != (self.num_envs,) or episode_start.dtype != torch.bool:
            raise ValueError(
                f"episode_start must be a bool tensor of shape [{self.num_envs}], "
                f"got {episode_start.dtype} {list(episode_start.shape)}"
            )
        self.steps_on_matrix += 1
        due = episode_start | (self.steps_on_matrix >= self.sample_freq)
        if due.any():
            self.resample(due.nonzero().flatten())

    def noise(self, latent: torch.Tensor) -> torch.Tensor:
        """Each env's pre-tanh exploration noise for its latent features [E, latent_dim]: [E, action_dim]."""
        if latent.shape[0] != self.num_envs:
            raise ValueError(
                f"gSDE noise is held for {self.num_envs} envs but {latent.shape[0]} observations came; "
                "call agent.reset_exploration(num_envs) when the number of envs changes"
            )
        return GSDE.noise(latent, self.matrices)
