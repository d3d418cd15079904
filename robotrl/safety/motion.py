"""Turning a (safe) target into the next control-period setpoint: jerk-limited with ruckig, or a plain
per-step clip when shaping is off. Both carry their state between calls and can brake to a standstill.

A move is planned once (`plan`), checked by the caller (the workspace box looks at `Plan.path()`), and then
followed exactly (`follow`, `step`): the setpoints sent are the samples of the trajectory that was checked.
Re-planning to the same target from mid-move is not: ruckig's time-optimal continuation from a state on a
trajectory may take another route (seen: one period's plan inside the margin box, the next 48 mm outside).
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
    failed: bool = False  # no trajectory could be planned; the motion braked or held instead


@dataclass
class Plan:
    """A move from the state it was planned in: to `target` at rest, or (`target` None) a brake to rest."""

    target: torch.Tensor | None
    duration: float
    # seconds since the start -> joint positions, velocities, accelerations [n] each (numpy float64)
    state: Callable[[float], tuple[np.ndarray, np.ndarray, np.ndarray]]

    def path(self) -> np.ndarray:
        """Points [N, n] along the whole move, start and end included (the workspace check looks at them)."""
        samples = min(MAX_PATH_SAMPLES, max(2, math.ceil(self.duration / PATH_SAMPLE_PERIOD) + 1))
        step = self.duration / (samples - 1)
        return np.stack([self.state(step * i)[0] for i in range(samples)])


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
    """Velocity, acceleration and jerk within limits: ruckig plans each move from the current state.

    `plan(target)` gives the whole move (a retarget in mid-motion curves away from the straight segment),
    `brake_plan()` the stop from the current state (ruckig's velocity interface toward zero, phase-
    synchronized where it can be, so a brake from cruise stays on the current direction of motion).
    """

    def __init__(self, limits: JointLimits, period: float):
        ruckig = import_ruckig()
        self._ruckig = ruckig
        n = len(limits.lower)
        self.limits = limits
        self.period = period
        self._generator = ruckig.Ruckig(n, period)
        self._input = ruckig.InputParameter(n)
        self._input.max_velocity = limits.velocity.tolist()
        self._input.max_acceleration = limits.acceleration.tolist()
        self._input.max_jerk = limits.jerk.tolist()
        # Phase first (straight joint-space moves); ruckig raises for some states, then Time, then None
        self._synchronizations = (
            ruckig.Synchronization.Phase,
            ruckig.Synchronization.Time,
            ruckig.Synchronization.No,
        )
        self._velocity_limit = limits.velocity.numpy()
        self._acceleration_limit = limits.acceleration.numpy()
        self._jerk_limit = limits.jerk.numpy()
        self.position = torch.zeros(n, dtype=torch.float64)
        self._state = (np.zeros(n), np.zeros(n), np.zeros(n))  # position, velocity, acceleration
        self._plan: Plan | None = None
        self._plan_steps = 0  # periods of the plan followed so far (time as a count: no drift of sums)

    def reset(self, position: torch.Tensor) -> None:
        """At rest at `position`, following nothing."""
        self.position = position.double().clone()
        n = len(self.position)
        self._state = (self.position.numpy().copy(), np.zeros(n), np.zeros(n))
        self._plan = None

    @property
    def velocity(self) -> torch.Tensor:
        return torch.from_numpy(self._state[1].copy())

    @property
    def following(self) -> Plan | None:
        """The plan being followed (None at rest or after a re-seed)."""
        return self._plan

    def reseed(self, position: torch.Tensor, velocity: torch.Tensor) -> None:
        """Continue from a measured state (the robot lags its setpoint): position and velocity from the
        measurement (velocity clamped to the limits), acceleration zero; the plan followed is dropped."""
        self.position = position.double().clone()
        limit = self.limits.velocity
        velocity = torch.minimum(torch.maximum(velocity.double(), -limit), limit)
        self._state = (self.position.numpy().copy(), velocity.numpy().copy(), np.zeros(len(self.position)))
        self._plan = None

    @property
    def at_rest(self) -> bool:
        """Velocity and acceleration are zero: a brake has finished and the position holds exactly. Velocity
        alone is not enough: a brake can pass a period with it near zero while its deceleration still eases
        off, and the setpoint moves after that period."""
        _, velocity, acceleration = self._state
        return bool(np.all(np.abs(velocity) < REST) and np.all(np.abs(acceleration) < REST))

    def plan(self, target: torch.Tensor | np.ndarray) -> Plan | None:
        """The move to `target` (at rest there) from the current state; None: ruckig found none."""
        target = torch.as_tensor(target, dtype=torch.float64)
        self._input.control_interface = self._ruckig.ControlInterface.Position
        self._input.target_position = target.tolist()
        return self._calculate(target.clone())

    def brake_plan(self) -> Plan | None:
        """The stop from the current state; None: ruckig found none."""
        self._input.control_interface = self._ruckig.ControlInterface.Velocity
        return self._calculate(None)

    def follow(self, plan: Plan) -> None:
        """Follow `plan` from its start (it must have been planned from the current state)."""
        self._plan, self._plan_steps = plan, 0

    def step(self) -> MotionStep:
        """One control period along the plan followed; at its end the position holds; following none, a brake."""
        plan = self._plan
        if plan is None:
            return self.brake()  # following nothing: at rest, holds; moving (never expected), stops
        self._plan_steps += 1
        elapsed = min(self._plan_steps * self.period, plan.duration)
        position, velocity, acceleration = plan.state(elapsed)
        if elapsed >= plan.duration:  # arrived: exactly at rest, never a drift of rounding errors
            if plan.target is not None:
                position = plan.target.numpy().copy()
            velocity, acceleration = np.zeros_like(velocity), np.zeros_like(acceleration)
            self._plan = None
        jerk = np.abs(acceleration - self._state[2]) / self.period
        step = MotionStep(
            torch.from_numpy(position.copy()),
            velocity_limited=_saturates(velocity, self._velocity_limit),
            acceleration_limited=_saturates(acceleration, self._acceleration_limit),
            jerk_limited=_saturates(jerk, self._jerk_limit),
        )
        self._state = (position, velocity, acceleration)
        self.position = step.position
        return step

    def brake(self) -> MotionStep:
        """One period of the stop: along the brake followed, or a new one from the current state."""
        if self.at_rest:  # stay exactly still
            self.reset(self.position)
            return MotionStep(self.position.clone())
        if self._plan is None or self._plan.target is not None:
            plan = self.brake_plan()
            if plan is None:
                self.reset(self.position)
                return MotionStep(self.position.clone(), failed=True)
            self.follow(plan)
        return self.step()

    def _calculate(self, target: torch.Tensor | None) -> Plan | None:
        """ruckig's trajectory from the current state with the first synchronization that works."""
        position, velocity, acceleration = self._state
        self._input.current_position = position.tolist()
        self._input.current_velocity = velocity.tolist()
        self._input.current_acceleration = acceleration.tolist()
        n = len(position)
        self._input.target_velocity = [0.0] * n
        self._input.target_acceleration = [0.0] * n
        ok = (self._ruckig.Result.Working, self._ruckig.Result.Finished)
        for synchronization in self._synchronizations:
            self._input.synchronization = synchronization
            trajectory = self._ruckig.Trajectory(n)
            try:
                if self._generator.calculate(self._input, trajectory) not in ok:
                    continue
            except self._ruckig.RuckigError:
                continue
            return Plan(target, trajectory.duration, _sampler(trajectory))
        return None

    def override_position(self, position: torch.Tensor) -> None:
        """The caller changed the setpoint (a guard fired): restart from it at rest."""
        self.reset(position)


class StepClippedMotion:
    """Shaping off: move straight to the target, at most `max_step` per joint per control period."""

    def __init__(self, limits: JointLimits, period: float):
        self.limits = limits
        self.period = period
        self.position = torch.zeros(len(limits.lower), dtype=torch.float64)
        self._plan: Plan | None = None
        self._steps = 0

    def reset(self, position: torch.Tensor) -> None:
        self.position = position.double().clone()
        self._plan = None

    @property
    def velocity(self) -> torch.Tensor:
        return torch.zeros_like(self.position)

    @property
    def following(self) -> Plan | None:
        return self._plan

    @property
    def at_rest(self) -> bool:
        return True  # each step jumps to its setpoint: between steps nothing moves

    def reseed(self, position: torch.Tensor, velocity: torch.Tensor) -> None:
        self.reset(position)

    def plan(self, target: torch.Tensor | np.ndarray) -> Plan:
        """Each joint moves `max_step` per period until it arrives (a bent line in joint space)."""
        target = torch.as_tensor(target, dtype=torch.float64).clone()
        start, max_step = self.position.numpy().copy(), self.limits.max_step.numpy()
        delta = target.numpy() - start
        steps = float(np.ceil(np.abs(delta) / max_step).max())
        period, zero = self.period, np.zeros_like(start)

        def state(t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            moved = np.minimum(round(t / period, 9) * max_step, np.abs(delta))
            return start + moved * np.sign(delta), zero, zero

        return Plan(target, steps * period, state)

    def brake_plan(self) -> Plan:
        return self.plan(self.position)

    def follow(self, plan: Plan) -> None:
        self._plan, self._steps = plan, 0

    def step(self) -> MotionStep:
        plan = self._plan
        if plan is None:
            return MotionStep(self.position.clone())
        self._steps += 1
        position = plan.state(self._steps * self.period)[0]
        if self._steps * self.period >= plan.duration - 1e-12:
            position, self._plan = plan.target.numpy().copy(), None
        previous, self.position = self.position, torch.from_numpy(position.copy())
        clipped = bool(((self.position - previous).abs() >= self.limits.max_step * SATURATED).any())
        return MotionStep(self.position.clone(), step_clipped=clipped)

    def brake(self) -> MotionStep:
        self._plan = None
        return MotionStep(self.position.clone())

    def override_position(self, position: torch.Tensor) -> None:
        self.reset(position)


def _sampler(trajectory) -> Callable[[float], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    def state(t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        position, velocity, acceleration = trajectory.at_time(t)
        return np.array(position), np.array(velocity), np.array(acceleration)

    return state


def _saturates(values: np.ndarray, limits: np.ndarray) -> bool:
    return bool(np.any(np.abs(values) >= SATURATED * limits))
