"""The joint limits the shield enforces: the robot spec's, narrowed by the configured margins and scales."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from robotrl.core.robot_spec import RobotSpec
from robotrl.safety.config import ShieldConfig, ShieldConfigError


@dataclass(frozen=True)
class JointLimits:
    lower: torch.Tensor  # targets are clamped to [lower, upper]: the spec's limits moved in by the margin
    upper: torch.Tensor
    velocity: torch.Tensor  # the output's bounds, already scaled (and the velocity capped by max_step)
    acceleration: torch.Tensor
    jerk: torch.Tensor
    max_step: torch.Tensor  # rad per control step

    @classmethod
    def from_spec(cls, spec: RobotSpec, config: ShieldConfig) -> JointLimits:
        n = len(spec.joints)
        margin = per_joint(config.position_margin, n)
        lower = spec.position_lower.double() + margin
        upper = spec.position_upper.double() - margin
        narrow = (lower >= upper).nonzero().flatten().tolist()
        if narrow:
            j = narrow[0]
            raise ShieldConfigError(
                f"shield.position_margin {margin[j].item()} leaves no range for joint {spec.joints[j]} "
                f"(limits {spec.position_lower[j].item()} .. {spec.position_upper[j].item()})"
            )
        period = config.control_period
        velocity = spec.velocity_limit.double() * config.velocity_scale
        max_step = velocity * period if config.max_step is None else per_joint(config.max_step, n)
        # max_step may only tighten the velocity bound: a larger step would move a joint faster than its
        # limit wherever the step, not the velocity, bounds the motion (per-step clipping, the output guard)
        fast = (max_step > velocity * period * (1 + 1e-12)).nonzero().flatten().tolist()
        if fast:
            j = fast[0]
            raise ShieldConfigError(
                f"shield.max_step {max_step[j].item()} rad for joint {spec.joints[j]} exceeds its velocity bound "
                f"{velocity[j].item():.4g} rad/s (velocity_limit x velocity_scale) x control_period {period} = "
                f"{(velocity[j] * period).item():.4g} rad per step"
            )
        return cls(
            lower=lower,
            upper=upper,
            velocity=torch.minimum(velocity, max_step / period),
            acceleration=spec.acceleration_limit.double() * config.acceleration_scale,
            jerk=spec.jerk_limit.double() * config.jerk_scale,
            max_step=max_step,
        )

    @property
    def brake_time(self) -> float:
        """Seconds a jerk-limited stop from any speed within these limits takes at most: reaching full
        deceleration (a / j), then shedding the speed at it (v / a)."""
        return float((self.velocity / self.acceleration + self.acceleration / self.jerk).max())

    def clamp(self, target: torch.Tensor) -> tuple[torch.Tensor, bool]:
        clamped = torch.minimum(torch.maximum(target, self.lower), self.upper)
        return clamped, bool((clamped != target).any())


def per_joint(value, n: int) -> torch.Tensor:
    """A setting given once or per joint, as a float64 vector of length n."""
    values = torch.as_tensor(value, dtype=torch.float64).flatten()
    return values.expand(n).clone() if values.numel() == 1 else values
