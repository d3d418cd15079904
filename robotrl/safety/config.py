"""`ShieldConfig`: the safety shield's margins, workspace box, timeouts and switches, validated up front."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class ShieldConfigError(ValueError):
    """A shield setting is out of range; the message names the setting and its value."""


@dataclass
class ShieldConfig:
    control_period: float = 0.001  # seconds between filter() calls (the control rate, not the policy's)
    position_margin: float | Sequence[float] = 0.05  # rad kept free inside each joint's limits (one or per joint)
    velocity_scale: float = 1.0  # share of the spec's velocity limits the output may use, in (0, 1]
    acceleration_scale: float = 1.0
    jerk_scale: float = 1.0
    max_step: float | Sequence[float] | None = None  # rad per control step; None: velocity limit * period
    # rad: when a measured joint is further than this from the setpoint last sent (in tracking_samples
    # accepted joint states in a row), the motion is re-seeded toward the measured state, moving the setpoint
    # at most this far (one value or per joint; None: off). A position-controlled joint that lags far behind
    # its setpoint sprints to catch up, faster than any velocity limit the setpoints keep; but a re-seed is a
    # setpoint jump, which a robot whose controller wants continuous setpoints (franka) refuses: off unless a
    # robot's config asks for it.
    tracking_error: float | Sequence[float] | None = None
    # consecutive lagging joint states before a re-seed: one glitching sample must never move the setpoint
    tracking_samples: int = 3
    # rad a joint state may move beyond what the spec's velocity limit (x 1.5) allows since the last accepted
    # one (sensor noise, stamp jitter); further is a glitch and the state is refused (bench/shield_fuzz.py)
    state_jump_tolerance: float = 0.01
    workspace_min: Sequence[float] | None = None  # end-effector box corners (x, y, z) in the model's world frame;
    workspace_max: Sequence[float] | None = None  # both None: no workspace check
    workspace_margin: float = 0.02  # m: targets must lie this far inside the box (room for tracking error)
    # s: joint states older than this -> hold position (brake, resume when fresh); None: two control periods
    hold_after: float | None = None
    stop_after: float = 0.5  # s: older than this -> stop, latched until reset()
    command_timeout: float = 0.5  # s without a new policy command -> hold
    shape_motion: bool = True  # jerk-limited motion with ruckig (extra `safety`); False: per-step clip only
    position_limits: bool = True
    watchdog: bool = True
    timeout: bool = True  # the command timeout
    log_interval: float = 1.0  # s between log lines per correction kind
    # s between gripper setpoint changes: a command sooner waits (the newest wins); a policy toggling its
    # gripper every control period passed 1,499 of 1,500 toggles to the fingers before this limit
    gripper_min_interval: float = 0.1
    # Equilibrium poses for a Cartesian impedance controller (hardware.command=cartesian_pose; pose_shield.py).
    # Speeds, so the step per command follows the policy rate: 1.5 m/s and 2 rad/s stay under a Franka's Cartesian
    # limits (1.7 m/s, 2.5 rad/s) and above the 1.25 m/s a policy asks at max_ee_step 0.05 m per 40 ms step.
    pose_max_speed: float = 1.5
    pose_max_angular_speed: float = 2.0
    # How far the equilibrium may lead the measured tool pose: the controller's pull is its stiffness times this
    # (2000 N/m x 0.03 m = 60 N at SERL's Franka stiffness), in contact as in free space
    pose_max_lead: float = 0.03
    pose_max_lead_angle: float = 0.3

    @property
    def hold_after_s(self) -> float:
        """`hold_after` in seconds: as given, or two control periods."""
        return 2 * self.control_period if self.hold_after is None else self.hold_after

    @property
    def has_workspace(self) -> bool:
        return self.workspace_min is not None or self.workspace_max is not None

    def validate(self, num_joints: int | None = None) -> None:
        """Raise `ShieldConfigError` naming the first bad setting. `num_joints` checks per-joint sequences."""
        _positive("control_period", self.control_period)
        for name in ("velocity_scale", "acceleration_scale", "jerk_scale"):
            value = getattr(self, name)
            _finite(name, value)
            if not 0 < value <= 1:
                raise ShieldConfigError(f"shield.{name} must be in (0, 1], got {value}")
        _per_joint("position_margin", self.position_margin, num_joints, allow_zero=True)
        if self.tracking_error is not None:
            _per_joint("tracking_error", self.tracking_error, num_joints, allow_zero=False)
        if isinstance(self.tracking_samples, bool) or not isinstance(self.tracking_samples, int):
            raise ShieldConfigError(f"shield.tracking_samples must be an integer >= 1, got {self.tracking_samples!r}")
        if self.tracking_samples < 1:
            raise ShieldConfigError(f"shield.tracking_samples must be >= 1, got {self.tracking_samples}")
        _nonnegative("state_jump_tolerance", self.state_jump_tolerance)
        _nonnegative("gripper_min_interval", self.gripper_min_interval)
        for name in ("pose_max_speed", "pose_max_angular_speed", "pose_max_lead", "pose_max_lead_angle"):
            _positive(name, getattr(self, name))
        if self.max_step is not None:
            _per_joint("max_step", self.max_step, num_joints, allow_zero=False)
        if self.has_workspace:
            if self.workspace_min is None or self.workspace_max is None:
                raise ShieldConfigError(
                    f"shield.workspace_min and shield.workspace_max must be given together, got "
                    f"workspace_min={self.workspace_min} workspace_max={self.workspace_max}"
                )
            lower, upper = _triple("workspace_min", self.workspace_min), _triple("workspace_max", self.workspace_max)
            _nonnegative("workspace_margin", self.workspace_margin)
            for axis, lo, hi in zip("xyz", lower, upper, strict=True):
                if not hi - lo > 2 * self.workspace_margin:
                    raise ShieldConfigError(
                        f"shield.workspace_max.{axis} ({hi}) must exceed shield.workspace_min.{axis} ({lo}) by more "
                        f"than twice shield.workspace_margin ({self.workspace_margin})"
                    )
        if self.hold_after is not None:
            _positive("hold_after", self.hold_after)
        _positive("stop_after", self.stop_after)
        if self.watchdog and not self.stop_after >= self.hold_after_s:
            raise ShieldConfigError(
                f"shield.stop_after ({self.stop_after}) must be >= shield.hold_after ({self.hold_after_s})"
            )
        _positive("command_timeout", self.command_timeout)
        _positive("log_interval", self.log_interval)
        for name in ("shape_motion", "position_limits", "watchdog", "timeout"):
            if not isinstance(getattr(self, name), bool):
                raise ShieldConfigError(f"shield.{name} must be true or false, got {getattr(self, name)!r}")


def _finite(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ShieldConfigError(f"shield.{name} must be a finite number, got {value!r}")


def _positive(name: str, value) -> None:
    _finite(name, value)
    if not value > 0:
        raise ShieldConfigError(f"shield.{name} must be > 0, got {value}")


def _nonnegative(name: str, value) -> None:
    _finite(name, value)
    if not value >= 0:
        raise ShieldConfigError(f"shield.{name} must be >= 0, got {value}")


def _per_joint(name: str, value, num_joints: int | None, allow_zero: bool) -> None:
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    if len(values) != 1 and num_joints is not None and len(values) != num_joints:
        raise ShieldConfigError(f"shield.{name} has {len(values)} values for {num_joints} joints: {values}")
    for v in values:
        (_nonnegative if allow_zero else _positive)(name, v)


def _triple(name: str, value) -> tuple[float, float, float]:
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
    if values is None or len(values) != 3:
        raise ShieldConfigError(f"shield.{name} must be three numbers (x, y, z), got {value!r}")
    for v in values:
        _finite(name, v)
    return tuple(float(v) for v in values)
