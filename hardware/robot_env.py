"""A gymnasium env over the ROS 2 bridge: a real robot (or `robotrl-sim-twin`) as a policy sees it.

    env = RobotEnv(RobotEnvConfig(domain_id=42), control="ee_delta", goal={"target": [0.5, 0.0, 0.3]},
                   relative_goal={"to_target": "target"})
    obs, info = env.reset()                      # moves to the spec's home pose through the shield
    obs, reward, terminated, truncated, info = env.step(action)
    env.close()                                  # no new commands; the arm finishes its move and rests

Observations are built from topics: `/joint_states` gives the state entries every simulated arm task
shares (`arm_qpos`, `arm_qvel`, `ee_pos` by forward kinematics of the robot's MJCF, `gripper` when a task
uses it), `goal` gives the task entries a robot cannot measure (a target, a hole) as fixed values and
`relative_goal` those that are `goal - ee_pos`; cameras give `pixels_<name>` ([3, S, S] uint8; a mono8
camera's grey is repeated in the three channels); tracked objects (`objects`, a geometry_msgs/PoseStamped
each from a motion-capture system or a fiducial detector) give `<name>_pos`, `<name>_quat`, `to_<name>` and
`<name>_to_<goal>` (`object_entries`); a pose that jumped from the last one acted on faster than
`max_object_speed` (a marker swap) is not acted on until it could be real.

Between episodes, once home, `reset()` waits (up to `scene_timeout`) for a person to put each tracked object
with a `start_regions` box (the box the simulated task starts it in: push's puck, pick's cube) back in it and
leave it still for `scene_settle`, and refuses by name (`SceneResetError`) when nobody does: no episode starts
from a layout the policy never saw (`reset(options={"cancel": event})` ends the wait early: `EnvCancelled`).
A shield latched meanwhile (an e-stop pressed at the table) refuses the reset until acknowledged. A
`goal_sampler` (the task's own `draw_goals`) then draws the episode's goals, as simulation does: reach's
target from its box, push's goal around where the puck now is.

Every observation's age is checked (time since the newest message arrived): a stale one is never acted on; the
step sends no command (the shield holds) and reports `stale_observation` in `info`, or raises
`StaleObservationError` (`on_stale=raise`). Nor is an action whose observation has aged past
`max_state_age` (its tracked poses past `max_object_age`, its camera frames past `max_image_age`) plus one
policy period by the time `step` receives it (`late_action`).

Commands: a control thread runs at `control_rate_hz` (the shield's control period) and, every period,
passes the newest policy command (or None) through `robotrl.safety.Shield.filter` with the newest joint
state, then publishes the shield's setpoint on `/<controller>/commands` (std_msgs/Float64MultiArray, the
forward_position_controller of ros2_control) and the gripper on `/<gripper_controller>/commands`. The
policy runs at `policy_rate_hz`: `step()` converts the action to joint targets as the simulated task's
controller does (ee_delta: damped least-squares IK holding the start orientation, the motion in the tool's
start frame under `relative_frame`; joint_delta; joint_position), hands it to the control thread and
returns the observation at the next policy tick. The shield's corrections in that policy period are
reported in `info` (`safety/<kind>`: control periods in which it fired). An e-stop topic (std_msgs/Bool)
latches the shield's e-stop: every true message does, however short the press, from a latched or a
default-QoS publisher; it counts as pressed while any live publisher on it last said true
(`hardware/estop.py`). After its release, a true message on the acknowledgement topic (or
`acknowledge_estop()`) lets the next `reset()` restart. Until then every reset is refused, so an episode's
automatic reset never drives the arm after a stop by itself; nor does a reset start while nothing publishes
on the e-stop topic (`require_estop_publisher`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym
import mujoco
from robotrl.hardware.estop import EStopInput
from robotrl.hardware.realtime import check_priority, lock_memory, set_realtime_priority
from robotrl.hardware.robot_vec_env import goal_box
from robotrl.hardware.ros2.names import full_topic_name, topic_for
from robotrl.hardware.state_clock import StampClock

from robotrl.core.env import EnvCancelled
from robotrl.core.robot_spec import RobotSpec, load_robot_spec
from robotrl.safety import EStopLatchedError, Shield, ShieldConfig, ShieldResetError

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "tasks" / "assets"
CONTROLS = ("ee_delta", "joint_delta", "joint_position")
ON_STALE = ("hold", "raise")


def object_entries(objects: list[str], goals: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, str]]:
    """The observation entries that tracked objects give, named as the simulated tasks name them:
    entry -> (object, what), `what` being pos, quat (w, x, y, z), from_ee (`to_<object>`: object - ee_pos) or
    the name of a goal of at most 3 values (`<object>_to_<goal>`: goal - the object's position in its
    dimensions; panda_push's `puck_to_goal`)."""
    entries: dict[str, tuple[str, str]] = {}
    for name in objects:
        entries.update({f"{name}_pos": (name, "pos"), f"{name}_quat": (name, "quat"), f"to_{name}": (name, "from_ee")})
        for goal, shape in goals.items():
            if len(shape) == 1 and 1 <= shape[0] <= 3:
                entries[f"{name}_to_{goal}"] = (name, goal)
    return entries


SETTLE_DISTANCE = 0.005  # m: an object that moves less than this while it settles is still


class StaleObservationError(RuntimeError):
    """An observation was older than its age limit (on_stale=raise)."""


class EStopMissingError(ShieldResetError):
    """reset() was refused: nothing publishes on the e-stop topic (`require_estop_publisher`)."""


class ResetTimeoutError(TimeoutError):
    """reset() did not reach the home pose within reset_timeout."""


class SceneResetError(ResetTimeoutError):
    """reset() found the tracked objects not back in their start regions within scene_timeout (or, with the
    scene not checked, no fresh pose to draw the episode's goals around within reset_timeout)."""


@dataclass
class RobotEnvConfig:
    """One robot's connection, rates and limits. `configs/hardware/<name>.yaml` gives one per robot; the
    same keys drive the simulated twin (`hardware=sim_twin`) and a real arm (`hardware=panda`)."""

    robot: str = "panda"  # robotrl/core/robots/<robot>.yaml: joints, limits, home pose
    model: str | None = None  # MJCF for forward kinematics; None: tasks/assets/<robot>.xml
    backend: str = "dds"  # dds | rclpy | auto (hardware/ros2/bridge.py:make_bridge)
    domain_id: int = 0
    loopback: bool = True  # stay on this machine; false for a robot on the lab network
    joint_states_topic: str = "/joint_states"
    controller: str = "forward_position_controller"  # commands go to /<controller>/commands
    gripper_controller: str = "gripper_controller"  # /<...>/commands; "": none
    estop_topic: str = "/estop"  # std_msgs/Bool, latched or default QoS (hardware/estop.py); "": none
    # reset() waits (connect_timeout) for a live publisher on estop_topic and refuses to start without one: an
    # e-stop nobody publishes cannot stop the arm. A simulated robot may opt out; a real one never should
    require_estop_publisher: bool = True
    # std_msgs/Bool: a true message acknowledges a released e-stop, the operator's permission to restart;
    # volatile (never latched): an old acknowledgement must not release a stop that comes after it
    estop_ack_topic: str = "/estop_ack"
    state_qos: str = "default"
    command_qos: str = "default"
    control_rate_hz: float = 500.0  # command thread and shield period
    policy_rate_hz: float = 25.0  # step() rate; the simulated tasks run at 25 Hz (20 x 2 ms)
    max_state_age: float = 0.05  # s: a joint state older than this is stale
    max_image_age: float = 0.2  # s: a camera frame older than this is stale
    on_stale: str = "hold"  # hold (send nothing, report in info) | raise
    cameras: list[str] = field(default_factory=list)  # observation cameras -> pixels_<name>
    camera_topic: str = "/camera/{name}/image_raw"
    image_size: int = 84
    # Tracked objects (a motion-capture system, a fiducial detector): each name's geometry_msgs/PoseStamped on
    # object_topic gives the object entries a simulated task observes (`<name>_pos`, `<name>_quat`,
    # `to_<name>`, `<name>_to_<goal>`), in the frame the arm's forward kinematics gives ee_pos in (its base).
    objects: list[str] = field(default_factory=list)
    object_topic: str = "/objects/{name}/pose"
    object_frame: str = ""  # a pose whose header.frame_id is not this is refused; "": any frame
    max_object_age: float = 0.1  # s: a pose older than this is stale
    # s: a pose whose header.stamp is further than this behind this machine's clock is stale too (a relay that
    # republishes an old pose arrives fresh); needs the clocks synchronised (chrony, PTP). 0: not checked
    max_object_stamp_age: float = 0.0
    # m/s: a pose that moved faster than this from the last one acted on is a tracker glitch (a marker swap, a
    # fiducial mistaken for another) and makes the observation stale until the move could be real; 0: off
    max_object_speed: float = 3.0
    # s reset() waits, once home, for a person to put the tracked objects back in the task's start regions (and
    # leave them: still for scene_settle s); 0: not checked (goals drawn around objects still need their fresh
    # poses, within reset_timeout). The episode's drawn goals follow where the objects are.
    scene_timeout: float = 60.0
    scene_settle: float = 0.5
    # std_msgs/Bool true published once per reset that finds the scene not ready (an object out of its box, or
    # its pose stale or missing: a hand may be over the marker): for whatever puts objects back by itself (a
    # lab's reset routine, which must itself make sure nobody is at the table; the twin's); "": none
    scene_reset_topic: str = ""
    connect_timeout: float = 10.0  # s to wait for the first joint state
    reset_tolerance: float = 0.02  # rad: home reached when every joint is this close...
    reset_velocity: float = 0.05  # rad/s: ...and this slow
    reset_timeout: float = 20.0  # s
    close_timeout: float = 2.0  # s close() waits for the arm to come to rest
    realtime_priority: int = 0  # SCHED_FIFO priority (1-99) of the control thread; 0: normal scheduling
    lock_memory: bool = False  # mlockall: no page fault stalls the control thread (hardware/realtime.py)
    shield: dict[str, Any] = field(default_factory=dict)  # robotrl.safety.ShieldConfig fields (not control_period)

    def validate(self) -> None:
        for name in (
            "control_rate_hz",
            "policy_rate_hz",
            "max_state_age",
            "max_image_age",
            "max_object_age",
            "scene_settle",
            "connect_timeout",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"hardware.{name} must be a finite number > 0, got {value!r}")
        if self.policy_rate_hz > self.control_rate_hz:
            raise ValueError(
                f"hardware.policy_rate_hz ({self.policy_rate_hz}) must not exceed control_rate_hz "
                f"({self.control_rate_hz})"
            )
        check_priority("hardware.realtime_priority", self.realtime_priority)
        if not isinstance(self.lock_memory, bool):
            raise ValueError(f"hardware.lock_memory must be true or false, got {self.lock_memory!r}")
        if self.on_stale not in ON_STALE:
            raise ValueError(f"hardware.on_stale must be one of {', '.join(ON_STALE)}, got {self.on_stale!r}")
        if not self.controller:
            raise ValueError("hardware.controller must name the joint position controller")
        if not isinstance(self.require_estop_publisher, bool):
            raise ValueError(
                f"hardware.require_estop_publisher must be true or false, got {self.require_estop_publisher!r}"
            )
        if self.require_estop_publisher and not self.estop_topic:
            raise ValueError(
                "hardware.require_estop_publisher is true but hardware.estop_topic is empty: name the e-stop topic, "
                "or set require_estop_publisher=false (a simulated robot only)"
            )
        if "control_period" in self.shield:
            raise ValueError("hardware.shield.control_period is set from hardware.control_rate_hz; remove it")
        speed = self.max_object_speed
        if not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed >= 0):
            raise ValueError(f"hardware.max_object_speed must be >= 0 m/s (0: not checked), got {speed!r}")
        if not (math.isfinite(self.max_object_stamp_age) and self.max_object_stamp_age >= 0):
            raise ValueError(
                "hardware.max_object_stamp_age must be >= 0 seconds (0: not checked), got "
                f"{self.max_object_stamp_age!r}"
            )
        timeout = self.scene_timeout
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout >= 0):
            raise ValueError(f"hardware.scene_timeout must be >= 0 seconds (0: not checked), got {timeout!r}")
        if 0 < timeout < self.scene_settle:
            raise ValueError(
                f"hardware.scene_timeout ({timeout} s) is shorter than scene_settle ({self.scene_settle} s): no "
                "scene could ever be ready in time"
            )
        for name in ("reset_tolerance", "reset_velocity", "reset_timeout", "close_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"hardware.{name} must be > 0, got {getattr(self, name)!r}")
        self._check_topics()

    def _check_topics(self) -> None:
        """Every topic name the env will use, before a bridge joins the domain."""
        topics = [("joint_states_topic", self.joint_states_topic), ("controller", f"/{self.controller}/commands")]
        if self.gripper_controller:
            topics.append(("gripper_controller", f"/{self.gripper_controller}/commands"))
        names = ("estop_topic", "estop_ack_topic", "scene_reset_topic")
        topics += [(name, getattr(self, name)) for name in names if getattr(self, name)]
        for camera in self.cameras:
            topics.append(("camera_topic", topic_for(self.camera_topic, camera, "hardware.camera_topic")))
        bad = [name for name in self.objects if not (isinstance(name, str) and name.isidentifier())]
        if bad:
            raise ValueError(f"hardware.objects must be names such as puck or cube, got {bad}")
        if len(set(self.objects)) != len(self.objects):
            raise ValueError(f"hardware.objects names an object twice: {list(self.objects)}")
        for name in self.objects:
            topics.append(("object_topic", topic_for(self.object_topic, name, "hardware.object_topic")))
        for key, topic in topics:
            try:
                full_topic_name(topic)
            except (TypeError, ValueError) as error:
                raise ValueError(f"hardware.{key}: {error}") from None

    def shield_config(self) -> ShieldConfig:
        known = set(ShieldConfig.__dataclass_fields__)
        unknown = sorted(set(self.shield) - known)
        if unknown:
            raise ValueError(f"hardware.shield has unknown keys {unknown}; ShieldConfig has {sorted(known)}")
        values = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in dict(self.shield).items()}
        return ShieldConfig(control_period=1.0 / self.control_rate_hz, **values)


def _rotation_matrix(quat: np.ndarray) -> np.ndarray:
    """The 3x3 rotation of a unit quaternion (w, x, y, z)."""
    matrix = np.zeros(9)
    mujoco.mju_quat2Mat(matrix, np.asarray(quat, dtype=np.float64))
    return matrix.reshape(3, 3)


class _Kinematics:
    """The robot's MJCF in MuJoCo, for the tool point's pose and Jacobian at a measured joint position."""

    def __init__(self, model_file: Path, spec: RobotSpec):
        self.model = mujoco.MjModel.from_xml_path(str(model_file))
        self.data = mujoco.MjData(self.model)
        ids = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in spec.joints]
        if min(ids) < 0:
            raise KeyError(f"{model_file} lacks joints of robot {spec.name!r}: {spec.joints}")
        self.qpos = self.model.jnt_qposadr[ids]
        self.dofs = self.model.jnt_dofadr[ids]
        self.site = -1
        if spec.end_effector_site is not None:
            self.site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, spec.end_effector_site)
            if self.site < 0:
                raise KeyError(f"{model_file} has no site {spec.end_effector_site!r}")

    def pose(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(position [3], quaternion wxyz [4], Jacobian [6, n]) of the tool point at joint position q."""
        self.data.qpos[self.qpos] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)
        jacp = np.zeros((3, self.model.nv))
        jacr = np.zeros((3, self.model.nv))
        mujoco.mj_jacSite(self.model, self.data, jacp, jacr, self.site)
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, self.data.site_xmat[self.site])
        jac = np.concatenate([jacp[:, self.dofs], jacr[:, self.dofs]])
        return self.data.site_xpos[self.site].copy(), quat, jac


@dataclass
class _State:
    position: torch.Tensor  # float64 [n] arm joints, spec order
    velocity: torch.Tensor | None
    gripper: float | None  # first gripper joint (metres per finger)
    stamp: float  # time.monotonic() when it was measured (header.stamp through StampClock)


class RobotEnv(gym.Env):
    """See the module docstring. `control`, `max_ee_step`, `max_joint_step`, `relative_frame`, `gripper_action`,
    `goal`, `relative_goal` and `episode_steps` come from the simulated task a policy was trained on."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        cfg: RobotEnvConfig,
        control: str = "joint_delta",
        max_ee_step: float = 0.05,
        max_joint_step: float = 0.1,
        gripper_action: bool = False,
        gripper_obs: bool = False,
        goal: dict[str, list[float]] | None = None,
        relative_goal: dict[str, str] | None = None,
        episode_steps: int | None = None,
        frame_stack: int = 1,
        observe: list[str] | None = None,
        bridge: Any | None = None,
        relative_frame: bool = False,
        gripper_hold: float | None = None,
        held: dict[str, list[float]] | None = None,
        held_relative: dict[str, list[str]] | None = None,
        start_regions: dict[str, list[list[float]]] | None = None,
        goal_sampler: Callable[[dict[str, np.ndarray], torch.Generator], dict[str, np.ndarray]] | None = None,
    ):
        cfg.validate()
        if not (isinstance(frame_stack, int) and frame_stack >= 1):
            raise ValueError(f"frame_stack must be an integer >= 1, got {frame_stack!r}")
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {', '.join(CONTROLS)}, got {control!r}")
        if not isinstance(relative_frame, bool):
            raise ValueError(f"relative_frame must be true or false, got {relative_frame!r}")
        if relative_frame and control != "ee_delta":
            raise ValueError(f"relative_frame=true rotates ee_delta actions; control is {control!r}")
        self.cfg = cfg
        self.spec = load_robot_spec(cfg.robot)
        if control == "ee_delta" and self.spec.end_effector_site is None:
            raise ValueError(f"control=ee_delta needs a tool point; robot {cfg.robot!r} has none")
        if (gripper_action or gripper_obs) and (self.spec.gripper is None or not cfg.gripper_controller):
            raise ValueError(f"the policy uses a gripper; robot {cfg.robot!r} has none (or no gripper_controller)")
        self.control, self.max_ee_step, self.max_joint_step = control, max_ee_step, max_joint_step
        # ee_delta motions are in the tool's frame at the episode's start (set at reset), as the simulated
        # controller's relative_frame; observations stay in world axes
        self.relative_frame = relative_frame
        self._action_frame = np.eye(3)
        self.gripper_action, self.gripper_obs = gripper_action, gripper_obs
        if gripper_hold is not None and (gripper_action or not math.isfinite(gripper_hold)):
            raise ValueError(f"gripper_hold is for policies that do not move the gripper, got {gripper_hold!r}")
        # where the policy does not move the gripper, the fingers stay where the simulated task keeps them
        # (its gripper actuator never commanded: shut); None: opened at each reset, as for a gripper policy
        self.gripper_hold = gripper_hold
        self.goal = {k: np.asarray(v, dtype=np.float32) for k, v in (goal or {}).items()}
        for key, value in self.goal.items():
            if value.shape != (3,) and key in (relative_goal or {}).values():
                raise ValueError(f"goal {key!r} must have 3 values to be relative to ee_pos, got {value.tolist()}")
        self.relative_goal = dict(relative_goal or {})
        missing = sorted(set(self.relative_goal.values()) - set(self.goal))
        if missing:
            raise ValueError(f"relative_goal refers to goals {missing} that goal does not give")
        # points fixed to the tool (a held peg's tip): entry -> offset in the tool point's frame; and entries that
        # are a goal minus such a point (peg_insert's tip_to_hole): entry -> [goal, point]
        self.held = {k: np.asarray(v, dtype=np.float64) for k, v in (held or {}).items()}
        bad = {k: v.tolist() for k, v in self.held.items() if v.shape != (3,) or not np.isfinite(v).all()}
        if bad:
            raise ValueError(f"held points need 3 finite offsets (metres, in the tool frame), got {bad}")
        self.held_relative = {k: tuple(v) for k, v in (held_relative or {}).items()}
        for key, pair in self.held_relative.items():
            if len(pair) != 2 or pair[0] not in self.goal or pair[1] not in self.held:
                raise ValueError(
                    f"held_relative.{key} must be [goal, held point] among goals {sorted(self.goal)} and held "
                    f"points {sorted(self.held)}, got {list(pair)}"
                )
            if self.goal[pair[0]].shape != (3,):
                raise ValueError(f"goal {pair[0]!r} must have 3 values to be relative to {pair[1]!r}")
        self.episode_steps = episode_steps
        self.n = len(self.spec.joints)
        self.joint_names = list(self.spec.joints)
        model_file = Path(cfg.model) if cfg.model else ASSETS / f"{cfg.robot}.xml"
        self.kinematics = _Kinematics(model_file, self.spec)
        self.shield = Shield.from_spec(self.spec, cfg.shield_config(), model_file)
        self.lower = self.spec.position_lower.double().numpy()
        self.upper = self.spec.position_upper.double().numpy()

        self.action_dim = (3 if control == "ee_delta" else self.n) + int(gripper_action)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.action_dim,), np.float32)
        spaces = {
            "arm_qpos": gym.spaces.Box(-np.inf, np.inf, (self.n,), np.float32),
            "arm_qvel": gym.spaces.Box(-np.inf, np.inf, (self.n,), np.float32),
            "ee_pos": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        }
        if gripper_obs:
            spaces["gripper"] = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        for key, value in self.goal.items():
            spaces[key] = gym.spaces.Box(-np.inf, np.inf, value.shape, np.float32)
        for key in self.relative_goal:
            spaces[key] = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        for key in (*self.held, *self.held_relative):
            if key in spaces:
                raise ValueError(f"observation entry {key!r} is given twice (a held point and another entry)")
            spaces[key] = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        # entry -> (object, what): the entries a measured object pose gives (hardware.objects)
        self._object_entries = object_entries(cfg.objects, {k: v.shape for k, v in self.goal.items()})
        clash = sorted(set(cfg.objects) & set(self.goal))
        if clash:
            raise ValueError(f"{clash} named both as tracked objects (hardware.objects) and as goals")
        clash = sorted(set(self._object_entries) & set(spaces))
        if clash:
            raise ValueError(f"observation entries {clash} would come both from hardware.objects and from a goal")
        for key, (_, what) in self._object_entries.items():
            size = 4 if what == "quat" else 3 if what in ("pos", "from_ee") else self.goal[what].shape[0]
            spaces[key] = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.frame_stack = frame_stack  # camera frames per pixel observation, oldest first (as FrameStack)
        for name in cfg.cameras:
            shape = (3 * frame_stack, cfg.image_size, cfg.image_size)
            spaces[f"pixels_{name}"] = gym.spaces.Box(0, 255, shape, np.uint8)
        if observe is not None:  # the entries the policy reads (a pixel policy may read no joint state)
            spaces = {key: space for key, space in spaces.items() if key in observe}
        self.observation_space = gym.spaces.Dict(spaces)
        self._object_entries = {k: v for k, v in self._object_entries.items() if k in spaces}
        # only the objects the policy observes are listened to (and can make an observation stale)
        self.tracked_objects = [
            name for name in cfg.objects if any(o == name for o, _ in self._object_entries.values())
        ]
        ignored = sorted(set(cfg.objects) - set(self.tracked_objects))
        if ignored:
            log.info("robot env: the policy observes nothing of tracked objects %s; not listening to them", ignored)
        # objects a person puts back between episodes: name -> (low, high) of its position's first coordinates
        regions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, box in (start_regions or {}).items():
            low, high = regions[name] = goal_box(f"start_regions.{name}", box)
            if not (1 <= low.size <= 3 and np.isfinite(low).all() and np.isfinite(high).all()):
                raise ValueError(f"start_regions.{name} must bound 1 to 3 coordinates with finite corners, got {box}")
        self.start_regions = {name: box for name, box in regions.items() if name in self.tracked_objects}
        self.goal_sampler, self.drawn_goals = goal_sampler, self._check_goal_sampler(goal_sampler, regions)
        self._goal_generator = torch.Generator()
        self._goal_generator.seed()  # not the same goals in every session; reset(seed=...) makes them repeatable

        # state shared with the control thread and the bridge's callbacks (an e-stop may arrive as soon as its
        # subscription exists), under _lock
        self._lock = threading.Lock()
        self._state_clock = StampClock()  # joint states' measurement times from their header stamps
        self._parsed: tuple[Any, _State | None] = (None, None)  # (the message received, its parse)
        self._started = False
        self._pending: torch.Tensor | None = None
        self._pending_gripper: float | None = None
        self._period_info: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()  # shield corrections (control periods) over the env's life
        self.stats: Counter[str] = Counter()  # commands, missed periods, stale observations, bad states
        self.ages: list[float] = []  # joint-state age at each observation (s)
        # the watchdog, measured: the oldest state the shield still tracked on, and the state's age when
        # each stall (joint states stopped arriving) first made the shield hold or stop
        self.max_tracked_state_age = 0.0
        self.stall_reactions: list[float] = []
        self._stalled = False
        self.state_period: float | None = None  # measured joint-state interval (s), at the first reset
        self._last_setpoint: np.ndarray | None = None
        self._gripper_sent = (math.nan, -math.inf)  # (value, time) of the last gripper command published
        self._closing = threading.Event()

        from robotrl.hardware.ros2 import make_bridge

        self._owns_bridge = bridge is None
        self.bridge = bridge or make_bridge(cfg.backend, domain_id=cfg.domain_id, loopback=cfg.loopback)
        try:
            self._open_topics()
        except BaseException:  # a failed construction must not keep the domain joined
            if self._owns_bridge:
                self.bridge.close()
            raise
        self._thread = threading.Thread(target=self._control_loop, name="robotrl-robot-env-control", daemon=True)
        self._thread.start()
        try:
            if cfg.lock_memory:
                lock_memory("hardware.lock_memory")
            set_realtime_priority("hardware.realtime_priority", cfg.realtime_priority, self._thread.native_id)
        except BaseException:
            self.close()
            raise

        self._last_obs: dict[str, np.ndarray] | None = None
        self._stacks: dict[str, np.ndarray] = {}  # pixel key -> the last frame_stack frames [3k, H, W]
        self._obs_state: _State | None = None  # the state the last observation was built from
        self._obs_fresh = False
        # what else the last observation was built from: (what, when it arrived (monotonic), its age limit's
        # setting, that limit in s); its action is late once any of them aged past the limit plus a period
        self._obs_inputs: list[tuple[str, float, str, float]] = []
        self._last_poses: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each object's last good pose
        # each object's position last acted on and when it arrived (max_object_speed); cleared at each reset
        self._last_acted: dict[str, tuple[np.ndarray, float]] = {}
        self._last_target = np.zeros(self.n)
        self._target_quat = np.array([1.0, 0.0, 0.0, 0.0])
        self._t = 0
        self._next_tick = time.monotonic()

    # -- topics -------------------------------------------------------------------------------------
    def _open_topics(self) -> None:
        from robotrl.hardware.ros2.msgs import Bool, Float64MultiArray, Image, JointState, PoseStamped

        cfg = self.cfg
        self.topics = {"joint_states": cfg.joint_states_topic, "commands": f"/{cfg.controller}/commands"}
        self._joint_states = self.bridge.subscription(cfg.joint_states_topic, JointState, cfg.state_qos)
        self._command_pub = self.bridge.publisher(self.topics["commands"], Float64MultiArray, cfg.command_qos)
        self._gripper_pub = None
        if cfg.gripper_controller and self.spec.gripper is not None:
            self.topics["gripper"] = f"/{cfg.gripper_controller}/commands"
            self._gripper_pub = self.bridge.publisher(self.topics["gripper"], Float64MultiArray, cfg.command_qos)
        self._estop: EStopInput | None = None
        if cfg.estop_topic:
            self.topics["estop"] = cfg.estop_topic
            self._estop = EStopInput(self.bridge, cfg.estop_topic, self._on_estop)
        if cfg.estop_ack_topic:
            self.topics["estop_ack"] = cfg.estop_ack_topic
            self._estop_ack_sub = self.bridge.subscription(cfg.estop_ack_topic, Bool, "default", self._on_estop_ack)
        self._scene_reset_pub = None
        if cfg.scene_reset_topic:
            self.topics["scene_reset"] = cfg.scene_reset_topic
            self._scene_reset_pub = self.bridge.publisher(cfg.scene_reset_topic, Bool, "default")
        self._images = {
            name: self.bridge.subscription(cfg.camera_topic.format(name=name), Image, "sensor_data")
            for name in cfg.cameras
        }
        # best effort: matches a reliable publisher too (a tracker may publish either way)
        self._object_poses = {
            name: self.bridge.subscription(cfg.object_topic.format(name=name), PoseStamped, "sensor_data")
            for name in self.tracked_objects
        }
        self.topics.update({f"object/{name}": cfg.object_topic.format(name=name) for name in self.tracked_objects})

    def _on_estop(self, pressed: bool) -> None:
        with self._lock:
            self.shield.estop(pressed)

    def _on_estop_ack(self, msg) -> None:
        if msg.data:
            try:
                self.acknowledge_estop()
            except ShieldResetError as error:
                log.warning("e-stop acknowledgement on %s ignored: %s", self.cfg.estop_ack_topic, error)

    def _state(self) -> _State | None:
        """The newest joint state, parsed once per message (joint names matched to the spec's)."""
        from robotrl.hardware.ros2.tensors import joint_state_tensor, time_seconds

        received = self._joint_states.latest()
        if received is None:
            return None
        # The message itself, not its id(): a freed message's address is reused by a newer one
        last, parsed = self._parsed
        if last is received:
            return parsed
        msg = received.msg
        try:
            position = joint_state_tensor(msg, self.joint_names, "position", torch.float64)
            velocity = (
                joint_state_tensor(msg, self.joint_names, "velocity", torch.float64) if len(msg.velocity) else None
            )
            gripper = None
            if self.spec.gripper is not None and self.spec.gripper.joints[0] in msg.name:
                gripper = float(msg.position[list(msg.name).index(self.spec.gripper.joints[0])])
            stamp = self._state_clock.measured_at(time_seconds(msg.header.stamp), received.received_at)
            parsed = _State(position, velocity, gripper, stamp)
        except (KeyError, ValueError) as error:
            self.stats["bad_joint_state"] += 1
            log.warning("robot env: ignoring a joint state: %s", error)
            parsed = self._parsed[1]  # keep the last good one (it ages, so the shield holds)
        self._parsed = (received, parsed)
        return parsed

    def _locked_state(self) -> _State | None:
        with self._lock:
            return self._state()

    # -- the control thread --------------------------------------------------------------------------
    def _control_loop(self) -> None:
        period = 1.0 / self.cfg.control_rate_hz
        start = time.monotonic()
        tick = 0
        while not self._closing.is_set():
            deadline = start + tick * period
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                self._control_step()
            except Exception:  # a bug here must not leave the robot without a shield: stop commanding
                log.exception("robot env: control step failed; no more commands are sent")
                self.stats["control_error"] += 1
                return
            tick += 1
            due = int((time.monotonic() - start) / period)
            if due > tick:
                self.stats["missed_periods"] += due - tick
                tick = due

    def _control_step(self) -> None:
        self._joint_states.poll()  # a state that has arrived counts as fresh even if the receive thread lags
        with self._lock:
            state = self._state()
            # read under the lock, after the state: a reset() in between (which holds the lock) must not be
            # newer than this period (the shield refuses time going back), nor may any state look younger than 0
            now = time.monotonic()
            if not self._started or state is None:
                return
            command, self._pending = self._pending, None
            gripper, self._pending_gripper = self._pending_gripper, None
            safe = self.shield.filter(
                command, state.position, state.stamp, now, gripper=gripper, joint_velocity=state.velocity
            )
            for key, value in safe.info.items():
                if value:
                    self._period_info[key] += 1
                    self.totals[key] += 1
            age = now - state.stamp
            if safe.mode == "track":
                self.max_tracked_state_age = max(self.max_tracked_state_age, age)
                self._stalled = False
            elif not self._stalled and (safe.info.get("safety/stale_hold") or safe.info.get("safety/stale_stop")):
                self._stalled = True
                self.stall_reactions.append(age)
            setpoint = safe.target.numpy()
            if not np.isfinite(setpoint).all():  # the shield guarantees this; never publish otherwise
                self.stats["non_finite_setpoint"] += 1
                return
            self._last_setpoint = setpoint
        from robotrl.hardware.ros2.tensors import float64_multi_array

        self._command_pub.publish(float64_multi_array(setpoint, self.n))
        self.stats["commands"] += 1
        if self._gripper_pub is not None and safe.gripper is not None:
            # a new gripper setpoint at once, an unchanged one at 10 Hz (a forward controller holds it)
            value = float(safe.gripper)
            if value != self._gripper_sent[0] or now - self._gripper_sent[1] >= 0.1:
                self._gripper_sent = (value, now)
                self._gripper_pub.publish(float64_multi_array([value], 1))

    def _post(self, target: np.ndarray | torch.Tensor, gripper: float | None = None) -> None:
        with self._lock:
            self._pending = torch.as_tensor(target, dtype=torch.float64)
            if gripper is not None:
                self._pending_gripper = gripper

    def _take_info(self) -> dict[str, int]:
        with self._lock:
            info, self._period_info = dict(self._period_info), Counter()
        return info

    # -- observations ---------------------------------------------------------------------------------
    def _observe(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The observation from the newest messages, and whether it is fresh enough to act on."""
        now = time.monotonic()
        with self._lock:
            state = self._state()
            # the shield's own rule: a state it refuses (out of order, a glitch) is not acted on here either
            refused = (
                None if state is None or not self._started else self.shield.judge_state(state.position, state.stamp)
            )
        info: dict[str, Any] = {}
        if state is None:
            raise StaleObservationError(f"no joint state has arrived on {self.cfg.joint_states_topic}")
        age = now - state.stamp
        info["observation_age"] = age
        self.ages.append(age)
        stale = [f"joint_states {age * 1e3:.1f} ms old"] if age > self.cfg.max_state_age else []
        if refused is not None:
            stale.append(f"joint_states refused by the shield ({refused})")
        q = state.position.numpy()
        ee, ee_quat, _ = self.kinematics.pose(q)
        obs: dict[str, np.ndarray] = {
            "arm_qpos": q.astype(np.float32),
            "arm_qvel": (state.velocity.numpy() if state.velocity is not None else np.zeros(self.n)).astype(np.float32),
            "ee_pos": ee.astype(np.float32),
        }
        if self.gripper_obs:
            opening = state.gripper if state.gripper is not None else math.nan
            obs["gripper"] = np.array([opening / self.spec.gripper.open], np.float32)
        for key, value in self.goal.items():
            obs[key] = value.copy()
        for key, goal in self.relative_goal.items():
            obs[key] = (self.goal[goal] - ee).astype(np.float32)
        if self.held:
            tool = _rotation_matrix(ee_quat)
            held = {key: ee + tool @ offset for key, offset in self.held.items()}
            for key, point in held.items():
                obs[key] = point.astype(np.float32)
            for key, (goal, point) in self.held_relative.items():
                obs[key] = (self.goal[goal] - held[point]).astype(np.float32)
        poses = {}
        inputs: list[tuple[str, float, str, float]] = []
        for name, sub in self._object_poses.items():
            pose, received_at, problem = self._object_pose(sub)
            problem = problem or self._jump(name, pose[0], received_at)
            if problem:  # stale: the last good pose (as a stale joint state is the last state), never made up
                stale.append(f"object {name} {problem}")
                pose = self._last_poses.get(name, pose)
            else:
                self._last_poses[name] = pose
                self._last_acted[name] = (pose[0], received_at)
                inputs.append((f"object {name} pose", received_at, "max_object_age", self.cfg.max_object_age))
            poses[name] = pose
        for key, (name, what) in self._object_entries.items():
            position, quat = poses[name]
            if what == "pos":
                obs[key] = position.copy()  # a copy: the last good pose is kept for a stale observation
            elif what == "quat":
                obs[key] = quat.copy()
            elif what == "from_ee":
                obs[key] = (position - ee).astype(np.float32)
            else:  # the goal `what` minus the object's position, in the goal's dimensions
                goal = self.goal[what]
                obs[key] = (goal - position[: goal.shape[0]]).astype(np.float32)
        for name, sub in self._images.items():
            received = sub.latest()
            if received is None or received.age() > self.cfg.max_image_age:
                stale.append(f"camera {name} " + ("has sent nothing" if received is None else "frame too old"))
                obs[f"pixels_{name}"] = np.zeros((3, self.cfg.image_size, self.cfg.image_size), np.uint8)
                continue
            obs[f"pixels_{name}"] = self._image(received.msg)
            inputs.append((f"camera {name} frame", received.received_at, "max_image_age", self.cfg.max_image_age))
        finite = all(np.isfinite(v).all() for k, v in obs.items() if not k.startswith("pixels_"))
        if not finite:
            stale.append("non-finite state")
        info["stale_observation"] = int(bool(stale))
        if stale:
            self.stats["stale_observations"] += 1
            info["stale_reason"] = "; ".join(stale)
            if self.cfg.on_stale == "raise":
                raise StaleObservationError(f"observation not fresh: {info['stale_reason']}")
        self._obs_state = state
        self._obs_inputs = inputs
        self._obs_fresh = not stale
        return {key: obs[key] for key in self.observation_space.spaces}, info

    def _late_reason(self, now: float) -> str | None:
        """Why an action computed from the last (fresh) observation comes too late to send (its joint state, one
        of its tracked poses or one of its camera frames aged past its limit plus one policy period since
        arriving), or None."""
        period, cfg = 1.0 / self.cfg.policy_rate_hz, self.cfg
        inputs = [("joint state", self._obs_state.stamp, "max_state_age", cfg.max_state_age), *self._obs_inputs]
        for what, received_at, setting, limit in inputs:
            age = now - received_at
            if age > limit + period:
                return f"{what} is {age * 1e3:.1f} ms old (hardware.{setting} {limit * 1e3:.0f} ms + a period)"
        return None

    def _jump(self, name: str, position: np.ndarray, received_at: float) -> str | None:
        """Why `position` cannot be where the object went since the position last acted on (faster than
        max_object_speed: a tracker glitch), or None. Counted in `object_jumps`."""
        last = self._last_acted.get(name)
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

    def _object_pose(self, sub, count: bool = True) -> tuple[tuple[np.ndarray, np.ndarray], float, str | None]:
        """(position, wxyz orientation) of the newest pose on `sub`, when it arrived (monotonic), and what
        keeps it from being acted on (None: fresh and valid). Observations built on a pose that is not one
        (NaN, a zero quaternion, another frame) are counted in `bad_object_pose` (with `count`)."""
        from robotrl.hardware.ros2.tensors import pose_tensors, time_seconds

        unknown = (np.zeros(3, np.float32), np.array([1.0, 0.0, 0.0, 0.0], np.float32))
        received = sub.latest()
        if received is None:
            return unknown, math.nan, "has sent no pose"
        age = received.age()
        if age > self.cfg.max_object_age:
            return unknown, received.received_at, f"pose {age * 1e3:.0f} ms old"
        if self.cfg.max_object_stamp_age:
            behind = time.time() - time_seconds(received.msg.header.stamp)
            if behind > self.cfg.max_object_stamp_age:
                return unknown, received.received_at, f"pose stamped {behind * 1e3:.0f} ms before now"
        frame = received.msg.header.frame_id
        if self.cfg.object_frame and frame != self.cfg.object_frame:
            self.stats["bad_object_pose"] += count
            problem = f"pose in frame {frame!r}, not hardware.object_frame {self.cfg.object_frame!r}"
            return unknown, received.received_at, problem
        try:
            position, quat = pose_tensors(received.msg, torch.float32)
        except ValueError as error:
            self.stats["bad_object_pose"] += count
            return unknown, received.received_at, str(error)
        return (position.numpy(), quat.numpy()), received.received_at, None

    # -- the scene between episodes ---------------------------------------------------------------------
    def _check_goal_sampler(self, sampler: Callable | None, regions: dict) -> list[str]:
        """The goals `sampler` draws (each one a goal of this env, with its shape), tried once with the objects
        at their start regions' centres; those first values stand until reset() draws the episode's."""
        if sampler is None:
            return []
        centres = {name: np.zeros(3, np.float32) for name in [*self.tracked_objects, *regions]}
        for name, (low, high) in regions.items():
            centres[name][: low.size] = (low + high) / 2
        try:
            drawn = sampler(centres, torch.Generator().manual_seed(0))
        except KeyError as error:
            name = error.args[0]
            raise ValueError(f"the goal sampler draws around object {name!r}, which has no start region") from None
        for key, value in drawn.items():
            if key not in self.goal or np.shape(value) != self.goal[key].shape:
                have = self.goal[key].shape if key in self.goal else "no such goal"
                raise ValueError(f"the goal sampler draws {key!r} of shape {np.shape(value)}; the env has {have}")
            self.goal[key] = np.asarray(value, np.float32)  # a plausible value until reset() draws the episode's
        return sorted(drawn)

    def _wait_for_scene(self, cancel: threading.Event | None = None) -> dict[str, np.ndarray]:
        """Wait (the arm held at home) until the objects the episode starts from are ready; their positions.

        With `scene_timeout` > 0, every tracked object with a start region must have a fresh pose inside it
        and stay still there (within SETTLE_DISTANCE) for `scene_settle`: a person resets the scene between
        robot episodes, and this is where a robot env waits for them. Where goals are drawn, every tracked
        object needs a fresh pose (the sampler may draw around any; within `reset_timeout` when the scene is
        not checked). `cancel` (an Event, set by a session's Ctrl-C: `reset(options={"cancel": event})`) ends
        the wait with EnvCancelled."""
        cfg, period = self.cfg, 1.0 / self.cfg.policy_rate_hz
        regions = self.start_regions if cfg.scene_timeout > 0 else {}
        drawn_around = [n for n in self.tracked_objects if n not in regions] if self.goal_sampler else []
        needed = [*regions, *drawn_around]
        setting, timeout = ("scene_timeout", cfg.scene_timeout) if regions else ("reset_timeout", cfg.reset_timeout)
        deadline = time.monotonic() + timeout
        still_since: dict[str, tuple[np.ndarray, float]] = {}  # object -> (where it came to rest, since when)
        told = False
        while True:
            now, missing, settling, positions = time.monotonic(), [], [], {}
            for name in needed:
                (position, _), _, problem = self._object_pose(self._object_poses[name], count=False)
                if problem is None and name in regions:
                    low, high = regions[name]
                    at = position[: low.size]
                    if not ((at >= low) & (at <= high)).all():
                        box = f"{np.round(low.astype(float), 3).tolist()}..{np.round(high.astype(float), 3).tolist()}"
                        problem = f"at {np.round(at.astype(float), 3).tolist()}, not in its start region {box}"
                if problem is not None:
                    still_since.pop(name, None)
                    missing.append(f"{name} {problem}")
                    continue
                if name in regions:
                    rest = still_since.get(name)
                    if rest is None or np.linalg.norm(position - rest[0]) > SETTLE_DISTANCE:
                        rest = still_since[name] = (position, now)
                    if now - rest[1] < cfg.scene_settle:
                        settling.append(f"{name} placed but not yet still for {cfg.scene_settle} s")
                positions[name] = position
            if not missing and not settling:
                return positions
            if cancel is not None and cancel.is_set():
                raise EnvCancelled("reset cancelled while waiting for the scene: " + "; ".join(missing + settling))
            if now > deadline:
                raise SceneResetError(
                    f"the scene was not ready within hardware.{setting} {timeout} s: "
                    + "; ".join(missing + settling)
                    + (" (put each object back where the simulated task starts it)" if regions else "")
                )
            if missing and not told:  # not for an object that is back and settling: that is every reset
                told = True
                log.warning("robot env reset: waiting up to %.1f s for the scene: %s", timeout, missing)
                if self._scene_reset_pub is not None and regions:
                    from robotrl.hardware.ros2.msgs import Bool

                    self._scene_reset_pub.publish(Bool(data=True))
            time.sleep(period)

    def _draw_goals(self, positions: dict[str, np.ndarray]) -> None:
        """This episode's goals, drawn as the simulated task draws them, around where the objects are."""
        drawn = self.goal_sampler(positions, self._goal_generator)
        for key in self.drawn_goals:
            value = np.asarray(drawn[key], np.float32)
            if not np.isfinite(value).all():
                raise ValueError(f"the task's goal sampler drew a non-finite {key!r}: {value.tolist()}")
            self.goal[key] = value
        goals = {key: np.round(self.goal[key], 3).tolist() for key in self.drawn_goals}
        log.info("robot env reset: this episode's goals %s", goals)

    def _stack_frames(self, obs: dict[str, np.ndarray], fresh: bool) -> dict[str, np.ndarray]:
        """Pixel entries as the last `frame_stack` frames on the channel axis; at an episode's start the first
        frame fills the stack (robotrl/runtime/frame_stack.py does the same in simulation)."""
        if self.frame_stack == 1:
            return obs
        for key in [k for k in obs if k.startswith("pixels_")]:
            frame = obs[key]
            if fresh:
                stack = np.concatenate([frame] * self.frame_stack, axis=0)
            else:
                stack = np.concatenate([self._stacks[key][frame.shape[0] :], frame], axis=0)
            self._stacks[key] = stack
            obs[key] = stack.copy()
        return obs

    def _image(self, msg) -> np.ndarray:
        from robotrl.hardware.ros2.tensors import image_tensor

        pixels = image_tensor(msg)
        if pixels.shape[0] == 1:  # mono8: the observation space (and the policy) take three channels
            pixels = pixels.expand(3, -1, -1)
        pixels = pixels[:3].float().unsqueeze(0)
        if msg.encoding.startswith("bgr"):
            pixels = pixels.flip(1)
        size = self.cfg.image_size
        pixels = torch.nn.functional.interpolate(pixels, size=(size, size), mode="area")
        return pixels[0].round().clamp(0, 255).to(torch.uint8).numpy()

    # -- actions -----------------------------------------------------------------------------------
    def _joint_targets(self, action: np.ndarray, q: np.ndarray) -> np.ndarray:
        arm = action[: self.action_dim - int(self.gripper_action)].astype(np.float64)
        if self.control == "joint_position":
            target = self.lower + (arm + 1.0) * 0.5 * (self.upper - self.lower)
        elif self.control == "joint_delta":
            target = self._last_target + arm * self.max_joint_step
        else:
            from robotrl.tasks.rotations import rotation_error

            _, quat, jac = self.kinematics.pose(q)
            error = np.concatenate(
                [
                    self._action_frame @ (arm * self.max_ee_step),
                    rotation_error(
                        torch.tensor(self._target_quat, dtype=torch.float32)[None],
                        torch.tensor(quat, dtype=torch.float32)[None],
                    )[0]
                    .double()
                    .numpy(),
                ]
            )
            jjt = jac @ jac.T + 0.05**2 * np.eye(6)
            target = q + jac.T @ np.linalg.solve(jjt, error)
        target = np.clip(target, self.lower, self.upper)  # NaN stays NaN: the shield drops it
        if np.isfinite(target).all():
            self._last_target = target
        return target

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        cfg = self.cfg
        deadline = time.monotonic() + cfg.connect_timeout
        while (state := self._locked_state()) is None or state.stamp < time.monotonic() - cfg.max_state_age:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no fresh joint state on {cfg.joint_states_topic} within {cfg.connect_timeout} s (domain "
                    f"{cfg.domain_id}, loopback={cfg.loopback}): is the robot driver or robotrl-sim-twin running?"
                )
            time.sleep(0.01)
        if self.state_period is None and self.shield.config.watchdog:
            self._check_state_rate()
        self._require_estop_publisher(deadline)
        self._restart_shield(deadline + cfg.reset_timeout)
        self._go_home()
        if seed is not None:
            self._goal_generator.manual_seed(seed)
        positions = self._wait_for_scene((options or {}).get("cancel"))  # a threading.Event ends the wait
        # while a person was in the workspace an e-stop press (or a joint-state stall) may have latched the
        # shield, or the arm been pushed: restart (refused while the e-stop is unacknowledged), home again
        with self._lock:
            latched = self.shield.latched
        if latched is not None or not self._at_home():
            self._restart_shield(time.monotonic() + cfg.reset_timeout)
            self._go_home()
        if self.goal_sampler is not None:
            self._draw_goals(positions)
        self._last_acted.clear()  # a person moved the objects between episodes
        self._take_info()
        obs, info = self._observe()
        obs = self._stack_frames(obs, fresh=True)
        q = self._obs_state.position.numpy()
        self._last_target = q.copy()
        if self.control == "ee_delta":
            _, self._target_quat, _ = self.kinematics.pose(q)
            if self.relative_frame:
                self._action_frame = _rotation_matrix(self._target_quat)
        self._t = 0
        self._last_obs = obs
        self._next_tick = time.monotonic() + 1.0 / cfg.policy_rate_hz
        return obs, info

    def _go_home(self) -> None:
        """Move to the spec's home pose through the shield and wait until the arm rests there (reset_timeout)."""
        cfg, home = self.cfg, self.spec.home.double().numpy()
        deadline = time.monotonic() + cfg.reset_timeout
        while True:
            fingers = self.spec.gripper.open if self.gripper_hold is None else self.gripper_hold
            self._post(home, fingers if self._gripper_pub is not None else None)
            time.sleep(1.0 / cfg.policy_rate_hz)
            state = self._locked_state()
            error = np.abs(state.position.numpy() - home)
            speed = np.abs(state.velocity.numpy()) if state.velocity is not None else np.zeros(self.n)
            fresh = time.monotonic() - state.stamp <= cfg.max_state_age
            if fresh and error.max() <= cfg.reset_tolerance and speed.max() <= cfg.reset_velocity:
                return
            if time.monotonic() > deadline:
                with self._lock:
                    latched = self.shield.latched
                raise ResetTimeoutError(
                    f"home pose not reached within {cfg.reset_timeout} s: joint errors {np.round(error, 4).tolist()} "
                    f"rad (tolerance {cfg.reset_tolerance}), speeds {np.round(speed, 4).tolist()} rad/s"
                    + (f", shield latched: {latched}" if latched else "")
                    + (", joint state stale" if not fresh else "")
                )

    def _at_home(self) -> bool:
        """Whether the newest joint state is fresh and at rest at home, as `_go_home` leaves the arm."""
        cfg, state = self.cfg, self._locked_state()
        if state is None or time.monotonic() - state.stamp > cfg.max_state_age:
            return False
        speed = np.abs(state.velocity.numpy()).max() if state.velocity is not None else 0.0
        error = np.abs(state.position.numpy() - self.spec.home.double().numpy()).max()
        return bool(error <= cfg.reset_tolerance and speed <= cfg.reset_velocity)

    def world_to_action(self, action: torch.Tensor) -> torch.Tensor:
        """An action [N, A] whose first three entries are a motion in the robot's base axes (a teleop
        device's), expressed in this env's action frame (the tool's start frame under `relative_frame`),
        clipped to [-1, 1]: what ArmController.world_to_action does in simulation."""
        if self.control != "ee_delta" or not self.relative_frame:
            return action
        frame = torch.as_tensor(self._action_frame, dtype=action.dtype)
        motion = (action[:, :3] @ frame).clamp(-1.0, 1.0)  # each row times frame: frame^T @ motion
        return torch.cat([motion, action[:, 3:]], -1)

    def _require_estop_publisher(self, deadline: float) -> None:
        """Wait until something publishes on the e-stop topic (discovery takes a moment) and every publisher
        there has said it is released; refuse without (the e-stop latches as pressed until then)."""
        if self._estop is None or not self.cfg.require_estop_publisher:
            return
        while True:
            present = self._estop.has_publisher()
            why = self._estop.not_known_released() if present else None  # read once: the answer may change
            if present and why is None:
                return
            if time.monotonic() > deadline:
                if present:
                    raise EStopLatchedError(f"robot env reset: {why}", pressed=True)
                raise EStopMissingError(
                    f"robot env reset: nothing publishes on the e-stop topic {self.cfg.estop_topic} (std_msgs/Bool, "
                    "reliable; latched or volatile): a robot does not start without a working e-stop (a simulated "
                    "one may set hardware.require_estop_publisher=false)"
                )
            time.sleep(0.01)

    def _check_state_rate(self, window: float = 0.2) -> None:
        """Measure the joint-state interval and refuse a hold_after the stream cannot keep: with states
        further apart than the watchdog's limit the shield would hold between every two of them."""
        self._joint_states.take()
        time.sleep(window)
        arrivals = [received.received_at for received in self._joint_states.take()]
        hold_after = self.shield.config.hold_after_s
        self.state_period = float(np.median(np.diff(arrivals))) if len(arrivals) >= 3 else window
        if self.state_period * 1.5 > hold_after:
            measured = (
                f"{self.state_period * 1e3:.1f} ms between messages"
                if len(arrivals) >= 3
                else f"fewer than 3 messages in {window} s"
            )
            raise ValueError(
                f"hardware.shield.hold_after is {hold_after * 1e3:.1f} ms"
                + (" (two control periods)" if self.shield.config.hold_after is None else "")
                + f" but {self.cfg.joint_states_topic} arrives slower ({measured}): the shield would hold between "
                f"states. Publish joint states at the control rate, or set hardware.shield.hold_after to at least "
                f"{1.5 * self.state_period:.3f} s"
            )

    def _restart_shield(self, deadline: float) -> None:
        """Start the shield from the measured state; after a latch, let its brake finish and restart it."""
        while True:
            pressed = self._estop is not None and self._estop.pressed  # by any live publisher, not the last one
            with self._lock:
                if pressed:
                    self.shield.estop(True)
                state = self._state()
                now = time.monotonic()
                if not self._started or self.shield.latched or self.shield.at_rest:
                    try:
                        self.shield.reset(state.position, state.stamp, now)
                        self._started = True
                        return
                    except EStopLatchedError as error:  # only the operator can clear it: no point waiting
                        how = ""
                        if not error.pressed and self.cfg.estop_ack_topic:
                            how = f" (publish std_msgs/Bool true on {self.cfg.estop_ack_topic})"
                        raise EStopLatchedError(f"robot env reset: {error}{how}", error.pressed) from error
                    except ShieldResetError as error:
                        if time.monotonic() > deadline:
                            raise ShieldResetError(f"robot env reset: {error}") from error
            if time.monotonic() > deadline:
                raise ResetTimeoutError("the shield did not come to rest for reset()")
            time.sleep(0.01)

    def step(self, action):
        if self._last_obs is None:
            raise RuntimeError("call reset() before step()")
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.action_dim,):
            raise ValueError(f"action must have {self.action_dim} values, got shape {action.shape}")
        info: dict[str, Any] = {}
        if not np.isfinite(action).all():
            info["non_finite_action"] = 1
            self.stats["non_finite_actions"] += 1
        if np.abs(action[np.isfinite(action)]).max(initial=0.0) > 1.0:
            info["action_clipped"] = 1
        action = np.clip(action, -1.0, 1.0)  # NaN stays NaN (the shield drops it)
        if self._estop is not None and self.cfg.require_estop_publisher and not self._estop.has_publisher():
            # the e-stop's publisher is gone: nothing could stop the arm now, so it counts as pressed
            self.stats["estop_publisher_lost"] += 1
            with self._lock:
                self.shield.estop(True)
        # The observation was fresh when it was taken; the action is only as fresh as that observation. One
        # computed after a stall (slow inference, a weight load, a paused process) is not sent either.
        late = self._late_reason(time.monotonic()) if self._obs_fresh else None
        if late:
            self.stats["late_actions"] += 1
            info["late_action"] = 1
            info["late_reason"] = late
            if self.cfg.on_stale == "raise":
                raise StaleObservationError(f"the action was computed from an observation whose {late}")
        if self._obs_fresh and not late:
            target = self._joint_targets(action, self._obs_state.position.numpy())
            gripper = None
            if self.gripper_action:
                g = self.spec.gripper
                gripper = g.open + (action[-1] + 1.0) * 0.5 * (g.closed - g.open)
            self._post(target, gripper)
        else:
            info["skipped_stale"] = 1  # an action computed from a stale observation is not sent
        delay = self._next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            self.stats["late_policy_steps"] += 1
        # late (a slow policy or a stall): the next tick is a whole period from now, never a burst of steps
        self._next_tick = max(self._next_tick, time.monotonic()) + 1.0 / self.cfg.policy_rate_hz
        obs, obs_info = self._observe()
        obs = self._stack_frames(obs, fresh=False)
        info.update(obs_info)
        info.update(self._take_info())
        with self._lock:
            info["shield_latched"] = int(self.shield.latched is not None)
        self._t += 1
        self._last_obs = obs
        truncated = self.episode_steps is not None and self._t >= self.episode_steps
        return obs, 0.0, False, truncated, info

    def estop(self, active: bool = True) -> None:
        """The same as a message on the e-stop topic."""
        with self._lock:
            self.shield.estop(active)

    def acknowledge_estop(self) -> None:
        """The same as a true message on the acknowledgement topic: after the e-stop is released, the next
        reset() may restart (raises while the e-stop, by any live publisher on its topic, is still pressed or
        not known to be released)."""
        why = None if self._estop is None else self._estop.not_known_released()
        with self._lock:
            if why is not None:
                self.shield.estop(True)
                raise EStopLatchedError(f"acknowledgement refused: {why}", pressed=True)
            self.shield.acknowledge_estop()

    def _wait_at_rest(self, timeout: float) -> bool:
        """Whether the setpoint came to rest within `timeout` (True at once if there is nothing to wait for)."""
        deadline = time.monotonic() + timeout
        while self._started and self._thread.is_alive():
            if self.at_rest:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    @property
    def at_rest(self) -> bool:
        """The shield's setpoint has stopped, read between control periods: once True, `setpoint` is the
        resting one (the shield's own flag, read unlocked, can change mid-period, before that period's
        setpoint is published)."""
        with self._lock:
            return self.shield.at_rest

    @property
    def setpoint(self) -> np.ndarray | None:
        """The last setpoint published."""
        with self._lock:
            return None if self._last_setpoint is None else self._last_setpoint.copy()

    def close(self) -> None:
        """Send no new targets; the arm finishes its last safe move (or the command timeout holds it), and
        once the setpoint rests the control thread stops and the bridge is left. A move still under way after
        `close_timeout` is braked (the shield's e-stop) before the thread stops: a forward controller left
        holding a moving setpoint would stop the arm dead."""
        if self._closing.is_set():
            return
        with self._lock:
            self._pending = None
        if not self._wait_at_rest(self.cfg.close_timeout):
            with self._lock:
                self.shield.estop(True)
            log.warning(
                "robot env close: still moving after %.1f s; braking before the control thread stops",
                self.cfg.close_timeout,
            )
            if not self._wait_at_rest(2 * self.shield.limits.brake_time + 0.1):
                log.error("robot env close: the setpoint did not come to rest; stopping the control thread")
        self._closing.set()
        self._thread.join(timeout=2.0)
        if self._owns_bridge and self.bridge is not None:
            self.bridge.close()
        self.bridge = None
        super().close()
