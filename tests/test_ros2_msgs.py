"""ROS 2 messages: field layouts and CDR bytes against rosbags (an independent implementation of ROS 2's
type definitions and CDR), and the tensor helpers."""

from __future__ import annotations

import math
import typing

import numpy as np
import pytest
import torch

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
pytest.importorskip("rosbags", reason='needs the ros extra: pip install "robotrl[ros]"')

from cyclonedds.idl import IdlStruct
from robotrl.hardware.ros2 import tensors
from robotrl.hardware.ros2.msgs import (
    MESSAGE_TYPES,
    Float64MultiArray,
    Image,
    JointState,
    Quaternion,
    message_fields,
    ros_type_name,
)
from rosbags.interfaces import Nodetype
from rosbags.typesys import Stores, get_typestore

HUMBLE = get_typestore(Stores.ROS2_HUMBLE)
JAZZY = get_typestore(Stores.ROS2_JAZZY)
CDR_LE_HEADER = b"\x00\x01\x00\x00"  # encapsulation: plain CDR (XCDR1), little-endian, no options

INT_RANGES = {
    "int8": (-(2**7), 2**7),
    "uint8": (0, 2**8),
    "int16": (-(2**15), 2**15),
    "uint16": (0, 2**16),
    "int32": (-(2**31), 2**31),
    "uint32": (0, 2**32),
    "int64": (-(2**63), 2**63),
    "uint64": (0, 2**64),
}
STRING_ALPHABET = [*"abcXYZ_/ 0129", "é", "ß", "日本", "ロボット", "🤖", "\t", "\n"]
MESSAGES_PER_TYPE = 40


def _our_schema(cls: type) -> list[tuple[str, tuple]]:
    """Our struct's fields in rosbags' fielddefs shape, so the two can be compared as data."""

    def kind(hint: typing.Any) -> tuple:
        if isinstance(hint, type) and issubclass(hint, IdlStruct):
            return (Nodetype.NAME, ros_type_name(hint))
        if hint is str:
            return (Nodetype.BASE, ("string", 0))
        if hint is bool:
            return (Nodetype.BASE, ("bool", 0))
        _, marker = typing.get_args(hint)
        if isinstance(marker, str):  # Annotated[int, "uint32"]
            return (Nodetype.BASE, (marker, 0))
        return (Nodetype.SEQUENCE, (kind(marker.subtype), marker.max_length or 0))

    hints = typing.get_type_hints(cls, include_extras=True)
    return [(name, kind(hints[name])) for name in message_fields(cls)]


@pytest.mark.parametrize("store", [HUMBLE, JAZZY], ids=["humble", "jazzy"])
@pytest.mark.parametrize("ros_name", sorted(MESSAGE_TYPES))
def test_layout_matches_ros2_definition(ros_name, store):
    cls = MESSAGE_TYPES[ros_name]
    assert cls.__idl__.idl_transformed_typename == "{}::msg::dds_::{}_".format(*ros_name.split("/msg/"))
    _, ros_fields = store.fielddefs[ros_name]
    assert _our_schema(cls) == list(ros_fields)


def test_defaults_match_ros2():
    assert Quaternion().w == 1.0  # ROS 2 gives the identity rotation by default
    for ros_name, cls in MESSAGE_TYPES.items():
        assert cls().serialize() == bytes(HUMBLE.serialize_cdr(_default_ros(ros_name), ros_name)), ros_name


def _default_ros(ros_name: str) -> typing.Any:
    """rosbags' message with ROS 2's defaults (rosbags' classes have no defaults of their own)."""
    _, fields = HUMBLE.fielddefs[ros_name]
    values = {}
    for name, (kind, detail) in fields:
        if kind == Nodetype.NAME:
            values[name] = _default_ros(detail)
        elif kind == Nodetype.SEQUENCE:
            element = detail[0]
            is_numeric = element[0] == Nodetype.BASE and element[1][0] != "string"
            values[name] = np.zeros(0, dtype=np.dtype(element[1][0])) if is_numeric else []
        else:
            values[name] = {"string": "", "bool": False}.get(detail[0], 0)
    if ros_name == "geometry_msgs/msg/Quaternion":
        values["w"] = 1.0
    return HUMBLE.types[ros_name](**values)


def _random_string(rng: np.random.Generator) -> str:
    if rng.random() < 0.2:
        return ""
    return "".join(rng.choice(STRING_ALPHABET, size=int(rng.integers(1, 24))))


def _random_float(rng: np.random.Generator, dtype: str) -> float:
    special = [0.0, -0.0, math.inf, -math.inf, 1e-300, -1.5e300]
    if rng.random() < 0.1:
        value = float(rng.choice(special))
    else:
        value = float(rng.normal() * 10.0 ** rng.integers(-30, 30))
    if dtype == "float32":
        with np.errstate(over="ignore"):  # beyond float32's range is inf, a value worth sending too
            return float(np.float32(value))
    return value


def _random_base(rng: np.random.Generator, name: str) -> typing.Any:
    if name == "string":
        return _random_string(rng)
    if name == "bool":
        return bool(rng.integers(2))
    if name in INT_RANGES:
        low, high = INT_RANGES[name]
        return int(rng.integers(low, high, dtype=np.int64 if name != "uint64" else np.uint64))
    return _random_float(rng, name)


def _random_sequence(rng: np.random.Generator, element: tuple, big: bool) -> typing.Any:
    kind, detail = element
    if kind == Nodetype.NAME:
        return [_random_ros(rng, detail, big) for _ in range(int(rng.integers(0, 5)))]
    name = detail[0]
    if name == "string":
        return [_random_string(rng) for _ in range(int(rng.integers(0, 6)))]
    if name == "uint8":
        size = 640 * 480 * 3 if big else int(rng.integers(0, 300))
        return rng.integers(0, 256, size=size, dtype=np.uint8)
    return np.array([_random_base(rng, name) for _ in range(int(rng.integers(0, 40)))], dtype=np.dtype(name))


def _random_ros(rng: np.random.Generator, ros_name: str, big: bool = False) -> typing.Any:
    _, fields = HUMBLE.fielddefs[ros_name]
    values = {}
    for name, (kind, detail) in fields:
        if kind == Nodetype.NAME:
            values[name] = _random_ros(rng, detail, big)
        elif kind == Nodetype.SEQUENCE:
            values[name] = _random_sequence(rng, detail[0], big)
        else:
            values[name] = _random_base(rng, detail[0])
    return HUMBLE.types[ros_name](**values)


def _to_ours(ros_msg: typing.Any, cls: type) -> typing.Any:
    values = {}
    for name, (nested, is_sequence) in message_fields(cls).items():
        value = getattr(ros_msg, name)
        if nested is not None:
            value = [_to_ours(v, nested) for v in value] if is_sequence else _to_ours(value, nested)
        elif isinstance(value, np.ndarray):
            value = value.tobytes() if value.dtype == np.uint8 else value.tolist()
        values[name] = value
    return cls(**values)


@pytest.mark.parametrize("ros_name", sorted(MESSAGE_TYPES))
def test_cdr_bytes_equal_rosbags_both_ways(ros_name):
    cls = MESSAGE_TYPES[ros_name]
    rng = np.random.default_rng(abs(hash(ros_name)) % 2**32)
    for i in range(MESSAGES_PER_TYPE):
        theirs = _random_ros(rng, ros_name, big=ros_name == "sensor_msgs/msg/Image" and i < 3)
        ours = _to_ours(theirs, cls)
        our_bytes = ours.serialize()
        their_bytes = bytes(HUMBLE.serialize_cdr(theirs, ros_name))
        assert our_bytes[:4] == CDR_LE_HEADER
        assert our_bytes == their_bytes, f"{ros_name} message {i}: {ours!r}"
        assert bytes(JAZZY.serialize_cdr(theirs, ros_name)) == our_bytes
        assert cls.deserialize(their_bytes) == ours
        assert _to_ours(HUMBLE.deserialize_cdr(our_bytes, ros_name), cls) == ours


def test_image_data_is_bytes_and_accepts_buffers():
    pixels = np.arange(12, dtype=np.uint8)
    for data in (pixels, pixels.tobytes(), bytearray(pixels.tobytes()), list(range(12))):
        msg = Image(height=2, width=2, encoding="rgb8", step=6, data=data)
        assert Image.deserialize(msg.serialize()).data == pixels.tobytes()


def test_image_data_from_any_memoryview_is_its_bytes_as_rosbags_reads_them():
    """len() of a memoryview counts its first dimension's items: a (2, 2, 3) view has len 2, a uint16 view one
    per two bytes. The wire must carry every byte, as rosbags serializes them."""
    pixels = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    wide = np.arange(6, dtype=np.uint16) * 1000
    cases = [
        (memoryview(pixels), "rgb8", 6),
        (memoryview(wide), "mono16", 6),
        (memoryview(pixels[:, ::-1]), "rgb8", 6),  # not contiguous
    ]
    for view, encoding, step in cases:
        data = view.tobytes()
        ours = Image(height=2, width=step // (3 if encoding == "rgb8" else 2), encoding=encoding, step=step, data=view)
        theirs = HUMBLE.types["sensor_msgs/msg/Image"](
            header=HUMBLE.types["std_msgs/msg/Header"](
                stamp=HUMBLE.types["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id=""
            ),
            height=ours.height,
            width=ours.width,
            encoding=encoding,
            is_bigendian=0,
            step=step,
            data=np.frombuffer(data, dtype=np.uint8),
        )
        our_bytes = ours.serialize()
        assert our_bytes == bytes(HUMBLE.serialize_cdr(theirs, "sensor_msgs/msg/Image")), view.format
        assert HUMBLE.deserialize_cdr(our_bytes, "sensor_msgs/msg/Image").data.tobytes() == data
        assert Image.deserialize(our_bytes).data == data


def test_compressed_image_and_string_carry_a_png_and_json_as_rosbags_does():
    """The two types a deployment bag adds (hardware/deploy.py: PolicyStepRecorder): a real PNG from OpenCV in a
    sensor_msgs/CompressedImage, a JSON event with non-ASCII text in a std_msgs/String; bytes equal rosbags'."""
    cv2 = pytest.importorskip("cv2", reason="needs the cameras extra: pip install 'robotrl[cameras]'")
    from robotrl.hardware.ros2.msgs import CompressedImage, Header, String, Time

    frame = np.random.default_rng(7).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    ok, png = cv2.imencode(".png", frame)
    assert ok
    header = Header(stamp=Time(sec=1_790_000_000, nanosec=123_456_789), frame_id="front")
    ours = CompressedImage(header=header, format="rgb8; png compressed bgr8", data=png.tobytes())
    ros_header = HUMBLE.types["std_msgs/msg/Header"](
        stamp=HUMBLE.types["builtin_interfaces/msg/Time"](sec=1_790_000_000, nanosec=123_456_789), frame_id="front"
    )
    theirs = HUMBLE.types["sensor_msgs/msg/CompressedImage"](
        header=ros_header, format="rgb8; png compressed bgr8", data=png.reshape(-1)
    )
    our_bytes = ours.serialize()
    assert our_bytes == bytes(HUMBLE.serialize_cdr(theirs, "sensor_msgs/msg/CompressedImage"))
    back = HUMBLE.deserialize_cdr(our_bytes, "sensor_msgs/msg/CompressedImage")
    assert np.array_equal(cv2.imdecode(back.data, cv2.IMREAD_COLOR), frame)
    assert CompressedImage.deserialize(our_bytes) == ours

    text = '{"event": "stale", "reason": "caméra front frame too old: 🤖"}'
    our_bytes = String(data=text).serialize()
    their = HUMBLE.types["std_msgs/msg/String"](data=text)
    assert our_bytes == bytes(HUMBLE.serialize_cdr(their, "std_msgs/msg/String"))
    assert HUMBLE.deserialize_cdr(our_bytes, "std_msgs/msg/String").data == text


def test_unknown_message_type_is_named():
    with pytest.raises(TypeError, match="dict"):
        ros_type_name(dict)


# tensor helpers


def test_joint_state_tensor_in_requested_order():
    msg = JointState(name=["b", "a", "c"], position=[2.0, 1.0, 3.0], velocity=[0.2, 0.1, 0.3])
    assert torch.equal(tensors.joint_state_tensor(msg, ["a", "b"]), torch.tensor([1.0, 2.0]))
    assert torch.equal(tensors.joint_state_tensor(msg), torch.tensor([2.0, 1.0, 3.0]))
    velocity = tensors.joint_state_tensor(msg, ["c"], field="velocity", dtype=torch.float64)
    assert velocity.dtype == torch.float64 and velocity.tolist() == [0.3]
    with pytest.raises(KeyError, match="'d'"):
        tensors.joint_state_tensor(msg, ["a", "d"])
    with pytest.raises(ValueError, match="3 names but 0 effort"):
        tensors.joint_state_tensor(msg, ["a"], field="effort")
    with pytest.raises(ValueError, match="'accel'"):
        tensors.joint_state_tensor(msg, field="accel")


def test_float64_multi_array_from_tensor_is_checked():
    msg = tensors.float64_multi_array(torch.tensor([0.5, -1.0, 2.0]), length=3, label="joints")
    assert isinstance(msg, Float64MultiArray) and msg.data == [0.5, -1.0, 2.0]
    assert (msg.layout.dim[0].label, msg.layout.dim[0].size, msg.layout.dim[0].stride) == ("joints", 3, 3)
    with pytest.raises(ValueError, match=r"indices \[1\]"):
        tensors.float64_multi_array(torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="must have 7 values, got 3"):
        tensors.float64_multi_array([0.0, 1.0, 2.0], length=7)
    with pytest.raises(ValueError, match="1-D"):
        tensors.float64_multi_array(torch.zeros(2, 2))


def test_joint_state_msg_round_trip_and_refusals():
    msg = tensors.joint_state_msg(["a", "b"], torch.tensor([1.0, 2.0]), velocity=[0.0, 0.5])
    back = JointState.deserialize(msg.serialize())
    assert back.name == ["a", "b"] and back.position == [1.0, 2.0] and back.velocity == [0.0, 0.5]
    assert back.effort == [] and back.header.stamp.sec > 0
    with pytest.raises(ValueError, match="position must have 2 values, got 3"):
        tensors.joint_state_msg(["a", "b"], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="effort has non-finite"):
        tensors.joint_state_msg(["a", "b"], [1.0, 2.0], effort=[math.inf, 0.0])


def test_image_tensor_round_trip_and_row_padding():
    pixels = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    msg = tensors.image_msg(pixels, "rgb8")
    assert (msg.height, msg.width, msg.step) == (5, 7, 21)
    assert torch.equal(tensors.image_tensor(Image.deserialize(msg.serialize())), pixels)
    padded = bytearray()
    for row in range(5):
        padded += bytes(msg.data[row * 21 : (row + 1) * 21]) + b"\xff" * 3
    msg.step, msg.data = 24, bytes(padded)
    assert torch.equal(tensors.image_tensor(msg), pixels)
    msg.data = msg.data[:-1]
    with pytest.raises(ValueError, match="needs 120 bytes"):
        tensors.image_tensor(msg)
    with pytest.raises(ValueError, match="'yuv422'"):
        tensors.image_tensor(Image(encoding="yuv422"))
    with pytest.raises(ValueError, match=r"\[1, H, W\] uint8"):
        tensors.image_msg(pixels, "mono8")


def test_time_msg():
    stamp = tensors.time_msg(12.25)
    assert (stamp.sec, stamp.nanosec) == (12, 250_000_000)
    assert tensors.time_seconds(stamp) == 12.25
    with pytest.raises(ValueError, match="nan"):
        tensors.time_msg(float("nan"))


def test_a_pose_becomes_position_and_a_w_first_unit_quaternion_or_is_refused():
    w, x, y, z = 0.5, -0.5, 0.5, 0.5  # four different components: a swapped field cannot pass
    msg = tensors.pose_msg([0.1, -0.2, 0.3], [w, x, y, z], frame_id="base")
    o = msg.pose.orientation
    assert (o.x, o.y, o.z, o.w) == (x, y, z, w) and msg.header.frame_id == "base"  # ROS's fields
    position, quat = tensors.pose_tensors(msg)
    assert position.tolist() == [0.1, -0.2, 0.3] and position.dtype == torch.float64
    assert quat.tolist() == [w, x, y, z]
    # a tracker's -q (the same rotation) comes out w-first with w >= 0
    _, quat = tensors.pose_tensors(tensors.pose_msg([0, 0, 0], [-w, -x, -y, -z]))
    assert quat.tolist() == [w, x, y, z]
    # a tracker's rounding (norm 1.005) is normalised; further off it is no rotation
    _, quat = tensors.pose_tensors(tensors.pose_msg([0, 0, 0], [1.005, 0, 0, 0]))
    assert quat.tolist() == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"not a unit quaternion: norm 1\.0200"):
        tensors.pose_tensors(tensors.pose_msg([0, 0, 0], [1.02, 0, 0, 0]))
    with pytest.raises(ValueError, match="non-finite"):
        tensors.pose_tensors(tensors.pose_msg([0, math.inf, 0], [1, 0, 0, 0]))
