"""ROS 2 service and action types as Cyclone DDS IDL structs: action_msgs (goal ids, status, CancelGoal), and the
gripper actions control_msgs/action/GripperCommand and franka_msgs/action/Move, Grasp and Homing.

A ROS 2 interface `<pkg>/srv/<Srv>` is two structs, `<Srv>_Request` and `<Srv>_Response`, whose DDS type names are
`<pkg>::srv::dds_::<Srv>_Request_` and `..._Response_`. An action `<pkg>/action/<A>` is the structs `<A>_Goal`,
`<A>_Result`, `<A>_Feedback` and, as rosidl derives them, the services `<A>_SendGoal` (request: goal_id, goal;
response: accepted, stamp) and `<A>_GetResult` (request: goal_id; response: status, result) and the message
`<A>_FeedbackMessage` (goal_id, feedback), all named `<pkg>::action::dds_::<A>_..._`. A definition with no field
(Homing's goal, franka's feedbacks) holds rosidl's `uint8 structure_needs_at_least_one_member`, as on the wire.

Each struct mirrors its ROS 2 definition field for field, so the CDR bytes equal a ROS 2 node's
(tests/test_ros2_actions.py checks every one against rosbags). Sources: action_msgs and unique_identifier_msgs as
rosbags ships them (Humble, Jazzy); control_msgs/action/GripperCommand.action (ros-controls/control_msgs);
franka_msgs/action/{Move,Grasp,Homing}.action and msg/GraspEpsilon.msg (frankaemika/franka_ros2).
"""

# No `from __future__ import annotations` here: cyclonedds reads these field annotations at runtime.

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any

from robotrl.hardware.ros2._deps import require_cyclonedds

require_cyclonedds()

from cyclonedds.idl import IdlStruct  # noqa: E402
from cyclonedds.idl.types import array, float64, int8, sequence, uint8  # noqa: E402
from robotrl.hardware.ros2.msgs import Time, _dds_name  # noqa: E402

UUID_BYTES = 16


def interface_dds_name(ros_name: str) -> str:
    """The DDS type name of any ROS 2 interface type: `control_msgs/action/GripperCommand_Goal` ->
    `control_msgs::action::dds_::GripperCommand_Goal_` (msgs' `_dds_name` gives the `msg` ones)."""
    parts = ros_name.split("/") if isinstance(ros_name, str) else []
    if len(parts) != 3 or parts[1] not in ("msg", "srv", "action") or not all(parts):
        raise ValueError(f"a ROS 2 type name <package>/<msg|srv|action>/<Name> is needed, got {ros_name!r}")
    package, kind, name = parts
    return f"{package}::{kind}::dds_::{name}_"


# unique_identifier_msgs


@dataclass
class UUID(IdlStruct, typename=_dds_name("unique_identifier_msgs/msg/UUID")):
    uuid: array[uint8, UUID_BYTES] = bytes(UUID_BYTES)  # uint8[16]; read back as bytes


# action_msgs


@dataclass
class GoalInfo(IdlStruct, typename=_dds_name("action_msgs/msg/GoalInfo")):
    goal_id: UUID = field(default_factory=UUID)
    stamp: Time = field(default_factory=Time)


@dataclass
class GoalStatus(IdlStruct, typename=_dds_name("action_msgs/msg/GoalStatus")):
    goal_info: GoalInfo = field(default_factory=GoalInfo)
    status: int8 = 0


# action_msgs/msg/GoalStatus's constants
STATUS_UNKNOWN = 0
STATUS_ACCEPTED = 1
STATUS_EXECUTING = 2
STATUS_CANCELING = 3
STATUS_SUCCEEDED = 4
STATUS_CANCELED = 5
STATUS_ABORTED = 6
STATUS_NAMES = {
    STATUS_UNKNOWN: "unknown",
    STATUS_ACCEPTED: "accepted",
    STATUS_EXECUTING: "executing",
    STATUS_CANCELING: "canceling",
    STATUS_SUCCEEDED: "succeeded",
    STATUS_CANCELED: "canceled",
    STATUS_ABORTED: "aborted",
}
TERMINAL_STATUSES = frozenset({STATUS_SUCCEEDED, STATUS_CANCELED, STATUS_ABORTED})


@dataclass
class GoalStatusArray(IdlStruct, typename=_dds_name("action_msgs/msg/GoalStatusArray")):
    status_list: sequence[GoalStatus] = field(default_factory=list)


@dataclass
class CancelGoal_Request(IdlStruct, typename=interface_dds_name("action_msgs/srv/CancelGoal_Request")):
    goal_info: GoalInfo = field(default_factory=GoalInfo)


@dataclass
class CancelGoal_Response(IdlStruct, typename=interface_dds_name("action_msgs/srv/CancelGoal_Response")):
    return_code: int8 = 0
    goals_canceling: sequence[GoalInfo] = field(default_factory=list)


# action_msgs/srv/CancelGoal's return codes
CANCEL_ERROR_NONE = 0
CANCEL_ERROR_REJECTED = 1
CANCEL_ERROR_UNKNOWN_GOAL_ID = 2
CANCEL_ERROR_GOAL_TERMINATED = 3


@dataclass(frozen=True)
class ServiceType:
    """A ROS 2 service type: its name (`action_msgs/srv/CancelGoal`) and its request and response structs."""

    name: str
    Request: type
    Response: type


@dataclass(frozen=True)
class ActionType:
    """A ROS 2 action type (`franka_msgs/action/Move`): its goal, result and feedback, and the services and the
    feedback message rosidl derives from them."""

    name: str
    Goal: type
    Result: type
    Feedback: type
    SendGoal: ServiceType
    GetResult: ServiceType
    FeedbackMessage: type


CANCEL_GOAL = ServiceType("action_msgs/srv/CancelGoal", CancelGoal_Request, CancelGoal_Response)


def _struct(ros_name: str, fields: list[tuple[str, Any, Any]]) -> type:
    """An IdlStruct dataclass named as ROS 2 names `ros_name` on the wire; `fields` are (name, type, default),
    a struct-typed default given as its class (a fresh one per instance)."""
    name = ros_name.rsplit("/", 1)[1]

    def body(namespace: dict) -> None:
        namespace["__annotations__"] = {field_name: kind for field_name, kind, _ in fields}
        for field_name, _, default in fields:
            is_struct = isinstance(default, type)
            namespace[field_name] = field(default_factory=default) if is_struct else default
        namespace["__module__"] = __name__
        namespace["__qualname__"] = name

    return dataclass(types.new_class(name, (IdlStruct,), {"typename": interface_dds_name(ros_name)}, body))


def _action(ros_name: str, goal: type, result: type, feedback: type) -> ActionType:
    """The action `ros_name` (`<pkg>/action/<A>`) with the SendGoal, GetResult and FeedbackMessage types rosidl
    derives (rosidl_adapter's action conventions: action_msgs' goal ids, builtin_interfaces' stamp)."""
    send_goal, get_result = ros_name + "_SendGoal", ros_name + "_GetResult"
    return ActionType(
        name=ros_name,
        Goal=goal,
        Result=result,
        Feedback=feedback,
        SendGoal=ServiceType(
            send_goal,
            _struct(send_goal + "_Request", [("goal_id", UUID, UUID), ("goal", goal, goal)]),
            _struct(send_goal + "_Response", [("accepted", bool, False), ("stamp", Time, Time)]),
        ),
        GetResult=ServiceType(
            get_result,
            _struct(get_result + "_Request", [("goal_id", UUID, UUID)]),
            _struct(get_result + "_Response", [("status", int8, 0), ("result", result, result)]),
        ),
        FeedbackMessage=_struct(
            ros_name + "_FeedbackMessage", [("goal_id", UUID, UUID), ("feedback", feedback, feedback)]
        ),
    )


# control_msgs


@dataclass
class GripperCommand(IdlStruct, typename=_dds_name("control_msgs/msg/GripperCommand")):
    """control_msgs/msg/GripperCommand (the message; the action is `GRIPPER_COMMAND`)."""

    position: float64 = 0.0
    max_effort: float64 = 0.0


@dataclass
class GripperCommand_Goal(IdlStruct, typename=interface_dds_name("control_msgs/action/GripperCommand_Goal")):
    command: GripperCommand = field(default_factory=GripperCommand)


@dataclass
class GripperCommand_Result(IdlStruct, typename=interface_dds_name("control_msgs/action/GripperCommand_Result")):
    position: float64 = 0.0  # the gap as the server measures it (franka_gripper: metres per finger)
    effort: float64 = 0.0
    stalled: bool = False  # at max effort and not moving (holding something)
    reached_goal: bool = False


@dataclass
class GripperCommand_Feedback(IdlStruct, typename=interface_dds_name("control_msgs/action/GripperCommand_Feedback")):
    position: float64 = 0.0
    effort: float64 = 0.0
    stalled: bool = False
    reached_goal: bool = False


GRIPPER_COMMAND = _action(
    "control_msgs/action/GripperCommand", GripperCommand_Goal, GripperCommand_Result, GripperCommand_Feedback
)


# franka_msgs: widths are the distance between the fingers (twice a finger's opening)


@dataclass
class GraspEpsilon(IdlStruct, typename=_dds_name("franka_msgs/msg/GraspEpsilon")):
    inner: float64 = 0.0  # m: a grasp succeeds if the measured width >= width - inner
    outer: float64 = 0.0  # m: ... and <= width + outer


@dataclass
class Move_Goal(IdlStruct, typename=interface_dds_name("franka_msgs/action/Move_Goal")):
    width: float64 = 0.0  # m
    speed: float64 = 0.0  # m/s


@dataclass
class Grasp_Goal(IdlStruct, typename=interface_dds_name("franka_msgs/action/Grasp_Goal")):
    width: float64 = 0.0  # m
    epsilon: GraspEpsilon = field(default_factory=GraspEpsilon)
    speed: float64 = 0.0  # m/s
    force: float64 = 0.0  # N


@dataclass
class Homing_Goal(IdlStruct, typename=interface_dds_name("franka_msgs/action/Homing_Goal")):
    structure_needs_at_least_one_member: uint8 = 0


def _franka_result(action: str) -> type:
    return _struct(f"franka_msgs/action/{action}_Result", [("success", bool, False), ("error", str, "")])


def _empty(ros_name: str) -> type:
    return _struct(ros_name, [("structure_needs_at_least_one_member", uint8, 0)])


MOVE = _action("franka_msgs/action/Move", Move_Goal, _franka_result("Move"), _empty("franka_msgs/action/Move_Feedback"))
GRASP = _action(
    "franka_msgs/action/Grasp", Grasp_Goal, _franka_result("Grasp"), _empty("franka_msgs/action/Grasp_Feedback")
)
HOMING = _action(
    "franka_msgs/action/Homing", Homing_Goal, _franka_result("Homing"), _empty("franka_msgs/action/Homing_Feedback")
)

ACTION_TYPES: dict[str, ActionType] = {a.name: a for a in (GRIPPER_COMMAND, MOVE, GRASP, HOMING)}
"""Every action defined here, by its ROS 2 name."""
SERVICE_TYPES: dict[str, ServiceType] = {CANCEL_GOAL.name: CANCEL_GOAL} | {
    s.name: s for a in ACTION_TYPES.values() for s in (a.SendGoal, a.GetResult)
}
"""Every service defined here (CancelGoal and each action's SendGoal and GetResult), by its ROS 2 name."""


def _interface_types() -> dict[str, type]:
    found: dict[str, type] = {}
    structs = [UUID, GoalInfo, GoalStatus, GoalStatusArray, GripperCommand, GraspEpsilon]
    for action in ACTION_TYPES.values():
        structs += [action.Goal, action.Result, action.Feedback, action.FeedbackMessage]
    for service in SERVICE_TYPES.values():
        structs += [service.Request, service.Response]
    for cls in structs:
        package, kind, _ = cls.__idl_typename__.split("::", 2)
        found[f"{package}/{kind}/{cls.__name__}"] = cls
    return found


INTERFACE_TYPES: dict[str, type] = _interface_types()
"""Every struct defined here by its ROS 2 name (`franka_msgs/action/Grasp_SendGoal_Request`)."""


def uuid_of(value: bytes | UUID) -> bytes:
    """A goal id's 16 bytes, checked."""
    raw = value.uuid if isinstance(value, UUID) else value
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != UUID_BYTES:
        raise ValueError(f"a goal id is {UUID_BYTES} bytes, got {value!r}")
    return bytes(raw)


def struct_fields(cls: type) -> list[str]:
    """The field names of one of these structs, in wire order."""
    return [f.name for f in dataclasses.fields(cls)]
