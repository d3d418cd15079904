"""ROS 2 services and actions over Cyclone DDS (hardware/ros2/services.py, actions.py), the CDR bytes of their
types against rosbags, the gripper action client (hardware/gripper_actions.py) and the twin's gripper server
(hardware/twin_gripper_server.py). DDS runs on loopback in this process, on domains 224-228, which no other test
uses."""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
import types
import typing
import uuid

import numpy as np
import pytest

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
pytest.importorskip("rosbags", reason='needs the ros extra: pip install "robotrl[ros]"')

from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import array, sequence
from helpers import wait_until
from robotrl.hardware.gripper_actions import GripperActionClient, GripperActionConfig
from robotrl.hardware.ros2 import action_msgs as am
from robotrl.hardware.ros2 import make_bridge
from robotrl.hardware.ros2.actions import (
    ActionClient,
    ActionServer,
    ActionTimeoutError,
    ClientGoalHandle,
    GoalRejectedError,
    action_names,
)
from robotrl.hardware.ros2.msgs import MESSAGE_TYPES, Time
from robotrl.hardware.ros2.services import (
    SERVICES_DEFAULT,
    ServiceClient,
    ServiceServer,
    reply_topic,
    request_topic,
    sample_type,
    wrap,
)
from robotrl.hardware.twin_gripper_server import TwinGripperServer
from rosbags.interfaces import Nodetype
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from robotrl.core.robot_spec import load_robot_spec

CDR_LE_HEADER = b"\x00\x01\x00\x00"
GRIPPER = load_robot_spec("panda").gripper  # open 0.04, closed 0.0 metres per finger
MESSAGES_PER_TYPE = 20

# rosbags' ROS 2 stores ship action_msgs' messages and unique_identifier_msgs/UUID, but no service types, no
# action types and neither control_msgs nor franka_msgs: those are registered here from their definitions
# (control_msgs/msg/GripperCommand.msg and action/GripperCommand.action from ros-controls/control_msgs,
# franka_msgs' Move/Grasp/Homing.action and GraspEpsilon.msg from frankaemika/franka_ros2,
# action_msgs/srv/CancelGoal.srv from ros2/rcl_interfaces) with rosbags' own .msg parser.
MESSAGE_DEFINITIONS = {
    "control_msgs/msg/GripperCommand": "float64 position\nfloat64 max_effort",
    "franka_msgs/msg/GraspEpsilon": "float64 inner\nfloat64 outer",
    "action_msgs/srv/CancelGoal_Request": "action_msgs/GoalInfo goal_info",
    "action_msgs/srv/CancelGoal_Response": (
        "int8 ERROR_NONE=0\nint8 ERROR_REJECTED=1\nint8 ERROR_UNKNOWN_GOAL_ID=2\nint8 ERROR_GOAL_TERMINATED=3\n"
        "int8 return_code\naction_msgs/GoalInfo[] goals_canceling"
    ),
}
ACTION_DEFINITIONS = {
    "control_msgs/action/GripperCommand": (
        "control_msgs/GripperCommand command\n---\nfloat64 position\nfloat64 effort\nbool stalled\nbool reached_goal\n"
        "---\nfloat64 position\nfloat64 effort\nbool stalled\nbool reached_goal"
    ),
    "franka_msgs/action/Move": "float64 width\nfloat64 speed\n---\nbool success\nstring error\n---",
    "franka_msgs/action/Grasp": (
        "float64 width\nfranka_msgs/GraspEpsilon epsilon\nfloat64 speed\nfloat64 force\n---\nbool success\n"
        "string error\n---"
    ),
    "franka_msgs/action/Homing": "---\nbool success\nstring error\n---",
}
IN_ROSBAGS = {
    "unique_identifier_msgs/msg/UUID",
    "action_msgs/msg/GoalInfo",
    "action_msgs/msg/GoalStatus",
    "action_msgs/msg/GoalStatusArray",
}


def _action_definitions(name: str, text: str) -> dict[str, str]:
    """The messages rosidl derives from an .action file (rosidl_adapter's action conventions)."""
    goal, result, feedback = (part.strip() for part in ("\n" + text + "\n").split("\n---\n"))
    return {
        f"{name}_Goal": goal,
        f"{name}_Result": result,
        f"{name}_Feedback": feedback,
        f"{name}_SendGoal_Request": f"unique_identifier_msgs/UUID goal_id\n{name}_Goal goal",
        f"{name}_SendGoal_Response": "bool accepted\nbuiltin_interfaces/Time stamp",
        f"{name}_GetResult_Request": "unique_identifier_msgs/UUID goal_id",
        f"{name}_GetResult_Response": f"int8 status\n{name}_Result result",
        f"{name}_FeedbackMessage": f"unique_identifier_msgs/UUID goal_id\n{name}_Feedback feedback",
    }


def _store(which: Stores):
    store = get_typestore(which)  # a fresh store each call: nothing registered leaks into other tests
    assert IN_ROSBAGS <= set(store.fielddefs)
    definitions = dict(MESSAGE_DEFINITIONS)
    for name, text in ACTION_DEFINITIONS.items():
        definitions |= _action_definitions(name, text)
    assert not set(definitions) & set(store.fielddefs), "rosbags ships these now: compare against its own"
    registered = {}
    for name, text in definitions.items():
        # rosbags files a name outside msg/ and action/ under msg/ (action_msgs/srv/msg/CancelGoal_Request)
        (definition,) = get_types_from_msg(text, name).values()
        registered[name] = definition
    store.register(registered)
    return store


STORES = {"humble": _store(Stores.ROS2_HUMBLE), "jazzy": _store(Stores.ROS2_JAZZY)}
OUR_NAMES = {cls: name for name, cls in {**MESSAGE_TYPES, **am.INTERFACE_TYPES}.items()}


def test_every_interface_type_has_a_rosbags_definition():
    for store in STORES.values():
        assert set(am.INTERFACE_TYPES) <= set(store.fielddefs)
    assert len(am.INTERFACE_TYPES) == len(IN_ROSBAGS) + len(MESSAGE_DEFINITIONS) + 8 * len(ACTION_DEFINITIONS)


def _our_schema(cls: type) -> list[tuple[str, tuple]]:
    def kind(hint: typing.Any) -> tuple:
        if isinstance(hint, type) and issubclass(hint, IdlStruct):
            return (Nodetype.NAME, OUR_NAMES[hint])
        if hint is str:
            return (Nodetype.BASE, ("string", 0))
        if hint is bool:
            return (Nodetype.BASE, ("bool", 0))
        _, marker = typing.get_args(hint)
        if isinstance(marker, str):
            return (Nodetype.BASE, (marker, 0))
        if isinstance(marker, array):
            return (Nodetype.ARRAY, (kind(marker.subtype), marker.length))
        assert isinstance(marker, sequence)
        return (Nodetype.SEQUENCE, (kind(marker.subtype), marker.max_length or 0))

    hints = typing.get_type_hints(cls, include_extras=True)
    return [(name, kind(hints[name])) for name in am.struct_fields(cls)]


@pytest.mark.parametrize("store", sorted(STORES))
@pytest.mark.parametrize("ros_name", sorted(am.INTERFACE_TYPES))
def test_layout_and_type_name_match_ros2(ros_name, store):
    cls = am.INTERFACE_TYPES[ros_name]
    package, kind, name = ros_name.split("/")
    assert cls.__idl__.idl_transformed_typename == f"{package}::{kind}::dds_::{name}_"
    assert _our_schema(cls) == list(STORES[store].fielddefs[ros_name][1])


def _random_base(rng: np.random.Generator, name: str) -> typing.Any:
    if name == "string":
        return "".join(rng.choice([*"abc XYZ_/09", "é", "日本", "🤖"], size=int(rng.integers(0, 12))))
    if name == "bool":
        return bool(rng.integers(2))
    if name.startswith(("int", "uint")):
        bits = int(name.removeprefix("u").removeprefix("int"))
        low, high = (0, 2**bits) if name.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1))
        return int(rng.integers(low, high, dtype=np.uint64 if name == "uint64" else np.int64))
    if rng.random() < 0.1:
        return float(rng.choice([0.0, -0.0, math.inf, -math.inf]))
    return float(rng.normal() * 10.0 ** rng.integers(-20, 20))


def _random_ros(rng: np.random.Generator, store, ros_name: str) -> typing.Any:
    values = {}
    for name, (kind, detail) in store.fielddefs[ros_name][1]:
        if kind == Nodetype.NAME:
            values[name] = _random_ros(rng, store, detail)
        elif kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            (element_kind, element), length = detail
            count = length if kind == Nodetype.ARRAY else int(rng.integers(0, 4))
            if element_kind == Nodetype.NAME:
                values[name] = [_random_ros(rng, store, element) for _ in range(count)]
            else:
                values[name] = np.array([_random_base(rng, element[0]) for _ in range(count)], dtype=element[0])
        else:
            values[name] = _random_base(rng, detail[0])
    return store.types[ros_name](**values)


def _to_ours(ros_msg: typing.Any, cls: type) -> typing.Any:
    hints = typing.get_type_hints(cls, include_extras=True)
    values = {}
    for name in am.struct_fields(cls):
        value, hint = getattr(ros_msg, name), hints[name]
        marker = typing.get_args(hint)[1] if typing.get_origin(hint) is typing.Annotated else None
        element = marker.subtype if isinstance(marker, (array, sequence)) else hint
        if isinstance(element, type) and issubclass(element, IdlStruct):
            value = [_to_ours(v, element) for v in value] if marker is not None else _to_ours(value, element)
        elif isinstance(value, np.ndarray):
            value = value.tobytes() if isinstance(marker, array) and value.dtype == np.uint8 else value.tolist()
        values[name] = value
    return cls(**values)


@pytest.mark.parametrize("ros_name", sorted(am.INTERFACE_TYPES))
def test_cdr_bytes_equal_rosbags_both_ways(ros_name):
    cls = am.INTERFACE_TYPES[ros_name]
    humble, jazzy = STORES["humble"], STORES["jazzy"]
    rng = np.random.default_rng(sum(ros_name.encode()))
    assert cls().serialize() == bytes(humble.serialize_cdr(_to_ros(humble, cls()), ros_name))  # the defaults
    for i in range(MESSAGES_PER_TYPE):
        theirs = _random_ros(rng, humble, ros_name)
        ours = _to_ours(theirs, cls)
        our_bytes, their_bytes = ours.serialize(), bytes(humble.serialize_cdr(theirs, ros_name))
        assert our_bytes[:4] == CDR_LE_HEADER
        assert our_bytes == their_bytes, f"{ros_name} message {i}: {ours!r}"
        assert bytes(jazzy.serialize_cdr(theirs, ros_name)) == our_bytes
        assert cls.deserialize(their_bytes) == ours
        assert _to_ours(humble.deserialize_cdr(our_bytes, ros_name), cls) == ours


def _to_ros(store, ours: typing.Any) -> typing.Any:
    """rosbags' message equal to one of ours."""
    ros_name = OUR_NAMES[type(ours)]
    values = {}
    for name, (kind, detail) in store.fielddefs[ros_name][1]:
        value = getattr(ours, name)
        if kind == Nodetype.NAME:
            value = _to_ros(store, value)
        elif kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            (element_kind, element), _ = detail
            if element_kind == Nodetype.NAME:
                value = [_to_ros(store, v) for v in value]
            else:
                value = np.frombuffer(value, np.uint8) if isinstance(value, bytes) else np.array(value, element[0])
        values[name] = value
    return store.types[ros_name](**values)


@pytest.mark.parametrize("service", sorted(am.SERVICE_TYPES))
def test_service_samples_carry_rmw_cyclonedds_request_header(service):
    """rmw_cyclonedds writes a request or reply as the encapsulation header, the client's 8-byte id and an int64
    sequence number (native little-endian), then the message itself: our samples' bytes, against rosbags'."""
    srv = am.SERVICE_TYPES[service]
    rng = np.random.default_rng(7)
    guid, sequence = 0xFEDC_BA98_7654_3210, 2**40 + 3
    for payload_type in (srv.Request, srv.Response):
        ros_name = OUR_NAMES[payload_type]
        theirs = _random_ros(rng, STORES["humble"], ros_name)
        payload = _to_ours(theirs, payload_type)
        body = bytes(STORES["humble"].serialize_cdr(theirs, ros_name))[4:]
        sample = wrap(payload, guid, sequence)
        assert sample.serialize() == CDR_LE_HEADER + struct.pack("<Qq", guid, sequence) + body
        assert type(sample).__idl__.idl_transformed_typename == payload_type.__idl__.idl_transformed_typename
        back = sample_type(payload_type).deserialize(sample.serialize())
        assert (back.rmw_guid, back.rmw_seq) == (guid, sequence)


def test_service_and_action_names_follow_rmw_cyclonedds_and_rcl_action():
    assert request_topic("/franka_gripper/move/_action/send_goal") == "rq/franka_gripper/move/_action/send_goalRequest"
    assert reply_topic("reset") == "rr/resetReply"
    assert action_names("/franka_gripper/move") == {
        part: f"/franka_gripper/move/_action/{part}"
        for part in ("send_goal", "cancel_goal", "get_result", "feedback", "status")
    }
    with pytest.raises(ValueError, match="'bad name'"):
        request_topic("bad name")


# services and actions on real DDS


@pytest.fixture
def bridge(request):
    with make_bridge("dds", domain_id=request.param if hasattr(request, "param") else 224) as b:
        yield b


def _unique(label: str) -> str:
    return f"/robotrl_test/{label}_{uuid.uuid4().hex[:8]}"


@pytest.mark.dds
def test_service_round_trip_matches_replies_by_their_header(bridge):
    service = _unique("cancel")
    seen = []

    def handler(request, request_id):
        seen.append(request_id)
        return am.CancelGoal_Response(return_code=request_id.sequence % 100, goals_canceling=[request.goal_info])

    server = ServiceServer(bridge, service, am.CANCEL_GOAL, handler)
    on_wire = []
    bridge.dds_subscription(
        reply_topic(service), sample_type(am.CancelGoal_Response), SERVICES_DEFAULT, lambda s: on_wire.append(s)
    )
    clients = [ServiceClient(bridge, service, am.CANCEL_GOAL) for _ in range(2)]
    assert clients[0].guid != clients[1].guid
    answers: dict[int, list] = {0: [], 1: []}

    def calls(index: int) -> None:
        for k in range(5):
            stamp = Time(sec=index * 1000 + k)
            request = am.CancelGoal_Request(goal_info=am.GoalInfo(stamp=stamp))
            answers[index].append((stamp, clients[index].call(request, timeout=5.0)))

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index, client in enumerate(clients):
        # each client got the answers to its own requests, in order, though both hear every reply
        assert [(r.goals_canceling[0].stamp, r.return_code) for _, r in answers[index]] == [
            (stamp, k + 1) for k, (stamp, _) in enumerate(answers[index])
        ]
        assert client.stats == {"calls": 5, "answered": 5, "timeouts": 0, "late_replies": 0}
        assert sorted(r.sequence for r in seen if r.guid == client.guid) == [1, 2, 3, 4, 5]
    assert wait_until(lambda: len(on_wire) == 10)
    assert {(s.rmw_guid, s.rmw_seq) for s in on_wire} == {(c.guid, k) for c in clients for k in range(1, 6)}
    assert server.stats["requests"] == server.stats["replies"] == 10


@pytest.mark.dds
def test_a_call_no_server_answers_times_out_naming_the_service(bridge):
    service = _unique("nobody")
    client = ServiceClient(bridge, service, am.CANCEL_GOAL)
    start = time.monotonic()
    with pytest.raises(
        TimeoutError, match=rf"service {service} did not answer within its deadline of 0.3 s \(no server"
    ):
        client.call(am.CancelGoal_Request(), timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 1.0

    heard = []
    silent = ServiceServer(bridge, service, am.CANCEL_GOAL, lambda request, request_id: heard.append(request_id))
    assert client.wait_for_server(5.0)
    with pytest.raises(TimeoutError, match="a server was matched but did not answer"):
        client.call(am.CancelGoal_Request(), timeout=0.3)
    time.sleep(0.2)
    assert len(heard) == 1 and silent.stats["replies"] == 0  # asked once, never again
    assert client.stats["timeouts"] == 2


@pytest.mark.dds
def test_bad_inputs_are_named(bridge):
    with pytest.raises(ValueError, match="'no spaces'"):
        ServiceClient(bridge, "no spaces", am.CANCEL_GOAL)
    with pytest.raises(TypeError, match="ServiceType"):
        ServiceClient(bridge, "/x", am.CancelGoal_Request)
    with pytest.raises(TypeError, match="dds backend"):
        ServiceClient(types.SimpleNamespace(backend="rclpy"), "/x", am.CANCEL_GOAL)
    client = ServiceClient(bridge, _unique("checked"), am.CANCEL_GOAL)
    with pytest.raises(TypeError, match="takes CancelGoal_Request, got GoalInfo"):
        client.call(am.GoalInfo(), timeout=1.0)
    with pytest.raises(ValueError, match=r"deadline .* got 0"):
        client.call(am.CancelGoal_Request(), timeout=0)
    action = ActionClient(bridge, _unique("gripper"), am.MOVE)
    with pytest.raises(TypeError, match="takes Move_Goal, got Grasp_Goal"):
        action.send_goal(am.Grasp_Goal(), timeout=1.0)
    with pytest.raises(ValueError, match="16 bytes"):
        action.send_goal_async(am.Move_Goal(), timeout=1.0, goal_id=b"short")


def _execute_with_feedback(handle):
    for position in (0.01, 0.02, 0.03):
        handle.publish_feedback(am.GripperCommand_Feedback(position=position))
        time.sleep(0.01)
    if handle.goal.command.position < 0:  # a goal that runs until it is cancelled
        while not handle.is_cancel_requested:
            time.sleep(0.005)
        handle.canceled(am.GripperCommand_Result(position=-1.0))
        return
    handle.succeed(am.GripperCommand_Result(position=handle.goal.command.position, reached_goal=True))


@pytest.fixture
def action_pair(bridge):
    name = _unique("gripper_cmd")
    server = ActionServer(
        bridge,
        name,
        am.GRIPPER_COMMAND,
        _execute_with_feedback,
        goal_callback=lambda goal: goal.command.max_effort >= 0,
    )
    client = ActionClient(bridge, name, am.GRIPPER_COMMAND)
    assert client.wait_for_server(5.0)
    yield server, client
    client.close()
    server.close()


def _goal(position: float, max_effort: float = 10.0):
    return am.GripperCommand_Goal(command=am.GripperCommand(position=position, max_effort=max_effort))


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [225], indirect=True)
def test_goal_accepted_then_feedback_then_result(action_pair):
    server, client = action_pair
    handle = client.send_goal(_goal(0.025), timeout=2.0)
    outcome = handle.get_result(timeout=2.0)
    assert outcome.status == am.STATUS_SUCCEEDED and outcome.status_name == "succeeded"
    assert outcome.result == am.GripperCommand_Result(position=0.025, reached_goal=True)
    assert handle.feedback_count == 3 and handle.feedback.position == 0.03  # none lost before the answer was read
    assert wait_until(lambda: handle.status == am.STATUS_SUCCEEDED)  # from the status topic too
    assert server.stats["accepted"] == 1
    stranger = ClientGoalHandle(client, uuid.uuid4().bytes, _goal(0.0), Time())
    assert stranger.get_result(timeout=2.0).status == am.STATUS_UNKNOWN


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [225], indirect=True)
def test_cancel_a_running_goal(action_pair):
    _, client = action_pair
    handle = client.send_goal(_goal(-1.0), timeout=2.0)
    assert wait_until(lambda: handle.status == am.STATUS_EXECUTING)
    answer = handle.cancel(timeout=2.0)
    assert answer.return_code == am.CANCEL_ERROR_NONE
    assert [bytes(g.goal_id.uuid) for g in answer.goals_canceling] == [handle.goal_id]
    outcome = handle.get_result(timeout=2.0)
    assert (outcome.status, outcome.result.position) == (am.STATUS_CANCELED, -1.0)
    assert handle.cancel(timeout=2.0).return_code == am.CANCEL_ERROR_GOAL_TERMINATED
    unknown = client.cancel_goals_async(2.0, goal_id=uuid.uuid4().bytes)
    unknown.wait()
    assert unknown.result().return_code == am.CANCEL_ERROR_UNKNOWN_GOAL_ID


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [225], indirect=True)
def test_a_rejected_goal_is_reported(action_pair):
    server, client = action_pair
    with pytest.raises(GoalRejectedError, match=rf"action {client.action} rejected the goal"):
        client.send_goal(_goal(0.01, max_effort=-1.0), timeout=2.0)
    assert server.stats["rejected"] == 1 and server.goals() == []


ALL_SERVICES = ("send_goal", "get_result", "cancel_goal")


def _silent_action(bridge, name: str, action_type, answering: set, log: dict):
    """An action server built from three services, each answering only while its name (send_goal, get_result,
    cancel_goal) is in `answering`: a server that hangs. `log` counts each service's requests and keeps the goals."""
    names = action_names(name)

    def send_goal(request, request_id):
        log["send_goal"] += 1
        log["goals"].append(request.goal)
        return action_type.SendGoal.Response(accepted=True) if "send_goal" in answering else None

    def get_result(request, request_id):
        log["get_result"] += 1
        result = action_type.Result(success=True)
        return (
            action_type.GetResult.Response(status=am.STATUS_SUCCEEDED, result=result)
            if "get_result" in answering
            else None
        )

    def cancel(request, request_id):
        log["cancel_goal"] += 1
        return (
            am.CancelGoal_Response(return_code=am.CANCEL_ERROR_UNKNOWN_GOAL_ID) if "cancel_goal" in answering else None
        )

    return [
        ServiceServer(bridge, names["send_goal"], action_type.SendGoal, send_goal),
        ServiceServer(bridge, names["get_result"], action_type.GetResult, get_result),
        ServiceServer(bridge, names["cancel_goal"], am.CANCEL_GOAL, cancel),
    ]


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [226], indirect=True)
def test_a_server_that_never_answers_is_reported_once_and_not_retried(bridge):
    name = _unique("hung")
    log = {"send_goal": 0, "get_result": 0, "cancel_goal": 0, "goals": []}
    _silent_action(bridge, name, am.MOVE, set(), log)
    client = ActionClient(bridge, name, am.MOVE)
    start = time.monotonic()
    pattern = rf"action {name}: send_goal was not answered within its deadline of 0.3 s \(its server was matched"
    with pytest.raises(ActionTimeoutError, match=pattern) as caught:
        client.send_goal(am.Move_Goal(width=0.08, speed=0.1), timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 1.0
    assert (caught.value.action, caught.value.step, caught.value.timeout) == (name, "send_goal", 0.3)
    time.sleep(0.3)
    assert log["send_goal"] == 1  # asked once; nothing retried it


class Fingers:
    """The twin's fingers in miniature: the opening follows the target at `speed` m/s and stops closing at an
    `obstacle` (an object between the fingers), computed from the clock when read."""

    def __init__(self, opening: float, speed: float = 0.2, obstacle: float | None = None):
        self._lock = threading.Lock()
        self.opening = self.target = opening
        self.speed, self.obstacle = speed, obstacle
        self._at = time.monotonic()

    def _advance(self) -> None:
        now = time.monotonic()
        step, self._at = self.speed * (now - self._at), now
        target = self.target
        if self.obstacle is not None and self.opening >= self.obstacle:
            target = max(target, self.obstacle)
        self.opening = min(target, self.opening + step) if target > self.opening else max(target, self.opening - step)

    def set_target(self, value: float) -> None:
        with self._lock:
            self._advance()
            self.target = value

    def read(self) -> float:
        with self._lock:
            self._advance()
            return self.opening


def _run_until_idle(gripper: GripperActionClient, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while gripper.poll() != "idle":
        assert time.monotonic() < deadline, gripper.stats
        time.sleep(0.002)


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [227], indirect=True)
@pytest.mark.parametrize("interface", ["franka_action", "gripper_command"])
def test_gripper_action_client_drives_the_twins_fingers(bridge, interface):
    fingers = Fingers(opening=0.0, obstacle=0.015)  # a 3 cm object between the fingers
    namespace = _unique("franka_gripper")
    server = TwinGripperServer(bridge, fingers.set_target, fingers.read, GRIPPER, namespace=namespace)
    config = GripperActionConfig(
        interface=interface,
        action_namespace=namespace,
        gripper_command_action=server.actions["gripper_command"],
        accept_timeout=1.0,
        result_timeout=3.0,
    )
    gripper = GripperActionClient(bridge, config, GRIPPER)
    gripper.send(0.04)
    assert gripper.poll() == "accepting"
    _run_until_idle(gripper)
    assert abs(fingers.read() - 0.04) <= 0.002
    for _ in range(10):  # the shield repeats an unchanged setpoint every period: nothing new is sent
        gripper.send(0.04)
        gripper.poll()
    gripper.send(0.0)  # close on the object: a Grasp (a Move would stall and fail) or a stalled GripperCommand
    gripper.poll()
    _run_until_idle(gripper)
    assert abs(fingers.read() - 0.015) <= 0.001
    stats = gripper.stats
    assert (stats["goals_sent"], stats["succeeded"], stats["failed"], stats["holds"]) == (2, 2, 0, 0)
    if interface == "gripper_command":
        assert abs(stats["opening"] - 0.015) <= 0.001  # the server's result
    gripper.close()
    assert gripper.poll() == "closed"
    server.close()


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [227], indirect=True)
def test_twin_server_refuses_a_width_beyond_the_gripper(bridge):
    fingers = Fingers(opening=0.02)
    namespace = _unique("franka_gripper")
    server = TwinGripperServer(bridge, fingers.set_target, fingers.read, GRIPPER, namespace=namespace)
    client = ActionClient(bridge, server.actions["move"], am.MOVE)
    outcome = client.send_goal(am.Move_Goal(width=0.2, speed=0.1), timeout=2.0).get_result(timeout=2.0)
    assert outcome.status == am.STATUS_ABORTED
    assert not outcome.result.success and "width 0.2 m is outside 0.0..0.08 m" in outcome.result.error
    assert fingers.target == 0.02  # never moved
    server.close()


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [228], indirect=True)
def test_gripper_client_holds_while_the_server_is_silent_then_resumes(bridge, caplog):
    namespace = _unique("franka_gripper")
    answering, log = set(), {"send_goal": 0, "get_result": 0, "cancel_goal": 0, "goals": []}
    grasp_log = {"send_goal": 0, "get_result": 0, "cancel_goal": 0, "goals": []}
    _silent_action(bridge, f"{namespace}/move", am.MOVE, answering, log)
    _silent_action(bridge, f"{namespace}/grasp", am.GRASP, answering, grasp_log)
    config = GripperActionConfig(action_namespace=namespace, accept_timeout=0.2, result_timeout=0.5, probe_interval=0.2)
    gripper = GripperActionClient(bridge, config, GRIPPER)
    with caplog.at_level(logging.WARNING, logger="robotrl.hardware.gripper_actions"):
        gripper.send(0.04)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            gripper.poll()
            gripper.send(0.03)  # new setpoints while held are kept, not sent (closing: a Grasp)
            time.sleep(0.005)
        stats = gripper.stats
        assert stats["state"] == "holding" and gripper.holding
        assert (stats["goals_sent"], stats["accept_timeouts"], stats["holds"]) == (1, 1, 1)
        assert log["send_goal"] == 1 and log["get_result"] == 0  # one goal, never sent again
        assert grasp_log["send_goal"] == 0
        assert 2 <= stats["probes"] <= 6  # a cancel of the overdue goal each 0.2 s, nothing else
        assert wait_until(lambda: log["cancel_goal"] == stats["probes"])
        assert "send_goal was not answered within its deadline of 0.2 s" in stats["last_error"]
        held = [r.message for r in caplog.records if "holding the gripper" in r.message]
        assert len(held) == 1

        answering.update(ALL_SERVICES)  # the server answers again: the hold ends and the newest setpoint goes out
        _run_until_idle(gripper)
    stats = gripper.stats
    assert (stats["goals_sent"], stats["succeeded"], stats["recoveries"]) == (2, 1, 1)
    epsilon = am.GraspEpsilon(inner=config.epsilon_inner, outer=config.epsilon_outer)
    assert grasp_log["goals"] == [am.Grasp_Goal(width=0.06, epsilon=epsilon, speed=config.speed, force=config.force)]
    assert log["send_goal"] == 1
    assert any("answers again" in r.message for r in caplog.records)
    gripper.close()


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [228], indirect=True)
def test_after_an_accept_timeout_the_same_setpoint_goes_once_more_and_no_more(bridge):
    namespace = _unique("franka_gripper")
    answering, log = {"cancel_goal"}, {"send_goal": 0, "get_result": 0, "cancel_goal": 0, "goals": []}
    _silent_action(bridge, f"{namespace}/move", am.MOVE, answering, log)  # answers cancels, never goals
    config = GripperActionConfig(action_namespace=namespace, accept_timeout=0.2, result_timeout=0.5, probe_interval=0.2)
    gripper = GripperActionClient(bridge, config, GRIPPER)
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        gripper.send(0.04)
        gripper.poll()
        time.sleep(0.005)
    stats = gripper.stats
    assert (stats["goals_sent"], stats["accept_timeouts"], stats["holds"], stats["recoveries"]) == (2, 2, 2, 2)
    assert log["send_goal"] == 2 and stats["state"] == "idle"  # the goal that never ran went once more, then no more
    gripper.send(0.02)  # a new setpoint is sent (a Grasp: no grasp server here, so it too times out)
    gripper.poll()
    assert gripper.stats["goals_sent"] == 3
    gripper.close()


@pytest.mark.dds
@pytest.mark.parametrize("bridge", [228], indirect=True)
def test_a_goal_that_never_ends_is_cancelled_and_not_sent_again(bridge):
    name = _unique("gripper_cmd")

    def never_ends(handle):
        while handle.is_active and not handle.is_cancel_requested:
            time.sleep(0.005)
        handle.canceled(am.GripperCommand_Result(position=0.01))

    server = ActionServer(bridge, name, am.GRIPPER_COMMAND, never_ends)
    config = GripperActionConfig(
        interface="gripper_command", gripper_command_action=name, accept_timeout=0.5, result_timeout=0.3
    )
    gripper = GripperActionClient(bridge, config, GRIPPER)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # the same setpoint every period, as the shield gives it
        gripper.send(0.01)
        gripper.poll()
        time.sleep(0.005)
    stats = gripper.stats
    assert (stats["goals_sent"], stats["result_timeouts"], stats["holds"], stats["recoveries"]) == (1, 1, 1, 1)
    assert stats["state"] == "idle"  # the server answered the cancel: no hold, and the same goal is not resent
    assert wait_until(lambda: [g.status for g in server.goals()] == [am.STATUS_CANCELED])
    gripper.send(0.02)  # a new setpoint is a new goal
    _run_until_idle(gripper)
    assert (gripper.stats["goals_sent"], gripper.stats["result_timeouts"]) == (2, 2)
    gripper.close()
    server.close()


def test_gripper_settings_and_setpoints_are_checked():
    with pytest.raises(ValueError, match="'topic'"):
        GripperActionConfig(interface="topic").validate()
    with pytest.raises(ValueError, match="accept_timeout must be > 0, got -1"):
        GripperActionConfig(accept_timeout=-1).validate()
    with pytest.raises(ValueError, match="'bad ns'"):
        GripperActionConfig(action_namespace="bad ns").validate()


@pytest.mark.dds
def test_gripper_setpoints_are_checked(bridge):
    gripper = GripperActionClient(bridge, GripperActionConfig(action_namespace=_unique("g")), GRIPPER)
    with pytest.raises(ValueError, match="finite number of metres per finger, got nan"):
        gripper.send(math.nan)
    with pytest.raises(ValueError, match=r"0.5 m is outside the gripper's range \[0.0, 0.04\] m"):
        gripper.send(0.5)
    assert gripper.stats["setpoints"] == 0 and gripper.poll() == "idle"
    gripper.close()
    with pytest.raises(RuntimeError, match="closed"):
        gripper.send(0.01)
