"""Observation assembly for the robot env: the newest messages to observation entries, each input's age checked.

`ObservationAssembler.assemble` takes what the robot link received (a parsed joint state, and each tracked
object's and camera's newest `Received`: message, receipt time) and gives the observation the simulated task
would, with `info` saying how old it is and, when it must not be acted on, why (`stale_reason`): a joint state
too old or refused by the shield, an object pose missing, old, not a pose, in another frame or jumped faster
than `max_object_speed` (`ObjectPoses`), a camera silent or old, a non-finite entry. A camera frame (a
sensor_msgs/Image or a USB camera's RGB array) is cut to its `camera_crops` region and area-resized to
`image_size`, as simulation does it (robotrl/core/camera_crop.py). `late_reason` says when
an action computed from that observation arrives too late to send. Pixel entries are stacked as training
stacked them (`robotrl.runtime.frame_stack`). Nothing here opens a topic: tests feed it plain messages.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from robotrl.hardware.robot_kinematics import Kinematics, rotation_matrix

from robotrl.core.camera_crop import crop_and_resize
from robotrl.core.deploy_spec import GOAL_PARTS
from robotrl.core.robot_spec import RobotSpec
from robotrl.core.rotations import quat_conjugate, quat_multiply
from robotrl.runtime.frame_stack import fresh_stack, push_frame

log = logging.getLogger(__name__)

Pose = tuple[np.ndarray, np.ndarray]  # position [3], orientation wxyz [4], float32


class StaleObservationError(RuntimeError):
    """An observation was older than its age limit (on_stale=raise)."""


class ObjectPart(NamedTuple):
    """What an observation entry takes from a tracked object's pose (robotrl/core/deploy_spec.py, OBJECT_PARTS)."""

    object: str
    part: str  # pos | quat (w, x, y, z) | from_ee | from_palm | to_goal | quat_to_goal
    goal: str | None = None  # the goal of to_goal and quat_to_goal


def object_entries(objects: list[str], goals: dict[str, tuple[int, ...]]) -> dict[str, ObjectPart]:
    """The observation entries that tracked objects give by default, named as the arm tasks name them: `<object>_pos`,
    `<object>_quat`, `to_<object>` (object - ee_pos) and, for each goal of at most 3 values, `<object>_to_<goal>`
    (goal - the object's position in its dimensions; panda_push's `puck_to_goal`). A deploy spec names its own
    (`object_parts`: a hand's task observes its cube from the palm)."""
    entries: dict[str, ObjectPart] = {}
    for name in objects:
        entries.update(
            {
                f"{name}_pos": ObjectPart(name, "pos"),
                f"{name}_quat": ObjectPart(name, "quat"),
                f"to_{name}": ObjectPart(name, "from_ee"),
            }
        )
        for goal, shape in goals.items():
            if len(shape) == 1 and 1 <= shape[0] <= 3:
                entries[f"{name}_to_{goal}"] = ObjectPart(name, "to_goal", goal)
    return entries


# the keys the arm tasks give the robot's own state: role -> observation entry (a deploy spec names its own)
ARM_STATE_KEYS = {"position": "arm_qpos", "velocity": "arm_qvel", "tool_point": "ee_pos"}
STATE_ROLES = ("position", "velocity", "tool_point", "fingertips")


def quat_between(goal: np.ndarray, quat: np.ndarray) -> np.ndarray:
    """The rotation [4] from orientation `quat` to `goal` (goal * conj(quat)), in float32 as the tasks compute it."""
    goal_t, quat_t = torch.as_tensor(goal, dtype=torch.float32), torch.as_tensor(quat, dtype=torch.float32)
    return quat_multiply(goal_t, quat_conjugate(quat_t)).numpy()


@dataclass
class JointReading:
    position: torch.Tensor  # float64 [n] arm joints, spec order
    velocity: torch.Tensor | None
    gripper: float | None  # first gripper joint (metres per finger)
    stamp: float  # time.monotonic() when it was measured (header.stamp through StampClock)


def read_joint_state(msg, received_at: float, spec: RobotSpec, clock) -> JointReading:
    """A sensor_msgs/JointState matched to the spec's joints by name; `clock` (a StampClock) turns its header
    stamp into this machine's monotonic time. KeyError or ValueError when it does not fit the robot."""
    # lazy: tensors imports the message types, which need cyclonedds (the ros extra)
    from robotrl.hardware.ros2.tensors import joint_state_tensor, time_seconds

    joints = list(spec.joints)
    position = joint_state_tensor(msg, joints, "position", torch.float64)
    velocity = joint_state_tensor(msg, joints, "velocity", torch.float64) if len(msg.velocity) else None
    gripper = None
    if spec.gripper is not None and spec.gripper.joints[0] in msg.name:
        gripper = float(msg.position[list(msg.name).index(spec.gripper.joints[0])])
    return JointReading(position, velocity, gripper, clock.measured_at(time_seconds(msg.header.stamp), received_at))


class ObjectPoses:
    """Tracked objects' poses as the policy may act on them: each object's last good pose (what a stale
    observation holds) and the position last acted on, against which a jump is judged (`max_object_speed`)."""

    UNKNOWN: Pose = (np.zeros(3, np.float32), np.array([1.0, 0.0, 0.0, 0.0], np.float32))

    def __init__(self, cfg, stats: Counter[str]):
        self.cfg, self.stats = cfg, stats
        self.last_good: dict[str, Pose] = {}
        self.last_acted: dict[str, tuple[np.ndarray, float]] = {}  # cleared at each reset (forget_motion)

    def read(self, received, count: bool = True) -> tuple[Pose, float, str | None]:
        """(position, wxyz orientation) of the newest pose `received` (a bridge `Received` or None), when it
        arrived (monotonic), and what keeps it from being acted on (None: fresh and valid). Observations built
        on a pose that is not one (NaN, a zero quaternion, another frame) are counted in `bad_object_pose`
        (with `count`)."""
        # lazy: tensors imports the message types, which need cyclonedds (the ros extra)
        from robotrl.hardware.ros2.tensors import pose_tensors, time_seconds

        cfg, unknown = self.cfg, self.UNKNOWN
        if received is None:
            return unknown, math.nan, "has sent no pose"
        age = received.age()
        if age > cfg.max_object_age:
            return unknown, received.received_at, f"pose {age * 1e3:.0f} ms old"
        if cfg.max_object_stamp_age:
            behind = time.time() - time_seconds(received.msg.header.stamp)
            if behind > cfg.max_object_stamp_age:
                return unknown, received.received_at, f"pose stamped {behind * 1e3:.0f} ms before now"
        frame = received.msg.header.frame_id
        if cfg.object_frame and frame != cfg.object_frame:
            self.stats["bad_object_pose"] += count
            return (
                unknown,
                received.received_at,
                f"pose in frame {frame!r}, not hardware.object_frame {cfg.object_frame!r}",
            )
        try:
            position, quat = pose_tensors(received.msg, torch.float32)
        except ValueError as error:
            self.stats["bad_object_pose"] += count
            return unknown, received.received_at, str(error)
        return (position.numpy(), quat.numpy()), received.received_at, None

    def jump(self, name: str, position: np.ndarray, received_at: float) -> str | None:
        """Why `position` cannot be where the object went since the position last acted on (faster than
        max_object_speed: a tracker glitch), or None. Counted in `object_jumps`."""
        last = self.last_acted.get(name)
        if not self.cfg.max_object_speed or last is None:
            return None
        distance, elapsed = float(np.linalg.norm(position - last[0])), max(received_at - last[1], 1e-3)
        if distance <= self.cfg.max_object_speed * elapsed:
            return None
        self.stats["object_jumps"] += 1
        return (
            f"pose jumped {distance * 1e3:.0f} mm in {elapsed * 1e3:.0f} ms (faster than hardware.max_object_speed "
            f"{self.cfg.max_object_speed} m/s)"
        )

    def observe(self, name: str, received) -> tuple[Pose, float, str | None]:
        """The pose to observe for `name`: the newest one if it may be acted on (then it becomes the last good
        and the last acted on), else the last good one (never a made-up one), with the problem."""
        pose, received_at, problem = self.read(received)
        problem = problem or self.jump(name, pose[0], received_at)
        if problem:
            return self.last_good.get(name, pose), received_at, problem
        self.last_good[name] = pose
        self.last_acted[name] = (pose[0], received_at)
        return pose, received_at, None

    def forget_motion(self) -> None:
        """A person moved the objects between episodes: no jump is judged across a reset."""
        self.last_acted.clear()


def frame_tensor(msg) -> torch.Tensor:
    """A camera frame of either source as a [3, H, W] uint8 RGB tensor: a USB camera's HxWx3 RGB array as is, a
    sensor_msgs/Image through its encoding (mono8 repeated into three channels, bgr flipped, alpha dropped)."""
    if isinstance(msg, np.ndarray):
        if msg.dtype != np.uint8 or msg.ndim != 3 or msg.shape[2] != 3:
            raise ValueError(f"a camera frame must be an HxWx3 uint8 RGB array, got {msg.dtype} {msg.shape}")
        return torch.from_numpy(msg).permute(2, 0, 1)
    # lazy: tensors imports the message types, which need cyclonedds (the ros extra)
    from robotrl.hardware.ros2.tensors import image_tensor

    pixels = image_tensor(msg)
    if pixels.shape[0] == 1:  # mono8: the observation space (and the policy) take three channels
        pixels = pixels.expand(3, -1, -1)
    pixels = pixels[:3]
    if msg.encoding.startswith("bgr"):
        pixels = pixels.flip(0)
    return pixels


class ObservationAssembler:
    """The observation space and, from received inputs, each observation (see the module docstring).

    `goal` is the env's own goal dict (shared: a reset's drawn goals and an actor's goal ranges write into it)."""

    def __init__(
        self,
        cfg,
        spec: RobotSpec,
        kinematics: Kinematics,
        stats: Counter[str],
        goal: dict[str, np.ndarray],
        relative_goal: dict[str, str],
        held: dict[str, np.ndarray],
        held_relative: dict[str, tuple[str, str]],
        gripper_obs: bool = False,
        frame_stack: int = 1,
        observe: list[str] | None = None,
        state_keys: Mapping[str, str] | None = None,
        object_parts: Mapping[str, ObjectPart] | None = None,
    ):
        """`state_keys`: role (position, velocity, tool_point, fingertips) -> the entry that gives it (None: the arm
        tasks' names, ARM_STATE_KEYS); `object_parts`: entry -> what it takes from a tracked object (None: the arm
        tasks' names for every object in hardware.objects, `object_entries`)."""
        self.cfg, self.spec, self.kinematics, self.stats = cfg, spec, kinematics, stats
        self.goal, self.relative_goal, self.held, self.held_relative = goal, relative_goal, held, held_relative
        self.gripper_obs, self.frame_stack = gripper_obs, frame_stack
        self.state_keys = dict(ARM_STATE_KEYS if state_keys is None else state_keys)
        unknown = sorted(set(self.state_keys) - set(STATE_ROLES))
        if unknown:
            raise ValueError(f"state_keys names roles {unknown}; the robot's state gives {list(STATE_ROLES)}")
        if "tool_point" in self.state_keys and kinematics.site < 0:
            self.state_keys.pop("tool_point")  # a hand on a fixed wrist has none (its entries need none)
        if "fingertips" in self.state_keys and not (spec.fingertip_sites and spec.palm_site):
            raise ValueError(f"the policy observes fingertips; robot {spec.name!r} names no fingertip and palm sites")
        n = len(spec.joints)
        box = gym.spaces.Box
        sizes = {"position": n, "velocity": n, "tool_point": 3, "fingertips": 3 * len(spec.fingertip_sites)}
        spaces = {key: box(-np.inf, np.inf, (sizes[role],), np.float32) for role, key in self.state_keys.items()}
        if gripper_obs:
            spaces["gripper"] = box(-np.inf, np.inf, (1,), np.float32)
        for key, value in goal.items():
            spaces[key] = box(-np.inf, np.inf, value.shape, np.float32)
        for key in relative_goal:
            spaces[key] = box(-np.inf, np.inf, (3,), np.float32)
        for key in (*held, *held_relative):
            if key in spaces:
                raise ValueError(f"observation entry {key!r} is given twice (a held point and another entry)")
            spaces[key] = box(-np.inf, np.inf, (3,), np.float32)
        # entry -> what it takes from a measured object pose (hardware.objects)
        entries = (
            dict(object_parts)
            if object_parts is not None
            else object_entries(cfg.objects, {k: v.shape for k, v in goal.items()})
        )
        clash = sorted(set(cfg.objects) & set(goal))
        if clash:
            raise ValueError(f"{clash} named both as tracked objects (hardware.objects) and as goals")
        clash = sorted(set(entries) & set(spaces))
        if clash:
            raise ValueError(f"observation entries {clash} would come both from hardware.objects and from a goal")
        for key, entry in entries.items():
            if entry.object not in cfg.objects:
                raise ValueError(f"observation entry {key!r} reads object {entry.object!r}, not in hardware.objects")
            if entry.part in ("from_ee", "from_palm") and (entry.part == "from_ee") != (kinematics.site >= 0):
                raise ValueError(f"observation entry {key!r}: robot {spec.name!r} has no point for {entry.part}")
            if entry.part in GOAL_PARTS and entry.goal not in goal:
                raise ValueError(f"observation entry {key!r} is measured against goal {entry.goal!r}, not given")
            size = {"quat": 4, "quat_to_goal": 4, "to_goal": goal[entry.goal].shape[0] if entry.goal in goal else 0}
            spaces[key] = box(-np.inf, np.inf, (size.get(entry.part, 3),), np.float32)
        for name in cfg.cameras:  # frame_stack camera frames per pixel entry, oldest first (as FrameStack)
            spaces[f"pixels_{name}"] = box(0, 255, (3 * frame_stack, cfg.image_size, cfg.image_size), np.uint8)
        if observe is not None:  # the entries the policy reads (a pixel policy may read no joint state)
            spaces = {key: space for key, space in spaces.items() if key in observe}
        self.observation_space = gym.spaces.Dict(spaces)
        self.object_entries = {k: v for k, v in entries.items() if k in spaces}
        # only the objects the policy observes are listened to (and can make an observation stale)
        self.tracked_objects = [
            name for name in cfg.objects if any(e.object == name for e in self.object_entries.values())
        ]
        # a hand's palm, fixed on its wrist: where its fingertips and objects are measured from
        self.palm = (
            kinematics.site_positions(spec.home.double().numpy(), (spec.palm_site,))[0] if spec.palm_site else None
        )
        self.objects = ObjectPoses(cfg, stats)
        self.ages: list[float] = []  # joint-state age at each observation (s)
        self.state: JointReading | None = None  # the state the last observation was built from
        self.fresh = False
        # what else the last observation was built from: (what, when it arrived (monotonic), its age limit's
        # setting, that limit in s); its action is late once any of them aged past the limit plus a period
        self.inputs: list[tuple[str, float, str, float]] = []
        self._stacks: dict[str, torch.Tensor] = {}  # pixel key -> the last frame_stack frames [3k, H, W]

    def assemble(
        self, state: JointReading | None, refused: str | None, now: float, poses: dict, frames: dict
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The observation from the newest inputs, and whether it is fresh enough to act on. `refused`: why
        the shield refuses `state` (None: it does not); `poses` and `frames`: each tracked object's and
        camera's newest `Received` (missing or None: nothing arrived); `now`: time.monotonic()."""
        cfg, info = self.cfg, {}
        if state is None:
            raise StaleObservationError(f"no joint state has arrived on {cfg.joint_states_topic}")
        age = now - state.stamp
        info["observation_age"] = age
        self.ages.append(age)
        stale = [f"joint_states {age * 1e3:.1f} ms old"] if age > cfg.max_state_age else []
        if refused is not None:
            stale.append(f"joint_states refused by the shield ({refused})")
        q = state.position.numpy()
        ee, ee_quat = self.kinematics.pose(q)[:2] if self.kinematics.site >= 0 else (None, None)
        velocity = state.velocity.numpy() if state.velocity is not None else np.zeros(len(q))
        roles = {"position": q, "velocity": velocity}
        if "tool_point" in self.state_keys:
            roles["tool_point"] = ee
        if "fingertips" in self.state_keys:
            roles["fingertips"] = (self.kinematics.site_positions(q, self.spec.fingertip_sites) - self.palm).reshape(-1)
        obs = {key: roles[role].astype(np.float32) for role, key in self.state_keys.items()}
        if self.gripper_obs:
            opening = state.gripper if state.gripper is not None else math.nan
            obs["gripper"] = np.array([opening / self.spec.gripper.open], np.float32)
        for key, value in self.goal.items():
            obs[key] = value.copy()
        for key, goal in self.relative_goal.items():
            obs[key] = (self.goal[goal] - ee).astype(np.float32)
        if self.held:
            tool = rotation_matrix(ee_quat)
            held = {key: ee + tool @ offset for key, offset in self.held.items()}
            for key, point in held.items():
                obs[key] = point.astype(np.float32)
            for key, (goal, point) in self.held_relative.items():
                obs[key] = (self.goal[goal] - held[point]).astype(np.float32)
        positions, inputs = {}, []
        for name in self.tracked_objects:
            positions[name], received_at, problem = self.objects.observe(name, poses.get(name))
            if problem:  # stale: the last good pose (as a stale joint state is the last state)
                stale.append(f"object {name} {problem}")
            else:
                inputs.append((f"object {name} pose", received_at, "max_object_age", cfg.max_object_age))
        for key, entry in self.object_entries.items():
            position, quat = positions[entry.object]
            if entry.part == "pos":
                obs[key] = position.copy()  # a copy: the last good pose is kept for a stale observation
            elif entry.part == "quat":
                obs[key] = quat.copy()
            elif entry.part == "from_ee":
                obs[key] = (position - ee).astype(np.float32)
            elif entry.part == "from_palm":
                obs[key] = (position - self.palm).astype(np.float32)
            elif entry.part == "quat_to_goal":  # the rotation still to make: goal * conj(quat), as the task
                obs[key] = quat_between(self.goal[entry.goal], quat)
            else:  # the goal minus the object's position, in the goal's dimensions
                goal = self.goal[entry.goal]
                obs[key] = (goal - position[: goal.shape[0]]).astype(np.float32)
        for name in cfg.cameras:
            received = frames.get(name)
            if received is None or received.age() > cfg.max_image_age:
                stale.append(f"camera {name} " + ("has sent nothing" if received is None else "frame too old"))
                obs[f"pixels_{name}"] = np.zeros((3, cfg.image_size, cfg.image_size), np.uint8)
                continue
            obs[f"pixels_{name}"] = self.image(received.msg, name)
            inputs.append((f"camera {name} frame", received.received_at, "max_image_age", cfg.max_image_age))
        if not all(np.isfinite(v).all() for k, v in obs.items() if not k.startswith("pixels_")):
            stale.append("non-finite state")
        info["stale_observation"] = int(bool(stale))
        if stale:
            self.stats["stale_observations"] += 1
            info["stale_reason"] = "; ".join(stale)
            if cfg.on_stale == "raise":
                raise StaleObservationError(f"observation not fresh: {info['stale_reason']}")
        self.state, self.inputs, self.fresh = state, inputs, not stale
        return {key: obs[key] for key in self.observation_space.spaces}, info

    def late_reason(self, now: float, policy_period: float) -> str | None:
        """Why an action computed from the last (fresh) observation comes too late to send (its joint state, one
        of its tracked poses or one of its camera frames aged past its limit plus one policy period since
        arriving), or None."""
        cfg = self.cfg
        inputs = [("joint state", self.state.stamp, "max_state_age", cfg.max_state_age), *self.inputs]
        for what, received_at, setting, limit in inputs:
            age = now - received_at
            if age > limit + policy_period:
                return f"{what} is {age * 1e3:.1f} ms old (hardware.{setting} {limit * 1e3:.0f} ms + a period)"
        return None

    def image(self, msg, camera: str | None = None) -> np.ndarray:
        """A camera frame as a [3, S, S] uint8 pixel entry: `msg` a sensor_msgs/Image (mono8 grey in all three
        channels, bgr turned to rgb) or a USB camera's HxWx3 RGB array (hardware/cameras.py), cut to `camera`'s
        crop (`hardware.camera_crops`; None: the whole frame) and area-resized, as simulation does
        (robotrl/core/camera_crop.py)."""
        crop = None if camera is None else self.cfg.camera_crop(camera)
        return crop_and_resize(frame_tensor(msg), crop, self.cfg.image_size).numpy()

    def stack(self, obs: dict[str, np.ndarray], fresh: bool) -> dict[str, np.ndarray]:
        """Pixel entries as the last `frame_stack` frames on the channel axis; at an episode's start (`fresh`)
        the first frame fills the stack, as robotrl/runtime/frame_stack.py does in simulation."""
        if self.frame_stack == 1:
            return obs
        for key in [k for k in obs if k.startswith("pixels_")]:
            frame = torch.from_numpy(obs[key])
            stack = fresh_stack(frame, self.frame_stack) if fresh else push_frame(self._stacks[key], frame)
            self._stacks[key] = stack
            obs[key] = stack.numpy().copy()
        return obs
