"""ROS 2 actions over Cyclone DDS: a client and a server built on `services.py`, speaking to rclcpp and rclpy
action servers and clients that run rmw_cyclonedds_cpp.

    client = ActionClient(bridge, "/franka_gripper/move", MOVE)
    goal = client.send_goal(Move_Goal(width=0.08, speed=0.1), timeout=1.0)   # GoalRejectedError, ActionTimeoutError
    outcome = goal.get_result(timeout=5.0)                                   # GoalResult(status, result)

An action `/a` is (rcl_action's names and QoS, rcl_action/src/rcl_action/names.c and default options):
services `/a/_action/send_goal`, `/a/_action/cancel_goal`, `/a/_action/get_result` (services' default QoS) and
topics `/a/_action/feedback` (reliable, volatile, depth 10) and `/a/_action/status` (reliable, transient-local,
depth 1; the server publishes every goal it knows, action_msgs/GoalStatusArray, whenever one changes). A client
names each goal with a random unique_identifier_msgs/UUID; send_goal answers at once (accepted or not),
get_result when the goal ends (a goal the server does not know: status unknown), cancel_goal at once with the goals
that will cancel (action_msgs/srv/CancelGoal's rules: a zero id and stamp cancels all, a stamp all goals accepted
at or before it, an id that goal). Every client call has a deadline: one that passes is an `ActionTimeoutError`
naming the action, the step and the deadline, and nothing is retried.

The server runs each accepted goal's `execute(handle)` on a thread of its own (as rclpy with a multi-threaded
executor); it ends the goal with `succeed`, `abort` or `canceled`, and publishes feedback meanwhile. Results are
kept for `result_timeout` seconds after a goal ends (rcl_action's default: 15 minutes).
"""

# No `from __future__ import annotations` here, as in services.py.

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from robotrl.hardware.ros2._deps import require_cyclonedds
from robotrl.hardware.ros2.bridge import Bridge, OnReceived, Received
from robotrl.hardware.ros2.names import full_topic_name
from robotrl.hardware.ros2.qos import Durability, QoSProfile

require_cyclonedds()

from robotrl.hardware.ros2.action_msgs import (  # noqa: E402
    CANCEL_ERROR_GOAL_TERMINATED,
    CANCEL_ERROR_NONE,
    CANCEL_ERROR_REJECTED,
    CANCEL_ERROR_UNKNOWN_GOAL_ID,
    CANCEL_GOAL,
    STATUS_ABORTED,
    STATUS_ACCEPTED,
    STATUS_CANCELED,
    STATUS_CANCELING,
    STATUS_EXECUTING,
    STATUS_NAMES,
    STATUS_SUCCEEDED,
    STATUS_UNKNOWN,
    TERMINAL_STATUSES,
    UUID,
    ActionType,
    CancelGoal_Request,
    CancelGoal_Response,
    GoalInfo,
    GoalStatus,
    GoalStatusArray,
    uuid_of,
)
from robotrl.hardware.ros2.msgs import Time  # noqa: E402
from robotrl.hardware.ros2.services import (  # noqa: E402
    PendingCall,
    RequestId,
    ServiceClient,
    ServiceServer,
    ServiceTimeoutError,
    check_deadline,
)

log = logging.getLogger(__name__)

FEEDBACK_QOS = QoSProfile(depth=10)
"""rmw_qos_profile_default, rcl_action's feedback topic."""
STATUS_QOS = QoSProfile(depth=1, durability=Durability.TRANSIENT_LOCAL)
"""rcl_action_qos_profile_status_default: reliable, transient local, keep last 1."""
RESULT_TIMEOUT = 900.0  # seconds a server keeps a finished goal's result (rcl_action's default)


def action_names(action: str) -> dict[str, str]:
    """The ROS 2 names of an action's services and topics: send_goal, cancel_goal, get_result, feedback, status."""
    name = full_topic_name(action)
    return {part: f"{name}/_action/{part}" for part in ("send_goal", "cancel_goal", "get_result", "feedback", "status")}


class ActionTimeoutError(TimeoutError):
    """An action's server did not answer one step (`send_goal`, `get_result`, `cancel_goal`) within its deadline."""

    def __init__(self, action: str, step: str, timeout: float, server_matched: bool):
        self.action, self.step, self.timeout, self.server_matched = action, step, timeout, server_matched
        why = "its server was matched but did not answer" if server_matched else "no server for it was matched"
        super().__init__(f"action {action}: {step} was not answered within its deadline of {timeout:g} s ({why})")


class GoalRejectedError(RuntimeError):
    """The action server refused the goal."""

    def __init__(self, action: str, goal: Any):
        self.action, self.goal = action, goal
        super().__init__(f"action {action} rejected the goal {goal!r}")


@dataclass(frozen=True)
class GoalResult:
    status: int  # action_msgs/GoalStatus: STATUS_SUCCEEDED, STATUS_CANCELED, STATUS_ABORTED (STATUS_UNKNOWN: expired)
    result: Any

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, str(self.status))


class ActionCall:
    """One step of an action in flight (send_goal, get_result, cancel_goal): `done()` never blocks, `wait()` does
    until the answer or the deadline, `result()` gives the step's value or raises `ActionTimeoutError`."""

    def __init__(
        self,
        pending: PendingCall,
        action: str,
        step: str,
        convert: Callable[[Any], Any],
        on_timeout: Callable[[], None] | None = None,
    ):
        self._pending, self.action, self.step, self._convert = pending, action, step, convert
        self._on_timeout = on_timeout

    @property
    def deadline(self) -> float:
        return self._pending.deadline

    def done(self) -> bool:
        return self._pending.done()

    def answered(self) -> bool:
        return self._pending.answered()

    def wait(self, timeout: float | None = None) -> bool:
        return self._pending.wait(timeout)

    def result(self) -> Any:
        try:
            response = self._pending.result()
        except ServiceTimeoutError as error:
            if self._on_timeout is not None:
                self._on_timeout()
            raise ActionTimeoutError(self.action, self.step, error.timeout, error.server_matched) from None
        return self._convert(response)


class ClientGoalHandle:
    """A goal the server accepted: its id, its latest status and feedback (from the action's topics), its result
    and cancellation."""

    def __init__(self, client: "ActionClient", goal_id: bytes, goal: Any, accepted_stamp: Time):
        self.client, self.goal_id, self.goal, self.accepted_stamp = client, goal_id, goal, accepted_stamp
        self.status = STATUS_ACCEPTED
        self.feedback: Any = None
        self.feedback_count = 0

    @property
    def action(self) -> str:
        return self.client.action

    def get_result_async(self, timeout: float) -> ActionCall:
        request = self.client.action_type.GetResult.Request(goal_id=UUID(uuid=self.goal_id))
        pending = self.client._get_result.call_async(request, timeout)
        return ActionCall(pending, self.action, "get_result", self._take_result)

    def get_result(self, timeout: float) -> GoalResult:
        """The goal's outcome once it ends, within `timeout` seconds (ActionTimeoutError otherwise)."""
        call = self.get_result_async(timeout)
        call.wait()
        return call.result()

    def cancel_async(self, timeout: float) -> ActionCall:
        return self.client.cancel_goals_async(timeout, goal_id=self.goal_id)

    def cancel(self, timeout: float) -> CancelGoal_Response:
        """Ask the server to cancel this goal; its answer (`return_code`, `goals_canceling`)."""
        call = self.cancel_async(timeout)
        call.wait()
        return call.result()

    def _take_result(self, response: Any) -> GoalResult:
        if response.status != STATUS_UNKNOWN:
            self.status = response.status
        return GoalResult(response.status, response.result)


class ActionClient:
    """Sends goals to one ROS 2 action server over the dds backend (module docstring)."""

    def __init__(self, bridge: Bridge, action: str, action_type: ActionType):
        if not isinstance(action_type, ActionType):
            raise TypeError(f"an ActionType (hardware/ros2/action_msgs.py) is needed, got {action_type!r}")
        names = action_names(action)
        self.action = full_topic_name(action)
        self.action_type = action_type
        self._bridge = bridge
        self._send_goal = ServiceClient(bridge, names["send_goal"], action_type.SendGoal)
        self._get_result = ServiceClient(bridge, names["get_result"], action_type.GetResult)
        self._cancel_goal = ServiceClient(bridge, names["cancel_goal"], CANCEL_GOAL)
        self._lock = threading.Lock()
        self._goals: dict[bytes, ClientGoalHandle] = {}
        self._feedback = bridge.dds_subscription(
            _dds_topic(names["feedback"]), action_type.FeedbackMessage, FEEDBACK_QOS, OnReceived(self._on_feedback)
        )
        self._status = bridge.dds_subscription(
            _dds_topic(names["status"]), GoalStatusArray, STATUS_QOS, OnReceived(self._on_status)
        )
        self._closed = False

    def server_ready(self) -> bool:
        """Its three services are matched and its feedback and status publishers too (rcl_action's
        `rcl_action_server_is_available`)."""
        services = (self._send_goal, self._get_result, self._cancel_goal)
        topics = (self._feedback, self._status)
        return all(s.server_ready() for s in services) and all(t.publisher_count() > 0 for t in topics)

    def wait_for_server(self, timeout: float) -> bool:
        deadline = time.monotonic() + check_deadline(timeout, self.action)
        while not self.server_ready():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    @property
    def last_answer_at(self) -> float | None:
        """time.monotonic() of the server's latest answer to any of this client's requests."""
        times = [c.last_answer_at for c in (self._send_goal, self._get_result, self._cancel_goal)]
        return max((t for t in times if t is not None), default=None)

    def send_goal_async(self, goal: Any, timeout: float, goal_id: bytes | None = None) -> ActionCall:
        """Send `goal` and return at once; the call's `result()` is the accepted goal's handle, or raises
        `GoalRejectedError`, or `ActionTimeoutError` when the server did not answer within `timeout`."""
        self._check_open()
        if not isinstance(goal, self.action_type.Goal):
            raise TypeError(f"action {self.action} takes {self.action_type.Goal.__name__}, got {type(goal).__name__}")
        goal_id = uuid.uuid4().bytes if goal_id is None else uuid_of(goal_id)
        request = self.action_type.SendGoal.Request(goal_id=UUID(uuid=goal_id), goal=goal)
        # tracked from now: a server may publish feedback and status before its answer is read here
        handle = ClientGoalHandle(self, goal_id, goal, Time())
        with self._lock:
            self._goals[goal_id] = handle
        pending = self._send_goal.call_async(request, timeout)

        def accepted(response: Any) -> ClientGoalHandle:
            if not response.accepted:
                self.forget(handle)
                raise GoalRejectedError(self.action, goal)
            handle.accepted_stamp = response.stamp
            return handle

        return ActionCall(pending, self.action, "send_goal", accepted, lambda: self.forget(handle))

    def send_goal(self, goal: Any, timeout: float) -> ClientGoalHandle:
        """Send `goal` and wait (at most `timeout` seconds) for the server to accept it."""
        call = self.send_goal_async(goal, timeout)
        call.wait()
        return call.result()

    def cancel_goals_async(
        self, timeout: float, goal_id: bytes | None = None, before: Time | None = None
    ) -> ActionCall:
        """Ask the server to cancel the goal `goal_id`, or every goal accepted at or before `before`, or (neither
        given) every goal; the call's `result()` is the CancelGoal response."""
        self._check_open()
        info = GoalInfo(
            goal_id=UUID(uuid=bytes(16) if goal_id is None else uuid_of(goal_id)),
            stamp=Time() if before is None else before,
        )
        pending = self._cancel_goal.call_async(CancelGoal_Request(goal_info=info), timeout)
        return ActionCall(pending, self.action, "cancel_goal", lambda response: response)

    def forget(self, handle: ClientGoalHandle) -> None:
        """Stop tracking a finished goal's status and feedback."""
        with self._lock:
            self._goals.pop(handle.goal_id, None)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in (self._send_goal, self._get_result, self._cancel_goal):
            client.close()
        for subscription in (self._feedback, self._status):
            self._bridge.close_dds_endpoint(subscription)

    def _on_feedback(self, received: Received) -> None:
        message = received.msg
        with self._lock:
            handle = self._goals.get(bytes(message.goal_id.uuid))
        if handle is not None:
            handle.feedback = message.feedback
            handle.feedback_count += 1

    def _on_status(self, received: Received) -> None:
        with self._lock:
            for status in received.msg.status_list:
                handle = self._goals.get(bytes(status.goal_info.goal_id.uuid))
                if handle is not None:
                    handle.status = status.status

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the client of action {self.action} is closed")


class ServerGoalHandle:
    """An accepted goal on the server: `execute` reads `goal`, publishes feedback, watches `is_cancel_requested`
    and ends it with `succeed`, `abort` or `canceled` (each with a result, or the result type's defaults)."""

    def __init__(self, server: "ActionServer", goal_id: bytes, goal: Any, stamp: Time):
        self.server, self.goal_id, self.goal, self.stamp = server, goal_id, goal, stamp
        self.status = STATUS_ACCEPTED
        self.result: Any = None
        self.ended_at: float | None = None
        self._waiting: list[RequestId] = []  # get_result requests to answer when the goal ends

    @property
    def is_active(self) -> bool:
        return self.status not in TERMINAL_STATUSES

    @property
    def is_cancel_requested(self) -> bool:
        return self.status == STATUS_CANCELING

    def publish_feedback(self, feedback: Any) -> None:
        self.server._publish_feedback(self, feedback)

    def succeed(self, result: Any = None) -> None:
        self.server._end(self, STATUS_SUCCEEDED, result)

    def abort(self, result: Any = None) -> None:
        self.server._end(self, STATUS_ABORTED, result)

    def canceled(self, result: Any = None) -> None:
        self.server._end(self, STATUS_CANCELED, result)


class ActionServer:
    """Serves one ROS 2 action over the dds backend (module docstring). `goal_callback(goal)` says whether to
    accept a goal (all, by default) and `cancel_callback(handle)` whether to cancel one (all, by default); both
    run on the bridge's receive thread, so keep them short. `execute(handle)` runs per accepted goal on its own
    thread; a goal it leaves unended, or that raises, is aborted (and logged)."""

    def __init__(
        self,
        bridge: Bridge,
        action: str,
        action_type: ActionType,
        execute: Callable[[ServerGoalHandle], None],
        goal_callback: Callable[[Any], bool] | None = None,
        cancel_callback: Callable[[ServerGoalHandle], bool] | None = None,
        result_timeout: float = RESULT_TIMEOUT,
    ):
        if not isinstance(action_type, ActionType):
            raise TypeError(f"an ActionType (hardware/ros2/action_msgs.py) is needed, got {action_type!r}")
        for name, function in (
            ("execute", execute),
            ("goal_callback", goal_callback),
            ("cancel_callback", cancel_callback),
        ):
            if function is not None and not callable(function):
                raise TypeError(f"{name} of action {action} must be callable, got {function!r}")
        names = action_names(action)
        self.action = full_topic_name(action)
        self.action_type = action_type
        self.result_timeout = check_deadline(result_timeout, self.action)
        self._execute = execute
        self._goal_callback = goal_callback or (lambda goal: True)
        self._cancel_callback = cancel_callback or (lambda handle: True)
        self._bridge = bridge
        self._lock = threading.RLock()
        self._goals: dict[bytes, ServerGoalHandle] = {}
        self._closed = False
        self.stats = {"goals": 0, "accepted": 0, "rejected": 0, "cancel_requests": 0}
        self._status_pub = bridge.dds_publisher(_dds_topic(names["status"]), GoalStatusArray, STATUS_QOS)
        self._feedback_pub = bridge.dds_publisher(
            _dds_topic(names["feedback"]), action_type.FeedbackMessage, FEEDBACK_QOS
        )
        self._services = [
            ServiceServer(bridge, names["send_goal"], action_type.SendGoal, self._on_send_goal),
            ServiceServer(bridge, names["get_result"], action_type.GetResult, self._on_get_result),
            ServiceServer(bridge, names["cancel_goal"], CANCEL_GOAL, self._on_cancel_goal),
        ]
        self._get_result_server = self._services[1]

    def goals(self) -> list[ServerGoalHandle]:
        with self._lock:
            return list(self._goals.values())

    def close(self) -> None:
        """Stop serving: goals still running are aborted (their threads see `is_active` False)."""
        with self._lock:
            if self._closed:
                return
            for handle in self._goals.values():
                if handle.is_active:
                    handle.status = STATUS_ABORTED
            self._publish_status()
            self._closed = True
        for server in self._services:
            server.close()
        for publisher in (self._status_pub, self._feedback_pub):
            self._bridge.close_dds_endpoint(publisher)

    def _on_send_goal(self, request: Any, request_id: RequestId) -> Any:
        goal_id = bytes(request.goal_id.uuid)
        self.stats["goals"] += 1
        with self._lock:
            known = goal_id in self._goals
        try:
            accepted = not known and not self._closed and bool(self._goal_callback(request.goal))
        except Exception:
            log.exception("action %s: the goal callback failed; the goal is rejected", self.action)
            accepted = False
        if known:
            log.warning("action %s: a goal with an id already known was rejected", self.action)
        stamp = _now_stamp()
        response = self.action_type.SendGoal.Response(accepted=accepted, stamp=stamp)
        if not accepted:
            self.stats["rejected"] += 1
            return response
        handle = ServerGoalHandle(self, goal_id, request.goal, stamp)
        with self._lock:
            self._goals[goal_id] = handle
            self.stats["accepted"] += 1
            self._publish_status()
        # answered before it executes (rclpy accepts, answers, then executes)
        self._services[0].reply(request_id, response)
        threading.Thread(target=self._run, args=(handle,), name=f"robotrl-action{self.action}", daemon=True).start()
        return None

    def _run(self, handle: ServerGoalHandle) -> None:
        with self._lock:
            if handle.status == STATUS_ACCEPTED:
                handle.status = STATUS_EXECUTING
                self._publish_status()
        try:
            self._execute(handle)
        except Exception:
            log.exception("action %s: executing a goal failed; the goal is aborted", self.action)
        if handle.is_active:
            log.warning("action %s: execute returned without ending its goal; the goal is aborted", self.action)
            self._end(handle, STATUS_ABORTED, None)

    def _on_get_result(self, request: Any, request_id: RequestId) -> Any:
        goal_id = bytes(request.goal_id.uuid)
        with self._lock:
            handle = self._goals.get(goal_id)
            if handle is None:
                return self.action_type.GetResult.Response(status=STATUS_UNKNOWN, result=self.action_type.Result())
            if handle.is_active:
                handle._waiting.append(request_id)
                return None
            return self.action_type.GetResult.Response(status=handle.status, result=handle.result)

    def _on_cancel_goal(self, request: CancelGoal_Request, request_id: RequestId) -> CancelGoal_Response:
        self.stats["cancel_requests"] += 1
        goal_id = bytes(request.goal_info.goal_id.uuid)
        stamp = request.goal_info.stamp
        by_id = goal_id != bytes(16)
        by_time = (stamp.sec, stamp.nanosec) != (0, 0)
        with self._lock:
            if by_id and goal_id not in self._goals:
                return CancelGoal_Response(return_code=CANCEL_ERROR_UNKNOWN_GOAL_ID)
            if by_id and not by_time and not self._goals[goal_id].is_active:
                return CancelGoal_Response(return_code=CANCEL_ERROR_GOAL_TERMINATED)
            chosen = [
                handle
                for handle in self._goals.values()
                if handle.is_active
                and (
                    (by_id and handle.goal_id == goal_id)
                    or (by_time and _stamp_key(handle.stamp) <= _stamp_key(stamp))
                    or (not by_id and not by_time)
                )
            ]
        canceling = []
        for handle in chosen:
            try:
                agreed = bool(self._cancel_callback(handle))
            except Exception:
                log.exception("action %s: the cancel callback failed; the goal is not canceled", self.action)
                agreed = False
            if agreed:
                canceling.append(handle)
        with self._lock:
            canceling = [h for h in canceling if h.is_active]
            for handle in canceling:
                handle.status = STATUS_CANCELING
            if canceling:
                self._publish_status()
        if chosen and not canceling:
            return CancelGoal_Response(return_code=CANCEL_ERROR_REJECTED)
        infos = [GoalInfo(goal_id=UUID(uuid=h.goal_id), stamp=h.stamp) for h in canceling]
        return CancelGoal_Response(return_code=CANCEL_ERROR_NONE, goals_canceling=infos)

    def _publish_feedback(self, handle: ServerGoalHandle, feedback: Any) -> None:
        if not isinstance(feedback, self.action_type.Feedback):
            raise TypeError(
                f"action {self.action} publishes {self.action_type.Feedback.__name__}, got {type(feedback).__name__}"
            )
        if self._closed or not handle.is_active:
            return
        self._feedback_pub.publish(
            self.action_type.FeedbackMessage(goal_id=UUID(uuid=handle.goal_id), feedback=feedback)
        )

    def _end(self, handle: ServerGoalHandle, status: int, result: Any) -> None:
        if result is None:
            result = self.action_type.Result()
        if not isinstance(result, self.action_type.Result):
            raise TypeError(
                f"action {self.action} returns {self.action_type.Result.__name__}, got {type(result).__name__}"
            )
        with self._lock:
            if not handle.is_active:
                if self._closed:
                    return  # aborted by close(); the execute thread ends it again
                raise RuntimeError(
                    f"action {self.action}: the goal already ended ({STATUS_NAMES[handle.status]}), cannot end it "
                    f"as {STATUS_NAMES[status]}"
                )
            handle.status, handle.result, handle.ended_at = status, result, time.monotonic()
            waiting, handle._waiting = handle._waiting, []
            self._publish_status()
        response = self.action_type.GetResult.Response(status=status, result=result)
        for request_id in waiting:
            self._get_result_server.reply(request_id, response)

    def _publish_status(self) -> None:
        """Every goal's status (called under the lock); results older than `result_timeout` are dropped first."""
        if self._closed:
            return
        now = time.monotonic()
        expired = [
            goal_id
            for goal_id, handle in self._goals.items()
            if handle.ended_at is not None and now - handle.ended_at > self.result_timeout
        ]
        for goal_id in expired:
            del self._goals[goal_id]
        statuses = [
            GoalStatus(goal_info=GoalInfo(goal_id=UUID(uuid=h.goal_id), stamp=h.stamp), status=h.status)
            for h in self._goals.values()
        ]
        self._status_pub.publish(GoalStatusArray(status_list=statuses))


def _dds_topic(topic: str) -> str:
    return "rt" + full_topic_name(topic)


def _now_stamp() -> Time:
    now = time.time_ns()
    return Time(sec=now // 1_000_000_000, nanosec=now % 1_000_000_000)


def _stamp_key(stamp: Time) -> tuple[int, int]:
    return (stamp.sec, stamp.nanosec)
