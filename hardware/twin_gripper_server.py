"""The simulated twin's gripper behind ROS 2 actions, as franka_gripper offers a Panda's: `<namespace>/move`,
`<namespace>/grasp`, `<namespace>/homing` (franka_msgs/action/Move, Grasp, Homing) and a
control_msgs/action/GripperCommand (`<namespace>/gripper_action` by default, franka_gripper's name), over the dds
backend, so a `GripperActionClient` (hardware/gripper_actions.py) drives the twin's fingers as it would a robot's.

    server = TwinGripperServer(bridge, set_target=twin_set_gripper, read_opening=twin_finger_opening,
                               gripper=spec.gripper)
    ...
    server.close()

The twin gives two callables: one that sets its gripper target and one that reads its finger opening, both in
metres per finger (the robot spec's `gripper.open`/`closed`). Franka widths are twice that. Each goal sets the
target, then watches the opening at `rate_hz` until it is within `tolerance` of the target (reached), stops moving
(`stall_distance` in `stall_time`: closed on something), is cancelled (the target becomes the opening: the fingers
stop where they are, as franka_gripper's stop does), is replaced by a newer goal (aborted: the newest goal owns the
fingers), or `goal_timeout` passes (aborted). Outcomes as the robot's servers give them: Move and Homing succeed
when reached; Grasp succeeds when the width it stopped at is within its epsilons of the goal's width (libfranka's
rule); GripperCommand succeeds when reached or stalled (`stalled` true: holding something, as ros2_control's
gripper controller with stalling allowed), publishing the opening as feedback. A width or position outside the
gripper's range is aborted with the range in the error, as franka_gripper does.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from robotrl.hardware.ros2.bridge import Bridge
from robotrl.hardware.ros2.names import full_topic_name

from robotrl.core.robot_spec import GripperSpec

log = logging.getLogger(__name__)


class TwinGripperServer:
    """The twin's gripper as action servers (module docstring)."""

    def __init__(
        self,
        bridge: Bridge,
        set_target: Callable[[float], None],
        read_opening: Callable[[], float],
        gripper: GripperSpec,
        namespace: str = "/franka_gripper",
        gripper_command_action: str | None = None,
        tolerance: float = 0.002,
        stall_distance: float = 0.0005,
        stall_time: float = 0.2,
        goal_timeout: float = 5.0,
        rate_hz: float = 50.0,
    ):
        # the action modules need cyclonedds (the ros extra), as the bridge does
        from robotrl.hardware.ros2 import action_msgs
        from robotrl.hardware.ros2.actions import ActionServer

        for name, function in (("set_target", set_target), ("read_opening", read_opening)):
            if not callable(function):
                raise TypeError(f"{name} must be callable, got {function!r}")
        if not isinstance(gripper, GripperSpec):
            raise TypeError(f"gripper must be the robot spec's GripperSpec, got {gripper!r}")
        for name, value in (
            ("tolerance", tolerance),
            ("stall_distance", stall_distance),
            ("stall_time", stall_time),
            ("goal_timeout", goal_timeout),
            ("rate_hz", rate_hz),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"twin gripper server setting {name} must be a finite number > 0, got {value!r}")
        self._msgs = action_msgs
        self._set_target, self._read_opening = set_target, read_opening
        self.low, self.high = sorted((float(gripper.closed), float(gripper.open)))
        self.open = float(gripper.open)
        self.tolerance, self.stall_distance, self.stall_time = tolerance, stall_distance, stall_time
        self.goal_timeout, self.period = goal_timeout, 1.0 / rate_hz
        self._lock = threading.Lock()
        self._generation = 0  # the newest goal's number: an older goal still running sees it changed and stops
        namespace = full_topic_name(namespace)
        command_action = f"{namespace}/gripper_action" if gripper_command_action is None else gripper_command_action
        self.actions = {
            "move": f"{namespace}/move",
            "grasp": f"{namespace}/grasp",
            "homing": f"{namespace}/homing",
            "gripper_command": full_topic_name(command_action),
        }
        self._servers: list[Any] = []
        try:
            for kind, action_type, execute in (
                ("move", action_msgs.MOVE, self._move),
                ("grasp", action_msgs.GRASP, self._grasp),
                ("homing", action_msgs.HOMING, self._homing),
                ("gripper_command", action_msgs.GRIPPER_COMMAND, self._gripper_command),
            ):
                self._servers.append(ActionServer(bridge, self.actions[kind], action_type, execute))
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        for server in self._servers:
            server.close()
        self._servers = []

    def _move(self, handle: Any) -> None:
        width = float(handle.goal.width)
        self._franka_motion(handle, self._msgs.MOVE, width, grasp=None)

    def _homing(self, handle: Any) -> None:
        self._franka_motion(handle, self._msgs.HOMING, 2 * self.open, grasp=None)

    def _grasp(self, handle: Any) -> None:
        goal = handle.goal
        width = float(goal.width)
        self._franka_motion(handle, self._msgs.GRASP, width, grasp=(goal.epsilon.inner, goal.epsilon.outer))

    def _franka_motion(self, handle: Any, action_type: Any, width: float, grasp: tuple[float, float] | None) -> None:
        Result = action_type.Result
        if not (math.isfinite(width) and 2 * self.low - 1e-9 <= width <= 2 * self.high + 1e-9):
            handle.abort(Result(success=False, error=f"width {width} m is outside {2 * self.low}..{2 * self.high} m"))
            return
        outcome, opening = self._drive(handle, width / 2, feedback=None)
        reached = 2 * opening
        if outcome == "canceled":
            handle.canceled(Result(success=False, error="canceled"))
        elif grasp is not None and outcome in ("reached", "stalled"):
            inner, outer = grasp
            if width - inner <= reached <= width + outer:
                handle.succeed(Result(success=True))
            else:
                handle.abort(
                    Result(
                        success=False,
                        error=f"grasped at width {reached:.4f} m, outside {width - inner:.4f}..{width + outer:.4f} m",
                    )
                )
        elif outcome == "reached":
            handle.succeed(Result(success=True))
        else:
            handle.abort(Result(success=False, error=f"{outcome} at width {reached:.4f} m, asked {width:.4f} m"))

    def _gripper_command(self, handle: Any) -> None:
        msgs = self._msgs
        position = float(handle.goal.command.position)
        if not (math.isfinite(position) and self.low - 1e-9 <= position <= self.high + 1e-9):
            handle.abort(msgs.GripperCommand_Result(position=self._opening()))
            return

        def feedback(opening: float) -> None:
            handle.publish_feedback(msgs.GripperCommand_Feedback(position=opening))

        outcome, opening = self._drive(handle, position, feedback)
        result = msgs.GripperCommand_Result(
            position=opening, stalled=outcome == "stalled", reached_goal=outcome == "reached"
        )
        if outcome in ("reached", "stalled"):
            handle.succeed(result)
        elif outcome == "canceled":
            handle.canceled(result)
        else:
            handle.abort(result)

    def _drive(self, handle: Any, target: float, feedback: Callable[[float], None] | None) -> tuple[str, float]:
        """Set the target, then watch the opening: reached, stalled, canceled, preempted or timeout."""
        with self._lock:  # the target is set under the lock: an older goal's cancel never overwrites a newer target
            self._generation += 1
            mine = self._generation
            self._set_target(min(max(target, self.low), self.high))
        start = last_moved_at = time.monotonic()
        last = opening = self._opening()
        while True:
            now = time.monotonic()
            if abs(opening - target) <= self.tolerance:
                return "reached", opening
            if self._generation != mine or not handle.is_active:  # first: a newer goal owns the target now
                return "preempted", opening
            if handle.is_cancel_requested:
                with self._lock:
                    if self._generation == mine:
                        self._set_target(min(max(opening, self.low), self.high))
                return "canceled", opening
            if abs(opening - last) > self.stall_distance:
                last, last_moved_at = opening, now
            elif now - last_moved_at >= self.stall_time:
                return "stalled", opening
            if now - start >= self.goal_timeout:
                return "timeout", opening
            if feedback is not None:
                feedback(opening)
            time.sleep(self.period)
            opening = self._opening()

    def _opening(self) -> float:
        opening = float(self._read_opening())
        if not math.isfinite(opening):
            raise ValueError(f"the twin's finger opening is not finite: {opening!r}")
        return opening
