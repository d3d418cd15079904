"""A gripper commanded through ROS 2 actions: franka_gripper's Move and Grasp (`franka_action`) or any
control_msgs/action/GripperCommand server (`gripper_command`), as an alternative to the ros2_control topic a
forward controller reads (`topic`, the default, in robot_link.py).

    gripper = GripperActionClient(bridge, GripperActionConfig(interface="franka_action"), spec.gripper)
    gripper.send(safe.gripper)        # the shield's setpoint, metres per finger; never blocks
    gripper.poll()                    # once per control period: advances the goal in flight, never blocks
    gripper.stats                     # goals sent, succeeded, failed, rejected, timeouts, holds, state
    gripper.close()

Setpoints are metres of one finger's opening (the robot spec's `gripper.open`/`closed`, as `SafeCommand.gripper`
gives them). franka_action sends a width of twice that: a Grasp (the spec's speed, force and epsilons) when the
setpoint closes from the last one sent, a Move when it opens or stays (before any, closing means below `open`).
gripper_command sends the setpoint itself as `command.position` (franka_gripper's gripper_action reads it per
finger, as ros2_control's gripper controllers read a finger joint) with `max_effort`.

One goal at a time. A setpoint that comes while a goal is in flight waits, and only the newest waiting one is kept
(a queue of one, latest wins): a gripper goal takes most of a second and a policy writes a setpoint every period,
so cancelling on each one would stop the fingers over and over. A setpoint within `tolerance` of the last one
sent sends nothing (nor does one after a goal that failed, until it changes: no retry loop).

Deadlines: the server must accept a goal within `accept_timeout` and finish it within `result_timeout`. When one
passes, it is counted (`accept_timeouts`, `result_timeouts`), logged once, the overdue goal is cancelled, and the
gripper is held: no new goal goes out until the server answers again. While held, the client asks the server every
`probe_interval` seconds to cancel that goal (a cancel moves nothing); the first answer to anything ends the hold
and the newest setpoint is sent if it differs from the overdue goal's. The same setpoint goes again only after an
accept timeout (that goal never ran), and only once: a server that accepts goals but never ends them, or that
answers cancels but not goals, is not sent the same goal over and over. So a server that went away costs one log
line and a cancel per `probe_interval`, not a goal per period forever.

`cancel()` stops the fingers where they are (robot_link.py calls it when the shield latches: an e-stop): the goal in
flight is cancelled without waiting (again once the server accepts it, should the cancel have overtaken the goal)
and the waiting setpoint is dropped, so nothing goes out until `send` gives a new one, which is sent even if it
equals the cancelled goal's. A goal that ends cancelled after `cancel()` is counted in `canceled`, not `failed`.

The settings a robot config carries (`hardware.gripper_actions`) are `GripperActionSettings`; `GripperActionConfig`
adds the interface (`hardware.gripper_interface`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, fields
from typing import Any

from robotrl.hardware.ros2.bridge import Bridge
from robotrl.hardware.ros2.names import full_topic_name

from robotrl.core.robot_spec import GripperSpec

log = logging.getLogger(__name__)

GRIPPER_INTERFACES = ("topic", "franka_action", "gripper_command")
"""`hardware.gripper_interface`: the ros2_control forward controller's topic (robot_link.py), franka_gripper's
Move/Grasp actions, or a control_msgs GripperCommand action."""
ACTION_INTERFACES = ("franka_action", "gripper_command")
LOG_EVERY = 5.0  # seconds between two log lines about rejected or failed goals (the rest are counted)


@dataclass
class GripperActionSettings:
    """The action interfaces' names, deadlines and goal parameters: `hardware.gripper_actions` in a robot config
    (not frozen: Hydra merges a config into it)."""

    action_namespace: str = "/franka_gripper"  # franka_action: <namespace>/move and <namespace>/grasp
    gripper_command_action: str = "/franka_gripper/gripper_action"  # gripper_command: the action's name
    accept_timeout: float = 1.0  # s for the server to accept (or reject) a goal
    result_timeout: float = 5.0  # s from acceptance for the goal to end
    probe_interval: float = 1.0  # s between two cancel requests while a silent server holds the gripper
    tolerance: float = 0.001  # m per finger: a setpoint this close to the last one sent sends nothing
    speed: float = 0.1  # m/s of the width (franka Move and Grasp)
    force: float = 20.0  # N (franka Grasp)
    epsilon_inner: float = 0.005  # m: a grasp succeeds with a width down to width - inner...
    epsilon_outer: float = 0.08  # m: ... and up to width + outer (wide: closing on any object is a success)
    max_effort: float = 20.0  # N (GripperCommand's max_effort)

    def validate(self, key: str | None = None) -> None:
        """ValueError naming the bad setting, as `<key>.<setting>` (`hardware.gripper_actions`) when `key` is given."""

        def name(setting: str) -> str:
            return f"{key}.{setting}" if key else f"gripper action setting {setting}"

        for setting in ("action_namespace", "gripper_command_action"):
            try:
                full_topic_name(getattr(self, setting))
            except (TypeError, ValueError) as error:
                raise ValueError(f"{name(setting)}: {error}") from None
        for f in fields(GripperActionSettings):
            value = getattr(self, f.name)
            if f.type != "float":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name(f.name)} must be a finite number, got {value!r}")
            positive = f.name not in ("tolerance", "epsilon_inner", "epsilon_outer")
            if value < 0 or (positive and value == 0):
                raise ValueError(f"{name(f.name)} must be {'> 0' if positive else '>= 0'}, got {value!r}")


@dataclass
class GripperActionConfig(GripperActionSettings):
    """The settings and the interface: what `GripperActionClient` takes."""

    interface: str = "franka_action"  # franka_action | gripper_command

    def validate(self, key: str | None = None) -> None:
        if self.interface not in ACTION_INTERFACES:
            raise ValueError(
                f"gripper interface must be one of {', '.join(map(repr, ACTION_INTERFACES))} for an action client, "
                f"got {self.interface!r}"
            )
        super().validate(key)


@dataclass
class _Hold:
    since: float
    accepted: bool  # the overdue goal was accepted (a result timeout), or never answered (an accept timeout)
    client: Any  # the ActionClient whose goal went overdue
    goal_id: bytes
    probe: Any = None  # the cancel request in flight (an ActionCall), or None between two
    next_probe_at: float = 0.0


class GripperActionClient:
    """Turns gripper setpoints into action goals (module docstring). `send` and `poll` never block: call `poll`
    once per control period (robot_link's control thread) and `send` with each new setpoint. Thread-safe."""

    def __init__(
        self,
        bridge: Bridge,
        config: GripperActionConfig,
        gripper: GripperSpec,
    ):
        # the action modules need cyclonedds (the ros extra), as the bridge does
        from robotrl.hardware.ros2 import action_msgs
        from robotrl.hardware.ros2.actions import ActionClient, ActionTimeoutError, GoalRejectedError

        if not isinstance(config, GripperActionConfig):
            raise TypeError(f"config must be a GripperActionConfig, got {config!r}")
        config.validate()
        if not isinstance(gripper, GripperSpec):
            raise TypeError(f"gripper must be the robot spec's GripperSpec, got {gripper!r}")
        self.config = config
        self.low, self.high = sorted((float(gripper.closed), float(gripper.open)))
        self._open = float(gripper.open)
        self._msgs = action_msgs
        self._timeout_error, self._rejected_error = ActionTimeoutError, GoalRejectedError
        if config.interface == "franka_action":
            namespace = full_topic_name(config.action_namespace)
            self._clients = {
                "move": ActionClient(bridge, f"{namespace}/move", action_msgs.MOVE),
                "grasp": ActionClient(bridge, f"{namespace}/grasp", action_msgs.GRASP),
            }
        else:
            self._clients = {
                "gripper_command": ActionClient(bridge, config.gripper_command_action, action_msgs.GRIPPER_COMMAND)
            }
        self._lock = threading.Lock()
        self._state = "idle"  # idle | accepting | executing | holding | closed
        self._wanted: float | None = None  # the newest setpoint
        self._sent: float | None = None  # the setpoint of the last goal sent (what closing and opening refer to)
        self._resend = False  # after a hold: send the newest setpoint even if it equals the last one sent
        self._resent = False  # the goal in flight is such a resend (never resent again)
        self._cancelling = False  # cancel() asked the server to cancel the goal in flight
        self._call: Any = None  # the send_goal or get_result in flight (an ActionCall)
        self._client: Any = None  # the ActionClient of the goal in flight
        self._goal_id = b""
        self._handle: Any = None
        self._hold: _Hold | None = None
        self._last_log: dict[str, float] = {}
        self.opening: float | None = None  # metres per finger, where a GripperCommand server reports it
        self.last_error = ""
        self._counts = dict.fromkeys(
            ("setpoints", "goals_sent", "succeeded", "failed", "rejected", "accept_timeouts", "result_timeouts"), 0
        ) | {"holds": 0, "probes": 0, "recoveries": 0, "cancels": 0, "canceled": 0}

    @property
    def stats(self) -> dict[str, Any]:
        """Counts (setpoints, goals sent, succeeded, failed, rejected, accept and result timeouts, holds, probes,
        recoveries, cancels asked by `cancel()` and goals that ended canceled), the state (idle, accepting,
        executing, holding, closed), the last error and the opening."""
        with self._lock:
            return dict(self._counts, state=self._state, last_error=self.last_error, opening=self.opening)

    @property
    def holding(self) -> bool:
        return self._state == "holding"

    def send(self, setpoint: float) -> None:
        """The newest gripper setpoint (metres per finger, within the spec's closed..open); sent by `poll`."""
        try:
            value = float(setpoint)  # a number or a 0-dim tensor, as SafeCommand.gripper is
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(setpoint, (bool, str)) or not math.isfinite(value):
            raise ValueError(f"a gripper setpoint must be a finite number of metres per finger, got {setpoint!r}")
        if not self.low - 1e-9 <= value <= self.high + 1e-9:
            raise ValueError(f"gripper setpoint {value!r} m is outside the gripper's range [{self.low}, {self.high}] m")
        with self._lock:
            if self._state == "closed":
                raise RuntimeError("the gripper action client is closed")
            self._wanted = value
            self._counts["setpoints"] += 1

    def poll(self) -> str:
        """Advance the goal in flight or the hold, and send the newest setpoint when nothing is in flight.
        Returns the state afterwards."""
        with self._lock:
            if self._state == "closed":
                return self._state
            now = time.monotonic()
            if self._state == "accepting":
                self._poll_accepting(now)
            elif self._state == "executing":
                self._poll_executing()
            elif self._state == "holding":
                self._poll_holding(now)
            if self._state == "idle":
                self._start_goal()
            return self._state

    def cancel(self) -> None:
        """Stop the fingers where they are (an e-stop): cancel the goal in flight without waiting and drop the
        waiting setpoint. Nothing is sent until `send` gives a setpoint again, which then goes out even if it equals
        the cancelled goal's (the fingers stopped short of it). Never blocks."""
        with self._lock:
            if self._state == "closed":
                return
            self._wanted = self._sent = None  # where the fingers stopped is not known: the next setpoint goes out
            if self._state in ("accepting", "executing") and not self._cancelling:
                self._cancelling = True
                self._counts["cancels"] += 1
                self._client.cancel_goals_async(self.config.accept_timeout, goal_id=self._goal_id)

    def close(self) -> None:
        """Cancel a goal still in flight (without waiting) and leave the action servers."""
        with self._lock:
            if self._state == "closed":
                return
            if self._state in ("accepting", "executing"):
                try:
                    self._client.cancel_goals_async(self.config.accept_timeout, goal_id=self._goal_id)
                except Exception:  # closing must not fail on a best-effort cancel
                    log.exception("gripper: cancelling the goal in flight at close failed")
            self._state = "closed"
            for client in self._clients.values():
                client.close()

    def _start_goal(self) -> None:
        wanted = self._wanted
        if wanted is None:
            return
        unchanged = self._sent is not None and abs(wanted - self._sent) <= self.config.tolerance
        if unchanged and not self._resend:
            return
        client, goal = self._goal_for(wanted)
        self._goal_id = uuid.uuid4().bytes
        self._call = client.send_goal_async(goal, self.config.accept_timeout, goal_id=self._goal_id)
        self._resent, self._resend = self._resend and unchanged, False
        self._client, self._sent, self._handle = client, wanted, None
        self._cancelling = False
        self._counts["goals_sent"] += 1
        self._state = "accepting"

    def _goal_for(self, setpoint: float) -> tuple[Any, Any]:
        msgs, cfg = self._msgs, self.config
        if cfg.interface == "gripper_command":
            command = msgs.GripperCommand(position=setpoint, max_effort=cfg.max_effort)
            return self._clients["gripper_command"], msgs.GripperCommand_Goal(command=command)
        reference = self._open if self._sent is None else self._sent
        if setpoint < reference - cfg.tolerance:
            epsilon = msgs.GraspEpsilon(inner=cfg.epsilon_inner, outer=cfg.epsilon_outer)
            goal = msgs.Grasp_Goal(width=2 * setpoint, epsilon=epsilon, speed=cfg.speed, force=cfg.force)
            return self._clients["grasp"], goal
        return self._clients["move"], msgs.Move_Goal(width=2 * setpoint, speed=cfg.speed)

    def _poll_accepting(self, now: float) -> None:
        if not self._call.done():
            return
        try:
            self._handle = self._call.result()
        except self._rejected_error as error:
            self._counts["rejected"] += 1
            self._note("rejected", f"{error}; waiting for a new setpoint")
            self._state = "idle"
            return
        except self._timeout_error as error:
            self._counts["accept_timeouts"] += 1
            self._enter_hold(now, str(error), accepted=False)
            return
        if self._cancelling:  # the cancel may have reached the server before the goal did: ask again
            self._client.cancel_goals_async(self.config.accept_timeout, goal_id=self._goal_id)
        self._call = self._handle.get_result_async(self.config.result_timeout)
        self._state = "executing"

    def _poll_executing(self) -> None:
        feedback = self._handle.feedback
        if feedback is not None and hasattr(feedback, "position"):
            self.opening = float(feedback.position)
        if not self._call.done():
            return
        try:
            outcome = self._call.result()
        except self._timeout_error as error:
            self._counts["result_timeouts"] += 1
            self._enter_hold(time.monotonic(), str(error), accepted=True)
            return
        finally:
            self._client.forget(self._handle)
        result = outcome.result
        if hasattr(result, "position"):  # GripperCommand
            self.opening = float(result.position)
        succeeded = outcome.status == self._msgs.STATUS_SUCCEEDED and getattr(result, "success", True)
        if succeeded:
            self._counts["succeeded"] += 1
        elif self._cancelling and outcome.status == self._msgs.STATUS_CANCELED:
            self._counts["canceled"] += 1
        else:
            self._counts["failed"] += 1
            error = getattr(result, "error", "") or ""
            self._note("failed", f"gripper goal on {self._client.action} ended {outcome.status_name} {error}".strip())
        self._state = "idle"

    def _enter_hold(self, now: float, reason: str, accepted: bool) -> None:
        self._counts["holds"] += 1
        self.last_error = reason
        log.warning("gripper: %s; holding the gripper: no new goal until the server answers", reason)
        self._hold = _Hold(since=now, accepted=accepted, client=self._client, goal_id=self._goal_id)
        self._probe(now)
        self._state = "holding"

    def _probe(self, now: float) -> None:
        hold = self._hold
        hold.probe = hold.client.cancel_goals_async(self.config.accept_timeout, goal_id=hold.goal_id)
        hold.next_probe_at = now + self.config.probe_interval
        self._counts["probes"] += 1

    def _poll_holding(self, now: float) -> None:
        hold = self._hold
        answered_since = hold.client.last_answer_at is not None and hold.client.last_answer_at > hold.since
        if hold.probe is not None and hold.probe.done():
            answered_since = answered_since or hold.probe.answered()
            hold.probe = None
        if answered_since:
            self._counts["recoveries"] += 1
            log.warning(
                "gripper: %s answers again after %.1f s; the gripper takes setpoints again",
                hold.client.action,
                now - hold.since,
            )
            self._resend = not hold.accepted and not self._resent
            self._hold, self._state = None, "idle"
            return
        if hold.probe is None and now >= hold.next_probe_at:
            self._probe(now)

    def _note(self, kind: str, message: str) -> None:
        self.last_error = message
        now = time.monotonic()
        if now - self._last_log.get(kind, -math.inf) >= LOG_EVERY:
            self._last_log[kind] = now
            log.warning("gripper: %s (%d %s so far)", message, self._counts[kind], kind)
