"""The contract every learner follows, so the loop, checkpoints and actors never special-case one.

An agent owns its networks and optimizers, acts on batched observation dicts with actions in [-1, 1]
(the env adapter maps them to the task's bounds), and performs one gradient update per `update` call.
`update` returns 0-dim tensors, not floats, so that a hot loop never forces a device sync to log.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import torch
from torch import nn

from robotrl.core.spec import ObsSpec
from robotrl.data.replay import Batch


class Agent(nn.Module, ABC):
    obs_spec: ObsSpec
    action_dim: int

    @abstractmethod
    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """Actions [B, action_dim] in [-1, 1] for a batch of observations."""

    @abstractmethod
    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient update; returns detached 0-dim metric tensors."""

    def pretrain_update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on demonstrations alone, before any env step (hil.pretrain_updates); every row of `batch`
        is a demo. By default the agent's own update; an actor-critic whose actor ascends its critic imitates
        instead (SAC), since a critic fit to the demos' actions alone rates other actions arbitrarily."""
        return self.update(batch)

    @abstractmethod
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer by a stable name, for checkpoints."""

    def reset_exploration(self, num_envs: int) -> None:
        """Start exploring afresh in `num_envs` parallel envs whose episodes all start now.

        The actor calls this before its first step (and after a resume). Agents whose exploration noise
        has state (gSDE: one noise matrix per env) size and draw it here; the default has none.
        """

    def advance_exploration(self, episode_start: torch.Tensor) -> None:
        """The actor's clock: called once per env step, after the env stepped, with the [E] bool mask of
        envs whose next action starts a new episode. Never called by the learner; the default does nothing.
        """

    def reset_evaluation(self, num_envs: int) -> None:
        """As `reset_exploration`, for the deterministic actor (`act(..., deterministic=True)`): evaluation
        and deployment. Its state is kept apart from the exploring actor's, so an evaluation inside a
        training run leaves the training envs' state alone. Agents whose acting has state (action chunks
        being executed) reset it here; the default has none.
        """

    def advance_evaluation(self, episode_start: torch.Tensor) -> None:
        """As `advance_exploration`, the deterministic actor's clock; the default does nothing."""

    @property
    def replay_n_step(self) -> int:
        """Steps the replay sums per sampled transition (n-step returns; an action chunk's length)."""
        return self.cfg.replay_n_step

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def behaviour_cloning_loss(policy_action: torch.Tensor, recorded: torch.Tensor, demo: torch.Tensor) -> torch.Tensor:
    """Mean squared distance [] of the policy's actions to the recorded ones over the `demo` rows ([B] bool),
    or over the `demo` entries ([B, A] bool: a chunk's steps that were recorded); 0 (still differentiable)
    when the batch holds none."""
    mask = demo if demo.dim() == policy_action.dim() else demo.unsqueeze(-1)
    mask = mask.to(torch.float32).expand_as(policy_action)
    squared = (policy_action.float() - recorded.float()).pow(2) * mask
    return squared.sum() / mask.sum().clamp(min=1.0)


def masked_mean(errors: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Per ensemble member [N], the mean of `errors` ([N, B, 1]) over the batch rows that `rows` ([B] bool)
    keeps, or over all of them (None); 0 (still differentiable) when it keeps none."""
    if rows is None:
        return errors.mean(dim=(1, 2))
    weight = rows.to(torch.float32).view(1, -1, 1)  # counts above 256 are not exact in bfloat16
    return (errors * weight).sum(dim=(1, 2)) / weight.sum().clamp(min=1.0)


def bc_weight_at(start: float, final: float | None, decay_updates: int, updates: int) -> float:
    """The behaviour-cloning weight after `updates` updates: `start`, moving linearly to `final` over
    `decay_updates` (constant when `final` is None). Demos hold the policy near the demonstrator early,
    while the critic is still poor; a smaller weight later lets the critic shorten the cycle."""
    if final is None or decay_updates <= 0:
        return start if final is None else final
    return start + min(updates / decay_updates, 1.0) * (final - start)


def check_finite(cfg: object, names: tuple[str, ...], low: float, inclusive: bool = False) -> None:
    """Each `agent.<name>` a finite number above `low` (or equal to it with `inclusive`): a NaN or an
    infinity in a learning rate or a scale fails here, named, not as a NaN loss some updates later."""
    for name in names:
        value = getattr(cfg, name)
        if value is None:
            continue
        if not (math.isfinite(value) and (value >= low if inclusive else value > low)):
            bound = f">= {low}" if inclusive else f"> {low}"
            raise ValueError(f"agent.{name} must be a finite number {bound}, got {value}")


def check_layer_widths(cfg: object, names: tuple[str, ...]) -> None:
    for name in names:
        widths = list(getattr(cfg, name))
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
            raise ValueError(f"agent.{name} must list layer widths >= 1, got {widths}")


def check_bc_schedule(start: float, final: float | None, decay_updates: int) -> None:
    if not (start >= 0 and math.isfinite(start)):
        raise ValueError(f"agent.bc_weight must be a finite number >= 0, got {start}")
    if final is not None and not (final >= 0 and math.isfinite(final)):
        raise ValueError(f"agent.bc_weight_final must be a finite number >= 0 or null, got {final}")
    if decay_updates < 0:
        raise ValueError(f"agent.bc_decay_updates must be >= 0, got {decay_updates}")


def make_adam(params, lr: float, capturable: bool = False) -> torch.optim.Adam:
    """Adam with the fused kernel where this torch build has one (one launch per step), else foreach.
    `capturable`: its step counts live on the device, so a CUDA graph can record its step."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True, capturable=capturable)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True, capturable=capturable)


PRECISIONS = ("fp32", "bf16", "auto")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices natively (CPU: AVX512-BF16/AMX; CUDA: Ampere or newer)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def mixed_precision(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the autocast context for `precision` (fp32 | bf16 | auto) on `device`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    use_bf16 = precision == "bf16" or (precision == "auto" and native_bf16(device))
    if not use_bf16:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
