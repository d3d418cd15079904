"""Turning a (safe) target into the next control-period setpoint: jerk-limited with ruckig, or a plain
per-step clip when shaping is off. Both carry their state between calls and can brake to a standstill."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from robotrl.safety.limits import JointLimits

SATURATED = 1 - 1e-6  # a limit counts as shaping the step when the output uses this share of it
PATH_SAMPLE_PERIOD = 0.01  # s between the points of a predicted path (the workspace check looks at them)
MAX_PATH_SAMPLES = 96
REST = 1e-9  # |velocity| and |acceleration| below which a braking setpoint is at rest


@dataclass
class MotionStep:
    position: torch.Tensor  # the setpoint for this control period, float64 [n]
    velocity_limited: bool = False
    acceleration_limited: bool = False
    jerk_limited: bool = False
    step_clipped: bool = False
    failed: bool = False  # the trajectory generator reported an error; the position was held


def import_ruckig():
    try:
        import ruckig
    except ImportError as error:
        raise ImportError(
            "the safety shield's jerk-limited motion needs ruckig: pip install 'robotrl[safety]' "
            "(or set shield.shape_motion=false to use the per-step clip alone)"
        ) from error
    return ruckig


class JerkLimitedMotion:
    """One ruckig step per control period toward the target, velocity/acceleration/jerk within limits.

    `path_to(target)` predicts the whole move from the current state (ruckig's full trajectory), which is
    what the workspace check looks at: a retarget in mid-motion curves away from the straight segment.
    Braking uses ruckig's velocity interface toward zero (phase-synchronized, so a brake from cruise stays
    on the current direction of motion), and a hold never jumps.
    """

    def __init__(self, limits: JointLimits, period: float):
        ruckig = import_ruckig()
        self._ruckig = ruckig
        n = len(limits.lower)
        self.limits = limits
        self._generator = ruckig.Ruckig(n, period)
        self._input = ruckig.InputParameter(n)
        self._output = ruckig.OutputParameter(n)
        self._trajectory = ruckig.Trajectory(n)
        self._input.max_velocity = limits.velocity.tolist()
        self._input.max_acceleration = limits.acceleration.tolist()
        self._input.max_jerk = limits.jerk.tolist()
        # Phase first (straight joint-space moves); ruckig raises for some states, then Time, then None
        self._synchronizations = (
            ruckig.Synchronization.Phase,
            ruckig.Synchronization.Time,
            ruckig.Synchronization.No,
        )
        self._velocity = limits.velocity.tolist()
        self._acceleration = limits.acceleration.tolist()
        self._jerk = limits.jerk.tolist()
        self.position = torch.zeros(n, dtype=torch.float64)

    def reset(self, position: torch.Tensor) -> None:
        n = len(position)
        self.position = position.double().clone()
        self._input.current_position = self.position.tolist()
        self._input.current_velocity = [0.0] * n
        self._input.current_acceleration = [0.0] * n
        self._input.target_velocity = [0.0] * n
        self._input.target_acceleration = [0.0] * n
        self._generator.reset()

    @property
    def velocity(self) -> torch.Tensor:
        return torch.tensor(self._input.current_velocity, dtype=torch.float64)

    def reseed(self, position: torch.Tensor, velocity: torch.Tensor) -> None:
        """Continue from a measured state (the robot lags its setpoint): position and velocity from the
        measurement (velocity clamped to the limits), acceleration zero; the next step plans from there."""
        self.position = position.double().clone()
        limit = self.limits.velocity
        velocity = torch.minimum(torch.maximum(velocity.double(), -limit), limit)
        self._input.current_position = self.position.tolist()
        self._input.current_velocity = velocity.tolist()
        self._input.current_acceleration = [0.0] * len(self.position)

    def step_toward(self, target: torch.Tensor) -> MotionStep:
        self._input.control_interface = self._ruckig.ControlInterface.Position
        self._input.target_position = target.tolist()
        if self._solve(self._generator.update, self._output):
            return self._advance()
        step = self.brake()  # no trajectory to the target: brake instead
        step.failed = True
        return step

    @property
    def at_rest(self) -> bool:
        """Velocity and acceleration are zero: a brake has finished and the position holds exactly. Velocity
        alone is not enough: a brake can pass a period with it near zero while its deceleration still eases
        off, and the setpoint moves after that period."""
        return all(abs(v) < REST for v in self._input.current_velocity) and all(
            abs(a) < REST for a in self._input.current_acceleration
        )

    def brake(self) -> MotionStep:
        if self.at_rest:  # stay exactly still (ruckig's velocity interface drifts by ~1e-17 per step)
            self.reset(self.position)
            return MotionStep(self.position.clone())
        self._input.control_interface = self._ruckig.ControlInterface.Velocity
        if self._solve(self._generator.update, self._output):
            return self._advance()
        self.reset(self.position)
        return MotionStep(self.position.clone(), failed=True)

    def path_to(self, target: torch.Tensor | np.ndarray) -> np.ndarray | None:
        """Points [N, n] (numpy) along the move to `target` from the current state (None: no trajectory)."""
        self._input.control_interface = self._ruckig.ControlInterface.Position
        self._input.target_position = target.tolist()
        if not self._solve(self._generator.calculate, self._trajectory):
            return None
        duration = self._trajectory.duration
        samples = min(MAX_PATH_SAMPLES, max(2, math.ceil(duration / PATH_SAMPLE_PERIOD) + 1))
        at_time = self._trajectory.at_time
        step = duration / (samples - 1)
        return np.array([at_time(step * i)[0] for i in range(samples)], dtype=np.float64)

    def _solve(self, method, result_holder) -> bool:
        """Run ruckig's update or calculate with the first synchronization that works (the same choice
        for a path and for the steps along it, as both see the same state and target)."""
        ok = (self._ruckig.Result.Working, self._ruckig.Result.Finished)
        for synchronization in self._synchronizations:
            self._input.synchronization = synchronization
            try:
                if method(self._input, result_holder) in ok:
                    return True
            except self._ruckig.RuckigError:
                continue
        return False

    def _advance(self) -> MotionStep:
        out = self._output
        step = MotionStep(
            torch.tensor(out.new_position, dtype=torch.float64),
            velocity_limited=_saturates(out.new_velocity, self._velocity),
            acceleration_limited=_saturates(out.new_acceleration, self._acceleration),
            jerk_limited=_saturates(out.new_jerk, self._jerk),
        )
        out.pass_to_input(self._input)
        self.position = step.position
        return step

    def override_position(self, position: torch.Tensor) -> None:
        """The caller changed the setpoint (a guard fired): restart from it at rest."""
        self.reset(position)


class StepClippedMotion:
    """Shaping off: move straight to the target, at most `max_step` per joint per control period."""

    def __init__(self, limits: JointLimits):
        self.limits = limits
        self.position = torch.zeros(len(limits.lower), dtype=torch.float64)

    def reset(self, position: torch.Tensor) -> None:
        self.position = position.double().clone()

    @property
    def velocity(self) -> torch.Tensor:
        return torch.zeros_like(self.position)

    @property
    def at_rest(self) -> bool:
        return True  # each step jumps to its setpoint: between steps nothing moves

    def reseed(self, position: torch.Tensor, velocity: torch.Tensor) -> None:
        self.reset(position)

    def step_toward(self, target: torch.Tensor) -> MotionStep:
        delta = target - self.position
        clipped = torch.maximum(torch.minimum(delta, self.limits.max_step), -self.limits.max_step)
        self.position = self.position + clipped
        return MotionStep(self.position.clone(), step_clipped=bool((clipped != delta).any()))

    def brake(self) -> MotionStep:
        return MotionStep(self.position.clone())

    def path_to(self, target: torch.Tensor | np.ndarray) -> np.ndarray:
        """Each joint moves `max_step` per period until it arrives (a bent line in joint space)."""
        delta = torch.as_tensor(target, dtype=torch.float64) - self.position
        steps = float((delta.abs() / self.limits.max_step).ceil().max())
        at = torch.linspace(0.0, steps, min(MAX_PATH_SAMPLES, int(steps) + 1), dtype=torch.float64)
        path = self.position + torch.minimum(at[:, None] * self.limits.max_step, delta.abs()) * delta.sign()
        return path.numpy()

    def override_position(self, position: torch.Tensor) -> None:
        self.reset(position)


def _saturates(values: list[float], limits: list[float]) -> bool:
    return any(abs(v) >= SATURATED * limit for v, limit in zip(values, limits, strict=True))
