"""The safety shield: every joint-position command passes through `Shield.filter` once per control period.

Order of the checks in one call (docs/architecture.md, "Safety shield", says why):
the joint state (out of order or physically impossible: refused) -> latches and holds (e-stop, joint-state
age, command timeout) -> NaN guard -> joint limits -> workspace (the whole planned move, then followed
exactly) -> jerk-limited step (or per-step clip) -> output guards (finite, per-step change, hard joint
limits, the workspace box).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from robotrl.core.robot_spec import RobotSpec
from robotrl.safety.config import ShieldConfig, ShieldConfigError
from robotrl.safety.corrections import CorrectionCounter, logger
from robotrl.safety.kinematics import KinematicChain
from robotrl.safety.limits import JointLimits, per_joint
from robotrl.safety.motion import JerkLimitedMotion, MotionStep, StepClippedMotion
from robotrl.safety.watchdog import StateAge, StateWatchdog
from robotrl.safety.workspace import PathCheck, WorkspaceBox, limit_target_to_workspace

STEP_TOLERANCE = 1e-9  # relative slack before the per-step guard calls a ruckig step too long
# A joint state is refused when a joint moved further since the last accepted one than its velocity limit
# times this slack allows, plus shield.state_jump_tolerance: a sensor glitch, never a real motion.
STATE_JUMP_SLACK = 1.5


class ShieldResetError(RuntimeError):
    """reset() was refused: the e-stop is pressed or not acknowledged, or the joint state is not fresh."""


class EStopLatchedError(ShieldResetError):
    """reset() or acknowledge_estop() was refused by the e-stop: waiting cannot clear it, only the operator
    (`pressed`: still held down; else released but not acknowledged)."""

    def __init__(self, message: str, pressed: bool):
        super().__init__(message)
        self.pressed = pressed


@dataclass(frozen=True)
class SafeCommand:
    target: torch.Tensor  # joint position setpoint for this control period, float64 [n]
    gripper: torch.Tensor | None  # gripper setpoint (0-dim), None until a valid one was given
    mode: str  # track | hold | stop
    info: dict[str, int]  # safety/<kind>: 1 if corrected this step; safety/hold, safety/stop


class Shield:
    def __init__(self, spec: RobotSpec, config: ShieldConfig, chain: KinematicChain | None = None):
        config.validate(num_joints=len(spec.joints))
        self.spec = spec
        self.config = config
        self.limits = JointLimits.from_spec(spec, config)
        self._hard_lower = spec.position_lower.double()
        self._hard_upper = spec.position_upper.double()
        self.box = None
        if config.has_workspace:
            if chain is None:
                raise ShieldConfigError("shield.workspace_min/max need the robot's model: pass model_file")
            self.box = WorkspaceBox(config.workspace_min, config.workspace_max, config.workspace_margin)
        self.chain = chain
        self.motion = (
            JerkLimitedMotion(self.limits, config.control_period)
            if config.shape_motion
            else StepClippedMotion(self.limits, config.control_period)
        )
        self._tracking_bound = (
            None if config.tracking_error is None else per_joint(config.tracking_error, len(spec.joints))
        )
        self._measured: tuple[torch.Tensor, float] | None = None  # last accepted joint state and its stamp
        self._measured_velocity = torch.zeros(len(spec.joints), dtype=torch.float64)
        # a measured joint cannot move faster than its hardware limit: a bigger jump between samples is a glitch
        self._velocity_bound = spec.velocity_limit.double() * STATE_JUMP_SLACK
        self._lagging_samples = 0  # consecutive accepted samples beyond the tracking bound
        self._last_now = -math.inf
        self._output_outside = 0.0  # how far the last setpoint's tool point is outside the box (0: inside)
        self._gripper_changed_at = -math.inf
        self._gripper_pending: torch.Tensor | None = None
        self.watchdog = StateWatchdog(config.hold_after_s, config.stop_after)
        self.corrections = CorrectionCounter(config.log_interval)
        self._started = False
        self._estop_pressed = False
        self._estop_latched = False
        self._estop_acknowledged = False
        self._stop_latched = False
        self._safe_target = torch.zeros(len(spec.joints), dtype=torch.float64)
        # the target a stale-state hold paused: tracked again once the state is fresh, unless a newer command, an
        # e-stop, a stop or the command timeout came first
        self._paused_command: torch.Tensor | None = None
        self._output = self._safe_target.clone()
        self._last_command_time = -math.inf
        self._gripper: torch.Tensor | None = None

    @classmethod
    def from_spec(cls, spec: RobotSpec, config: ShieldConfig, model_file: str | Path | None = None) -> Shield:
        """A shield for `spec`; `model_file` (the robot's MJCF) is read for the workspace check's kinematics."""
        chain = None
        if model_file is not None and config.has_workspace:
            if spec.end_effector_site is None:
                raise ShieldConfigError(f"robot {spec.name!r} has no end_effector_site for the workspace box")
            chain = KinematicChain.from_mjcf(model_file, spec.end_effector_site, spec.joints)
        return cls(spec, config, chain)

    @property
    def counts(self) -> dict[str, int]:
        """Corrections per kind since construction (a step counts once per kind)."""
        return dict(self.corrections.totals)

    @property
    def latched(self) -> str | None:
        return "estop" if self._estop_latched else "stale_stop" if self._stop_latched else None

    @property
    def at_rest(self) -> bool:
        """The setpoint has stopped and will not move while braking or holding (the condition for reset() once
        started): velocity and acceleration both zero."""
        return self.motion.at_rest

    def estop(self, active: bool) -> None:
        """The e-stop input (a std_msgs/Bool topic on hardware). Pressing latches; releasing does not unlatch:
        that takes `acknowledge_estop()` and then `reset()`."""
        if active and not self._estop_latched:
            logger.warning("safety shield: e-stop pressed, holding until acknowledged and reset()")
        self._estop_pressed = bool(active)
        self._estop_latched = self._estop_latched or self._estop_pressed
        if self._estop_pressed:
            self._estop_acknowledged = False

    def acknowledge_estop(self) -> None:
        """The operator's deliberate permission to restart after releasing the e-stop. Releasing alone must not
        restart motion (as ISO 13850 asks of machines): an episode's automatic reset would otherwise drive the
        arm again with nobody having decided so."""
        if self._estop_pressed:
            raise EStopLatchedError("the e-stop is still pressed: release it, then acknowledge", pressed=True)
        self._estop_acknowledged = self._estop_latched

    def reset(
        self,
        joint_position: torch.Tensor,
        state_stamp: float,
        now: float,
        gripper_position: float | torch.Tensor | None = None,
    ) -> None:
        """Start (or restart after a latch) from the measured joint state, at rest, holding it."""
        _check_time(now)
        self._check_monotonic(now)
        if self._estop_pressed:
            raise EStopLatchedError(
                "the e-stop is still pressed: release it, acknowledge it, then reset()", pressed=True
            )
        if self._estop_latched and not self._estop_acknowledged:
            raise EStopLatchedError(
                "the e-stop was released but not acknowledged: acknowledge_estop(), then reset()", pressed=False
            )
        if self._started and not self.at_rest:
            # restarting at rest from a moving setpoint would be a velocity jump: let the brake finish
            raise ShieldResetError("the setpoint is still braking: call filter() until at_rest, then reset()")
        position = self._joint_vector(joint_position, "joint_position")
        if not bool(torch.isfinite(position).all()):
            raise ShieldResetError(f"the joint state is not finite: {position.tolist()}")
        if self.config.watchdog and self.watchdog.classify(state_stamp, now) is not StateAge.FRESH:
            raise ShieldResetError(
                f"the joint state is not fresh (stamp {state_stamp}, now {now}, hold_after {self.config.hold_after_s})"
            )
        gripper = None
        if gripper_position is not None:  # checked before anything changes: a refused reset leaves the latches
            if not bool(torch.isfinite(torch.as_tensor(gripper_position)).all()):
                raise ShieldResetError(f"the gripper position is not finite: {gripper_position}")
            gripper = self._gripper_clamp(torch.as_tensor(gripper_position, dtype=torch.float64))[0]
        # a measured position a hair beyond a hard limit: start from the limit, never command beyond it
        position = torch.minimum(torch.maximum(position, self._hard_lower), self._hard_upper)
        self.motion.reset(position)
        self._measured = (position.clone(), float(state_stamp))
        self._measured_velocity.zero_()
        self._lagging_samples = 0
        self._safe_target = position.clone()
        self._paused_command = None
        self._output = position.clone()
        self._output_outside = self._outside_box(position)
        self._last_command_time = now
        self._estop_latched = self._stop_latched = self._estop_acknowledged = False
        if gripper is not None:
            self._gripper = gripper
        self._started = True

    def filter(
        self,
        command: torch.Tensor | None,
        joint_position: torch.Tensor,
        state_stamp: float | None,
        now: float,
        gripper: float | torch.Tensor | None = None,
        joint_velocity: torch.Tensor | None = None,
    ) -> SafeCommand:
        """One control period. `command` is the policy's new joint-position target, or None when the policy
        has not produced a new one since the last call (pass each command once: the timeout counts from it).
        `state_stamp` is when the joint state was measured (the message's own stamp, on the clock of `now`:
        monotonic seconds that never go back). A state stamped before the newest one accepted, or one that
        moved further than the hardware could since then, is refused: the newest accepted state ages in its
        place. `joint_velocity` (measured) is used when the motion is re-seeded after a tracking error;
        without it the velocity is estimated from the joint positions of consecutive stamps."""
        if not self._started:
            raise RuntimeError("call Shield.reset(joint_position, state_stamp, now) before filter()")
        _check_time(now)
        self._check_monotonic(now)
        count = self.corrections
        count.begin_step()
        position = self._joint_vector(joint_position, "joint_position")
        new_sample = self._accept_state(position, state_stamp, now)
        if not new_sample and self._measured is not None and _usable(state_stamp) and _finite(position):
            state_stamp = self._measured[1]  # a refused or repeated sample: the newest accepted one ages
        state_age = self._state_age(position, state_stamp, now)
        if state_age is StateAge.STOP and not self._stop_latched:
            self._stop_latched = True
            logger.warning("safety shield: joint state stale or invalid (stamp %s, now %s): stopped", state_stamp, now)

        new_target = None
        if command is not None:
            command = self._joint_vector(command, "command")
            if bool(torch.isfinite(command).all()):
                self._last_command_time = now
                new_target = command
            else:
                count.add("nan", now)

        reseeded = False
        # no re-seed while latched: an e-stop or a stop must not move the setpoint toward a pushed arm
        if state_age is StateAge.FRESH and new_sample and not (self._estop_latched or self._stop_latched):
            velocity = self._measured_velocity
            if joint_velocity is not None:
                given = self._joint_vector(joint_velocity, "joint_velocity")
                velocity = given if bool(torch.isfinite(given).all()) else velocity
            reseeded = self._check_tracking(position, velocity, now)

        mode = "track"
        if self._estop_latched:
            mode = "hold"
            count.add("estop", now)
        elif self._stop_latched:
            mode = "stop"
            count.add("stale_stop", now)
        elif state_age is StateAge.HOLD:
            mode = "hold"
            count.add("stale_hold", now)
        elif self.config.timeout and now - self._last_command_time > self.config.command_timeout:
            mode = "hold"
            count.add("command_timeout", now)

        if mode == "track" and reseeded and not self._replan_from_measured(now):
            mode = "hold"  # no move from where the arm is now keeps the tool point in the box: stop
        if mode == "track" and new_target is None and self._paused_command is not None:
            # A stale-state hold is a pause: with the state fresh again the command in force goes on, checked as
            # a new one. Left braked until the policy's next command, a Python link whose states came a few ms
            # late lost most of each policy period's motion: pick on the twin, 21-37 such holds an episode,
            # succeeded 0/5 where simulation did 3/5.
            new_target = self._paused_command
        if mode == "track":
            self._paused_command = None
        if mode == "track" and new_target is not None:
            self._accept(new_target, now)
        if mode == "track":
            step = self.motion.step()
        else:
            # a stale-state or timeout hold may finish the checked move when the brake would leave the box;
            # an e-stop or a latched stop always brakes
            step = self._brake(now, may_keep_move=mode == "hold" and not self._estop_latched)
        self._count_shaping(step, now)
        target = self._guard_output(step.position, now)
        if mode != "track":
            stale_pause = mode == "hold" and state_age is StateAge.HOLD and not self._estop_latched
            if not stale_pause:
                self._paused_command = None
            elif self._paused_command is None:  # a command given during the pause was computed from stale data
                self._paused_command = self._safe_target.clone()
            self._safe_target = self._where_motion_ends(target)  # resume from where the hold comes to rest
        self._output = target
        # the gripper keeps its setpoint whenever the arm does not track: a gripper closing on a command sent
        # into a stale-state hold would act on a world the policy no longer sees
        self._filter_gripper(gripper, now, latched=mode != "track")

        info = {f"safety/{kind}": value for kind, value in count.step.items()}
        info["safety/hold"] = int(mode == "hold")
        info["safety/stop"] = int(mode == "stop")
        gripper_out = None if self._gripper is None else self._gripper.clone()
        return SafeCommand(target=target.clone(), gripper=gripper_out, mode=mode, info=info)

    @property
    def measured(self) -> tuple[torch.Tensor, float] | None:
        """The newest joint state accepted (positions, stamp): what the shield believes the arm is doing."""
        return None if self._measured is None else (self._measured[0].clone(), self._measured[1])

    def judge_state(self, position: torch.Tensor, stamp: float | None) -> str | None:
        """Why a joint state sample would be refused (None: it is the newest accepted one, or would be taken):
        stamped before the newest accepted one (out of order), or moved further than the hardware can in
        the time between the stamps (a glitch). A robot env asks the same before acting on an observation."""
        previous = self._measured
        if not _usable(stamp) or not _finite(position):
            return "not finite or not stamped"
        if previous is None:
            return None
        if stamp < previous[1]:
            return "state_out_of_order"
        if stamp == previous[1]:
            return None if torch.equal(position, previous[0]) else "state_glitch"
        bound = self._velocity_bound * (stamp - previous[1]) + self.config.state_jump_tolerance
        return "state_glitch" if bool(((position - previous[0]).abs() > bound).any()) else None

    def _accept_state(self, position: torch.Tensor, stamp: float | None, now: float) -> bool:
        """Take a joint state sample as the newest measurement, or refuse it (`judge_state`). Returns whether
        it was taken as a new sample (a repeat of the newest is not new)."""
        previous = self._measured
        refused = self.judge_state(position, stamp)
        if refused in ("state_out_of_order", "state_glitch"):
            self.corrections.add(refused, now, f"stamp {stamp}, measured {position.tolist()}")
        if refused is not None or (previous is not None and stamp == previous[1]):
            return False
        if previous is not None:
            self._measured_velocity = (position - previous[0]) / (stamp - previous[1])
        self._measured = (position.clone(), float(stamp))  # the caller may reuse its buffer
        return True

    def _check_tracking(self, position: torch.Tensor, velocity: torch.Tensor, now: float) -> bool:
        """Re-seed the motion toward the measured state once a joint has lagged its last setpoint by more than
        the bound in `tracking_samples` accepted samples in a row: a position-controlled joint far from its
        setpoint sprints back faster than the setpoints move. The setpoint moves at most the bound toward the
        measurement, so no single re-seed jumps further than that."""
        bound = self._tracking_bound
        if bound is None:
            return False
        lag = position - self._output
        if not bool((lag.abs() > bound).any()):
            self._lagging_samples = 0
            return False
        self._lagging_samples += 1
        if self._lagging_samples < self.config.tracking_samples:
            return False
        self._lagging_samples = 0
        start = self._output + torch.maximum(torch.minimum(lag, bound), -bound)
        start = torch.minimum(torch.maximum(start, self._hard_lower), self._hard_upper)
        outside = self._outside_box(start)
        if outside > self._output_outside + 1e-12:  # toward an arm pushed out of the box: the setpoint stays
            self.corrections.add("workspace", now, f"re-seed refused: {outside * 1e3:.1f} mm outside the box")
            return False
        self.corrections.add("tracking_error", now, f"measured {position.tolist()}, setpoint {self._output.tolist()}")
        self.motion.reseed(start, velocity)
        self._output, self._output_outside = start.clone(), outside
        return True

    def _replan_from_measured(self, now: float) -> bool:
        """After a re-seed the move followed is gone: plan again to the tracked target from the new state,
        checked against the box (pulled back toward where the arm is). False: no such move; brake."""
        if self.box is None:
            plan = self.motion.plan(self._safe_target)
        else:
            check = PathCheck(self.chain, self.box, self.motion.position)
            plan, cut = limit_target_to_workspace(check, self.motion.position, self._safe_target, self.motion.plan)
            if cut:
                self.corrections.add("workspace", now)
        if plan is None:
            return False
        self.motion.follow(plan)
        self._safe_target = plan.target
        return True

    def _state_age(self, position: torch.Tensor, state_stamp: float | None, now: float) -> StateAge:
        if not bool(torch.isfinite(position).all()):
            return StateAge.STOP if self.config.watchdog else StateAge.HOLD
        if not self.config.watchdog:
            return StateAge.FRESH
        return self.watchdog.classify(state_stamp, now)

    def _accept(self, command: torch.Tensor, now: float) -> None:
        """Follow the move to the command (clamped to the limits, pulled back into the box). When no part of
        it can be allowed, the move being followed goes on: it was checked when it began."""
        target = command
        if self.config.position_limits:
            target, clamped = self.limits.clamp(target)
            if clamped:
                self.corrections.add("position_limit", now, f"command {command.tolist()}")
        if self.box is None:
            plan = self.motion.plan(target)
            if plan is None:
                self.corrections.add("motion_error", now, f"no trajectory to {target.tolist()}")
        else:
            check = PathCheck(self.chain, self.box, self.motion.position)
            plan, cut = limit_target_to_workspace(check, self._safe_target, target, self.motion.plan)
            if cut:
                self.corrections.add("workspace", now)
        if plan is not None:
            self.motion.follow(plan)
            self._safe_target = plan.target

    def _brake(self, now: float, may_keep_move: bool) -> MotionStep:
        """One period of a stop. A new brake is checked against the box; where it would leave the box and
        `may_keep_move`, the checked move being followed goes on instead (it ends at rest inside)."""
        motion = self.motion
        following = motion.following
        if following is not None and following.target is None:
            return motion.step()  # a brake already under way (checked when it began, or the only way left)
        if motion.at_rest:
            return motion.brake()
        brake = motion.brake_plan()
        if brake is None:
            return motion.brake()  # no stop could be planned: the motion reports it and holds
        if self.box is not None and not PathCheck(self.chain, self.box, motion.position).allows(brake):
            self.corrections.add("workspace", now, "the brake would leave the box")
            if may_keep_move and following is not None:
                return motion.step()
        motion.follow(brake)
        return motion.step()

    def _count_shaping(self, step: MotionStep, now: float) -> None:
        for kind, fired in (
            ("velocity", step.velocity_limited),
            ("acceleration", step.acceleration_limited),
            ("jerk", step.jerk_limited),
            ("delta_clip", step.step_clipped),
            ("motion_error", step.failed),
        ):
            if fired:
                self.corrections.add(kind, now)

    def _guard_output(self, position: torch.Tensor, now: float) -> torch.Tensor:
        """Last line: whatever the motion stage produced must be finite, within the per-step change, within
        the hard joint limits and, with a workspace, keep the tool point in the box (not its margin), or no
        further out than the last setpoint. None of these fire in normal operation; if one does the motion
        restarts at rest."""
        guarded = position
        if not bool(torch.isfinite(guarded).all()):
            self.corrections.add("motion_error", now, "non-finite setpoint")
            guarded = self._output.clone()
        max_step = self.limits.max_step * (1 + STEP_TOLERANCE)
        delta = guarded - self._output
        if bool((delta.abs() > max_step).any()):
            self.corrections.add("delta_clip", now)
            guarded = self._output + torch.maximum(torch.minimum(delta, max_step), -max_step)
        limited = torch.minimum(torch.maximum(guarded, self._hard_lower), self._hard_upper)
        if bool((limited != guarded).any()):
            self.corrections.add("position_limit", now, "setpoint beyond a hard limit")
            guarded = limited
        # a setpoint that did not move (at rest, holding) is as far out as the last: no forward kinematics
        outside = self._output_outside if torch.equal(guarded, self._output) else self._outside_box(guarded)
        if outside > self._output_outside + 1e-12:
            # leaving the box (or going further out): hold the last setpoint, whatever the stage before planned
            self.corrections.add("workspace_guard", now, f"setpoint {outside * 1e3:.1f} mm outside the box")
            guarded, outside = self._output.clone(), self._output_outside
        self._output_outside = outside
        if guarded is not position:
            self.motion.override_position(guarded)
        return guarded

    def _where_motion_ends(self, position: torch.Tensor) -> torch.Tensor:
        """Where the motion comes to rest: the end of the plan it follows, else `position` (at rest)."""
        plan = self.motion.following
        if plan is None:
            return position.clone()
        return torch.from_numpy(plan.state(plan.duration)[0].copy())

    def _outside_box(self, position: torch.Tensor) -> float:
        """How far the tool point at `position` is outside the workspace box itself (margin 0); 0 inside."""
        if self.box is None:
            return 0.0
        return self.box.max_distance_outside(self.chain.site_positions(position.numpy()[None]), margin=0.0)

    def _check_monotonic(self, now: float) -> None:
        if now < self._last_now:
            raise ValueError(f"now went back in time: {now!r} after {self._last_now!r} (use a monotonic clock)")
        self._last_now = now

    def _filter_gripper(self, gripper, now: float, latched: bool) -> None:
        """Take a new gripper setpoint (clamped to the spec's range), unless `latched` keeps the old one. The
        setpoint changes at most once per `gripper_min_interval`: a command in between waits (the newest wins),
        so a policy toggling every period cannot slam the fingers open and shut."""
        if gripper is not None:
            if self.spec.gripper is None:
                raise ValueError(f"robot {self.spec.name!r} has no gripper, got a gripper command {gripper!r}")
            value = torch.as_tensor(gripper, dtype=torch.float64).reshape(())
            if not bool(torch.isfinite(value)):
                self.corrections.add("gripper_nan", now)
            elif not latched:
                value, clamped = self._gripper_clamp(value)
                if clamped:
                    self.corrections.add("gripper_limit", now)
                self._gripper_pending = value
        if latched:
            self._gripper_pending = None
        pending = self._gripper_pending
        if pending is None:
            return
        if self._gripper is not None and bool(pending == self._gripper):
            self._gripper_pending = None
        elif now - self._gripper_changed_at >= self.config.gripper_min_interval:
            self._gripper, self._gripper_pending, self._gripper_changed_at = pending, None, now
        elif gripper is not None:
            self.corrections.add("gripper_rate", now)

    def _gripper_clamp(self, value: torch.Tensor) -> tuple[torch.Tensor, bool]:
        if self.spec.gripper is None:
            raise ValueError(f"robot {self.spec.name!r} has no gripper")
        low = min(self.spec.gripper.open, self.spec.gripper.closed)
        high = max(self.spec.gripper.open, self.spec.gripper.closed)
        clamped = value.clamp(low, high)
        return clamped, bool(clamped != value)

    def _joint_vector(self, value, name: str) -> torch.Tensor:
        vector = torch.as_tensor(value, dtype=torch.float64)
        if vector.shape != (len(self.spec.joints),):
            raise ValueError(f"{name} must have shape ({len(self.spec.joints)},), got {tuple(vector.shape)}")
        return vector


def _check_time(now: float) -> None:
    if not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"now must be finite monotonic seconds, got {now!r}")


def _usable(stamp: float | None) -> bool:
    return stamp is not None and math.isfinite(stamp)


def _finite(values: torch.Tensor) -> bool:
    return bool(torch.isfinite(values).all())
