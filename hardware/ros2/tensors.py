"""Torch tensors to and from the ROS 2 messages a robot path uses: joint states in, commands out, camera
frames in. Commands are checked before they are built (non-finite values and wrong lengths are refused,
by name), so a bad action never reaches the wire."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from robotrl.hardware.ros2.msgs import (
    Float64MultiArray,
    Header,
    Image,
    JointState,
    MultiArrayDimension,
    MultiArrayLayout,
    Point,
    Pose,
    PoseStamped,
    Quaternion,
    Time,
)

# A measured orientation is taken as a rotation only within this of unit norm (then normalised); further off,
# the message is not a rotation at all (a zeroed quaternion from a tracker that lost its markers, say).
UNIT_QUATERNION_TOLERANCE = 0.01

IMAGE_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}


def time_msg(seconds: float | None = None) -> Time:
    """builtin_interfaces/Time for `seconds` since the epoch (now if None)."""
    seconds = time.time() if seconds is None else seconds
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a ROS 2 time must be finite and >= 0 seconds, got {seconds!r}")
    nanoseconds = round(seconds * 1e9)
    return Time(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def time_seconds(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def joint_state_tensor(
    msg: JointState,
    joint_names: Sequence[str] | None = None,
    field: str = "position",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """One field of a JointState (`position`, `velocity` or `effort`) as a 1-D tensor, in the order of
    `joint_names` when given (a JointState may list joints in any order, and more of them)."""
    if field not in ("position", "velocity", "effort"):
        raise ValueError(f"JointState field must be 'position', 'velocity' or 'effort', got {field!r}")
    values = getattr(msg, field)
    if joint_names is None:
        return torch.tensor(values, dtype=dtype)
    if len(values) != len(msg.name):
        raise ValueError(f"JointState has {len(msg.name)} names but {len(values)} {field} values")
    index = {name: i for i, name in enumerate(msg.name)}
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise KeyError(f"JointState lacks joints {missing} (it has {list(msg.name)})")
    return torch.tensor([values[index[name]] for name in joint_names], dtype=dtype)


def _command_values(values: torch.Tensor | Sequence[float], what: str, length: int | None) -> torch.Tensor:
    tensor = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    if tensor.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(tensor.shape)}")
    if length is not None and tensor.numel() != length:
        raise ValueError(f"{what} must have {length} values, got {tensor.numel()}")
    bad = (~torch.isfinite(tensor)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"{what} has non-finite values at indices {bad}: {tensor[bad].tolist()}")
    return tensor


def float64_multi_array(
    values: torch.Tensor | Sequence[float], length: int | None = None, label: str = ""
) -> Float64MultiArray:
    """A command as std_msgs/Float64MultiArray (what ros2_control's forward controllers read), checked:
    1-D, `length` values when given, all finite."""
    tensor = _command_values(values, "Float64MultiArray command", length)
    dim = MultiArrayDimension(label=label, size=tensor.numel(), stride=tensor.numel())
    return Float64MultiArray(layout=MultiArrayLayout(dim=[dim]), data=tensor.tolist())


def joint_state_msg(
    names: Sequence[str],
    position: torch.Tensor | Sequence[float],
    velocity: torch.Tensor | Sequence[float] | None = None,
    effort: torch.Tensor | Sequence[float] | None = None,
    stamp: Time | None = None,
    frame_id: str = "",
) -> JointState:
    """A JointState (as a simulated robot publishes it): one value per name in each given field, all finite."""
    names = list(names)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"joint names must be strings, got {names!r}")

    def field(values: torch.Tensor | Sequence[float] | None, what: str) -> list[float]:
        return [] if values is None else _command_values(values, f"JointState {what}", len(names)).tolist()

    return JointState(
        header=Header(stamp=stamp if stamp is not None else time_msg(), frame_id=frame_id),
        name=names,
        position=field(position, "position"),
        velocity=field(velocity, "velocity"),
        effort=field(effort, "effort"),
    )


def image_tensor(msg: Image) -> torch.Tensor:
    """An 8-bit Image as a [C, H, W] uint8 tensor in its own channel order (row padding in `step` removed)."""
    channels = IMAGE_CHANNELS.get(msg.encoding)
    if channels is None:
        raise ValueError(f"image encoding {msg.encoding!r} is not one of {sorted(IMAGE_CHANNELS)}")
    row = msg.width * channels
    if msg.step < row or len(msg.data) != msg.step * msg.height:
        raise ValueError(
            f"{msg.encoding} image {msg.width}x{msg.height} with step {msg.step} needs "
            f"{msg.step * msg.height} bytes (step >= {row}), got {len(msg.data)}"
        )
    if msg.height == 0 or msg.width == 0:
        return torch.empty(channels, msg.height, msg.width, dtype=torch.uint8)
    rows = torch.frombuffer(bytearray(msg.data), dtype=torch.uint8).view(msg.height, msg.step)
    return rows[:, :row].reshape(msg.height, msg.width, channels).permute(2, 0, 1).contiguous()


def image_msg(pixels: torch.Tensor, encoding: str = "rgb8", stamp: Time | None = None, frame_id: str = "") -> Image:
    """A [C, H, W] uint8 tensor as a packed Image (step = width * channels)."""
    channels = IMAGE_CHANNELS.get(encoding)
    if channels is None:
        raise ValueError(f"image encoding {encoding!r} is not one of {sorted(IMAGE_CHANNELS)}")
    if pixels.dtype != torch.uint8 or pixels.ndim != 3 or pixels.shape[0] != channels:
        raise ValueError(
            f"{encoding} needs a [{channels}, H, W] uint8 tensor, got {pixels.dtype} {tuple(pixels.shape)}"
        )
    _, height, width = pixels.shape
    data = pixels.detach().cpu().permute(1, 2, 0).contiguous().numpy().tobytes()
    header = Header(stamp=stamp if stamp is not None else time_msg(), frame_id=frame_id)
    return Image(header=header, height=height, width=width, encoding=encoding, step=width * channels, data=data)


def pose_tensors(msg: PoseStamped, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """A PoseStamped as (position [3], orientation [4] in MuJoCo's order w, x, y, z; ROS gives x, y, z, w).

    The orientation is normalised and its sign chosen so w >= 0 (q and -q are one rotation; trackers report
    either, MuJoCo's near-upright bodies have w > 0). A non-finite value or an orientation that is not a unit
    quaternion (within UNIT_QUATERNION_TOLERANCE) raises ValueError naming it: it is never a measurement."""
    p, o = msg.pose.position, msg.pose.orientation
    position = torch.tensor([p.x, p.y, p.z], dtype=torch.float64)
    quat = torch.tensor([o.w, o.x, o.y, o.z], dtype=torch.float64)
    if not (torch.isfinite(position).all() and torch.isfinite(quat).all()):
        raise ValueError(
            f"pose has non-finite values: position {position.tolist()}, orientation (wxyz) {quat.tolist()}"
        )
    norm = float(quat.norm())
    if abs(norm - 1.0) > UNIT_QUATERNION_TOLERANCE:
        raise ValueError(f"pose orientation is not a unit quaternion: norm {norm:.4f} (wxyz {quat.tolist()})")
    quat = quat / norm
    if quat[0] < 0:
        quat = -quat
    return position.to(dtype), quat.to(dtype)


def pose_msg(
    position: Sequence[float], quat_wxyz: Sequence[float], stamp: Time | None = None, frame_id: str = ""
) -> PoseStamped:
    """A PoseStamped from a position and a w, x, y, z orientation (MuJoCo's order)."""
    x, y, z = (float(v) for v in position)
    w, qx, qy, qz = (float(v) for v in quat_wxyz)
    header = Header(stamp=stamp if stamp is not None else time_msg(), frame_id=frame_id)
    return PoseStamped(header=header, pose=Pose(Point(x, y, z), Quaternion(qx, qy, qz, w)))
