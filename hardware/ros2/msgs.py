"""ROS 2 messages as Cyclone DDS IDL structs, with the type names ROS 2 nodes use on the wire.

Each class mirrors its ROS 2 definition field for field (order, widths, sequences, strings), so the
CDR bytes equal those of a ROS 2 node (tests/test_ros2_msgs.py checks every type against rosbags).
The DDS type name is `<package>::msg::dds_::<Name>_`; `ros_type_name` gives `<package>/msg/<Name>`.
"""

# No `from __future__ import annotations` here: cyclonedds reads these field annotations at runtime and
# cannot resolve them from strings such as "sequence[float64]".

import dataclasses
import typing
from dataclasses import dataclass, field

from robotrl.hardware.ros2._deps import require_cyclonedds

require_cyclonedds()

from cyclonedds.idl import IdlStruct  # noqa: E402
from cyclonedds.idl._machinery import BytesMachine  # noqa: E402
from cyclonedds.idl.types import float32, float64, int32, sequence, uint8, uint32  # noqa: E402


def _dds_name(ros_name: str) -> str:
    package, _, name = ros_name.split("/")
    return f"{package}::msg::dds_::{name}_"


# builtin_interfaces


@dataclass
class Time(IdlStruct, typename=_dds_name("builtin_interfaces/msg/Time")):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Duration(IdlStruct, typename=_dds_name("builtin_interfaces/msg/Duration")):
    sec: int32 = 0
    nanosec: uint32 = 0


# std_msgs


@dataclass
class Header(IdlStruct, typename=_dds_name("std_msgs/msg/Header")):
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class Bool(IdlStruct, typename=_dds_name("std_msgs/msg/Bool")):
    data: bool = False


@dataclass
class String(IdlStruct, typename=_dds_name("std_msgs/msg/String")):
    data: str = ""


@dataclass
class MultiArrayDimension(IdlStruct, typename=_dds_name("std_msgs/msg/MultiArrayDimension")):
    label: str = ""
    size: uint32 = 0
    stride: uint32 = 0


@dataclass
class MultiArrayLayout(IdlStruct, typename=_dds_name("std_msgs/msg/MultiArrayLayout")):
    dim: sequence[MultiArrayDimension] = field(default_factory=list)
    data_offset: uint32 = 0


@dataclass
class Float64MultiArray(IdlStruct, typename=_dds_name("std_msgs/msg/Float64MultiArray")):
    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float64] = field(default_factory=list)


# sensor_msgs


@dataclass
class JointState(IdlStruct, typename=_dds_name("sensor_msgs/msg/JointState")):
    header: Header = field(default_factory=Header)
    name: sequence[str] = field(default_factory=list)
    position: sequence[float64] = field(default_factory=list)
    velocity: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)


@dataclass
class Image(IdlStruct, typename=_dds_name("sensor_msgs/msg/Image")):
    header: Header = field(default_factory=Header)
    height: uint32 = 0
    width: uint32 = 0
    encoding: str = ""
    is_bigendian: uint8 = 0
    step: uint32 = 0
    # sequence<uint8> on the wire and in the type information; held as bytes (see _pixel_bytes below)
    data: sequence[uint8] = field(default_factory=bytes)


@dataclass
class CompressedImage(IdlStruct, typename=_dds_name("sensor_msgs/msg/CompressedImage")):
    header: Header = field(default_factory=Header)
    format: str = ""  # image_transport's: "rgb8; png compressed bgr8" (the source encoding; the codec; its order)
    # sequence<uint8> as Image's data (see _pixel_bytes below)
    data: sequence[uint8] = field(default_factory=bytes)


@dataclass
class Joy(IdlStruct, typename=_dds_name("sensor_msgs/msg/Joy")):
    header: Header = field(default_factory=Header)
    axes: sequence[float32] = field(default_factory=list)
    buttons: sequence[int32] = field(default_factory=list)


# geometry_msgs


@dataclass
class Point(IdlStruct, typename=_dds_name("geometry_msgs/msg/Point")):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0


@dataclass
class Vector3(IdlStruct, typename=_dds_name("geometry_msgs/msg/Vector3")):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0


@dataclass
class Quaternion(IdlStruct, typename=_dds_name("geometry_msgs/msg/Quaternion")):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0
    w: float64 = 1.0  # ROS 2's default: the identity rotation


@dataclass
class Pose(IdlStruct, typename=_dds_name("geometry_msgs/msg/Pose")):
    position: Point = field(default_factory=Point)
    orientation: Quaternion = field(default_factory=Quaternion)


@dataclass
class PoseStamped(IdlStruct, typename=_dds_name("geometry_msgs/msg/PoseStamped")):
    header: Header = field(default_factory=Header)
    pose: Pose = field(default_factory=Pose)


@dataclass
class Twist(IdlStruct, typename=_dds_name("geometry_msgs/msg/Twist")):
    linear: Vector3 = field(default_factory=Vector3)
    angular: Vector3 = field(default_factory=Vector3)


@dataclass
class TwistStamped(IdlStruct, typename=_dds_name("geometry_msgs/msg/TwistStamped")):
    header: Header = field(default_factory=Header)
    twist: Twist = field(default_factory=Twist)


@dataclass
class Wrench(IdlStruct, typename=_dds_name("geometry_msgs/msg/Wrench")):
    force: Vector3 = field(default_factory=Vector3)
    torque: Vector3 = field(default_factory=Vector3)


@dataclass
class WrenchStamped(IdlStruct, typename=_dds_name("geometry_msgs/msg/WrenchStamped")):
    header: Header = field(default_factory=Header)
    wrench: Wrench = field(default_factory=Wrench)


# trajectory_msgs


@dataclass
class JointTrajectoryPoint(IdlStruct, typename=_dds_name("trajectory_msgs/msg/JointTrajectoryPoint")):
    positions: sequence[float64] = field(default_factory=list)
    velocities: sequence[float64] = field(default_factory=list)
    accelerations: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)
    time_from_start: Duration = field(default_factory=Duration)


@dataclass
class JointTrajectory(IdlStruct, typename=_dds_name("trajectory_msgs/msg/JointTrajectory")):
    header: Header = field(default_factory=Header)
    joint_names: sequence[str] = field(default_factory=list)
    points: sequence[JointTrajectoryPoint] = field(default_factory=list)


MESSAGE_TYPES: dict[str, type[IdlStruct]] = {
    f"{cls.__idl_typename__.split('::')[0]}/msg/{cls.__name__}": cls
    for cls in (
        Time,
        Duration,
        Header,
        Bool,
        String,
        MultiArrayDimension,
        MultiArrayLayout,
        Float64MultiArray,
        JointState,
        Image,
        CompressedImage,
        Joy,
        Point,
        Vector3,
        Quaternion,
        Pose,
        PoseStamped,
        Twist,
        TwistStamped,
        Wrench,
        WrenchStamped,
        JointTrajectoryPoint,
        JointTrajectory,
    )
}
"""Every message defined here, by its ROS 2 name (`sensor_msgs/msg/JointState`)."""


def ros_type_name(msg_type: type) -> str:
    """`sensor_msgs/msg/JointState` for JointState; a TypeError for anything not defined here."""
    for name, cls in MESSAGE_TYPES.items():
        if cls is msg_type:
            return name
    raise TypeError(f"{msg_type!r} is not a ROS 2 message of robotrl.hardware.ros2.msgs ({', '.join(MESSAGE_TYPES)})")


def message_fields(msg_type: type) -> dict[str, tuple[type | None, bool]]:
    """Each field's nested message type (None for a primitive or string) and whether it is a sequence."""
    hints = typing.get_type_hints(msg_type, include_extras=True)
    fields: dict[str, tuple[type | None, bool]] = {}
    for f in dataclasses.fields(msg_type):
        hint = hints[f.name]
        # sequence[X] is Annotated[Sequence[X], sequence(X)]; the cyclonedds marker holds the element type
        marker = typing.get_args(hint)[1] if typing.get_origin(hint) is typing.Annotated else None
        is_sequence = isinstance(marker, sequence)
        element = marker.subtype if is_sequence else hint
        nested = element if isinstance(element, type) and issubclass(element, IdlStruct) else None
        fields[f.name] = (nested, is_sequence)
    return fields


class _OctetSequenceMachine(BytesMachine):
    """sequence<uint8> as bytes: the same wire layout (uint32 length, raw bytes) as cyclonedds' generic
    primitive-sequence machine, without a Python int per byte (a 640x480 RGB frame: about 3 ms instead of
    50 ms to serialize, and bytes instead of a 921,600-element list)."""

    def serialize(self, buffer, value, *args, **kwargs):
        if isinstance(value, memoryview):
            # len() of a memoryview counts items of its first dimension, not bytes: view it as flat bytes
            value = value.cast("B") if value.c_contiguous else value.tobytes()
        elif not isinstance(value, (bytes, bytearray)):
            value = bytes(value)  # a list of ints or a numpy uint8 array
        super().serialize(buffer, value, *args, **kwargs)

    def default_initialize(self):
        return b""


def _pixel_bytes(msg_type: type, field_name: str) -> None:
    # The annotation stays sequence[uint8] so the type information DDS announces is ROS 2's; only the
    # machines that encode the field are swapped. tests/test_ros2_msgs.py checks the bytes against rosbags.
    msg_type.__idl__.populate()
    for machine in (msg_type.__idl__.v1_machine, msg_type.__idl__.v2_machine):
        machine.members_machines[field_name] = _OctetSequenceMachine()


_pixel_bytes(Image, "data")
_pixel_bytes(CompressedImage, "data")
