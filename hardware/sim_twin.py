"""`robotrl-sim-twin`: a MuJoCo arm that behaves like a ros2_control robot on the ROS 2 topics of a real one.

    robotrl-sim-twin robot=panda                          # 500 Hz, until Ctrl-C
    robotrl-sim-twin robot=panda rate_hz=100 duration=30 cameras=[front,wrist]

Every control period (`rate_hz`; the physics takes `round(period / model timestep)` substeps) the twin
applies the newest command, steps the model and publishes `/joint_states` (sensor_msgs/JointState: the
robot spec's joints, then its gripper joints; position, velocity, effort; header stamp = wall clock), as
ros2_control's joint_state_broadcaster does. It takes commands as ros2_control's controllers do:

- `/<controller>/commands` (std_msgs/Float64MultiArray, one joint position per spec joint, in spec order;
  forward_position_controller): the new setpoint, held until the next command;
- `/<trajectory_controller>/joint_trajectory` (trajectory_msgs/JointTrajectory; joint_trajectory_controller):
  joints matched by name (a subset holds the others), followed from the current setpoint through the points
  at their `time_from_start`, counted from `header.stamp` (zero: on receipt); cubic when every point gives
  velocities, else linear; the last point is held;
- `/<gripper_controller>/commands` (Float64MultiArray, one value: metres per finger) when the robot has one;
- with `gripper_actions=true`, also franka_gripper's actions, `<gripper_action_namespace>/move`, `/grasp`,
  `/homing`, and a control_msgs GripperCommand at `<gripper_action_namespace>/gripper_action`
  (hardware/twin_gripper_server.py): each goal sets the finger target (clamped to the gripper's range, as a topic
  command is) and watches the fingers' opening in the simulation;
- `impedance_topic` (`/cartesian_impedance_controller/equilibrium_pose`, geometry_msgs/PoseStamped; franka_ros's
  cartesian_impedance_example_controller, as HIL-SERL runs a Franka) when the robot spec names an
  `end_effector_site`: the equilibrium pose of that tool point (metres, unit quaternion, in the model's world frame:
  the arm's base). The arm's position actuators are then switched off and every physics step applies the torques
  of a Cartesian spring and damper toward it (hardware/twin_impedance.py; `impedance_stiffness`,
  `impedance_damping_ratio`, `impedance_nullspace_stiffness`, limited in rate and effort), so contact-rich policies
  rehearse with compliance; published efforts are those torques. The gripper stays position-controlled.

The newest command of any kind replaces the others: an equilibrium pose switches the arm to impedance control, a
joint-position command or trajectory back to position control (from where the arm is). A message with the wrong
number of values, a non-finite value, unknown or repeated joint names, times that do not increase, a quaternion
that is not a unit one (`bad_quaternion`) or a header.frame_id other than a non-empty `frame_id` (`wrong_frame`)
is rejected whole and counted (`rejected[<reason>]`), never applied; positions outside the model's joint ranges are
clamped to them and counted (`clamped`). The twin is the robot, not the safety shield (robotrl/safety/): an
equilibrium far from the arm is followed within the torque and torque-rate limits, as a Franka would.

The loop is paced by absolute deadlines (`t0 + k * period`, so it does not drift); a period whose deadline
passed more than one period before the loop got to it is skipped and counted in `missed` (the simulation
then runs behind the wall clock by that period; it does not step twice to catch up). Optional cameras
(`cameras=[...]`, MJCF camera names) render on their own thread from a copy of the state at `camera_rate_hz`
and publish sensor_msgs/Image (rgb8) on `/camera/<name>/image_raw` (MUJOCO_GL=egl renders headless).
Bodies named in `objects` (in a task's scene: `model=tasks/assets/panda_push.xml objects=[puck]`) have
their world pose published as geometry_msgs/PoseStamped on `/objects/<name>/pose` at `object_rate_hz`, as a
motion-capture system would, for a robot env that tracks them (`hardware.objects`). A std_msgs/Bool true on
`scene_reset_topic` (`/scene/reset`) puts those that are free bodies back where the model starts them, at
rest: the person who resets the scene between episodes (`place_object` moves one from Python).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
from robotrl.hardware.realtime import check_priority, set_realtime_priority
from robotrl.hardware.ros2 import make_bridge
from robotrl.hardware.ros2.names import full_topic_name, topic_for
from robotrl.hardware.twin_gripper_server import TwinGripperServer
from robotrl.hardware.twin_impedance import CartesianImpedance, ImpedanceGains, check_gains, unit_quaternion
from robotrl.hardware.twin_models import MAX_LATENCY_S, CommandDelay, StateNoise

from robotrl.cli_errors import reports_errors
from robotrl.config import strict_object
from robotrl.core.model_overlay import ModelOverlay, load_overlay
from robotrl.core.robot_spec import RobotSpec, load_robot_spec

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "tasks" / "assets"
TIMING_WINDOW = 200_000  # periods whose timings stats() reports (400 s at 500 Hz)
REJECT_REASONS = ("wrong_length", "non_finite", "unknown_joint", "bad_trajectory")  # always in stats()
POSE_REJECT_REASONS = ("bad_quaternion", "wrong_frame")  # equilibrium poses only; in stats() once counted

# The robot's own MJCF plus the table-top scene every task shares (floor, light, headless-friendly rendering)
# and the `front` camera of the Panda tasks; the robot model itself is the repository's, unchanged.
_SCENE = """<mujoco model="{robot}_twin">
  <include file="{robot_xml}"/>
  <include file="{scene_xml}"/>
  <worldbody>
    <camera name="front" pos="1.35 -0.75 0.75" xyaxes="0.640 0.768 0 -0.291 0.243 0.925" fovy="45"/>
  </worldbody>
</mujoco>"""


@dataclass
class SimTwinConfig:
    robot: str = "panda"  # robotrl/core/robots/<robot>.yaml; the model is tasks/assets/<robot>.xml
    model: str | None = None  # another MJCF file (used as is, no scene added)
    rate_hz: float = 500.0  # control rate: joint states out, commands applied
    duration: float | None = None  # seconds to run; None: until SIGINT/SIGTERM
    domain_id: int = 0
    backend: str = "dds"  # dds | rclpy | auto (hardware/ros2/bridge.py:make_bridge)
    loopback: bool = True  # stay on this machine (interface lo, no multicast)
    joint_states_topic: str = "/joint_states"
    controller: str = "forward_position_controller"  # /<controller>/commands; "" turns it off
    trajectory_controller: str = "joint_trajectory_controller"  # /<...>/joint_trajectory; "" turns it off
    gripper_controller: str = "gripper_controller"  # /<...>/commands; "" (or a robot without gripper): off
    # Also serve the gripper as franka_gripper does, beside its topic: Move, Grasp and Homing actions under
    # gripper_action_namespace and a control_msgs GripperCommand at <namespace>/gripper_action, for a robot env with
    # hardware.gripper_interface=franka_action or gripper_command (hardware/twin_gripper_server.py); backend dds
    gripper_actions: bool = False
    gripper_action_namespace: str = "/franka_gripper"
    state_qos: str = "default"  # QoS preset of /joint_states (joint_state_broadcaster: reliable, depth 10)
    command_qos: str = "default"  # QoS preset of the command topics
    frame_id: str = ""
    cameras: list[str] = field(default_factory=list)  # MJCF camera names (panda: front, wrist); [] = none
    camera_rate_hz: float = 10.0
    camera_width: int = 320
    camera_height: int = 240
    # Bodies whose world pose the twin publishes as a motion-capture system would (geometry_msgs/PoseStamped on
    # object_topic, frame_id = frame_id), e.g. objects=[puck] with model=<robotrl>/tasks/assets/panda_push.xml
    objects: list[str] = field(default_factory=list)
    object_topic: str = "/objects/{name}/pose"
    object_frame: str = ""  # the poses' header.frame_id (the model's world: the robot's base)
    object_rate_hz: float = 100.0  # applied as a whole number of control periods per pose
    # std_msgs/Bool true on this topic puts every tracked object back where the model starts it, at rest: the
    # person who resets the scene between episodes (a robot env's hardware.scene_reset_topic asks); "": none
    scene_reset_topic: str = "/scene/reset"
    # the robot's own e-stop button, released: std_msgs/Bool false, latched, as a lab's e-stop node publishes it
    # (a robot env refuses to start without a live e-stop publisher); press it from another publisher; "": none
    estop_topic: str = "/estop"
    # The joint dynamics robotrl-sysid identified on the robot (robotrl/core/model_overlay.py), written into the
    # model: the twin then behaves as that robot, not as the nominal model; None: the model as it is
    overlay: str | None = None
    # Actuator and sensor models (hardware/twin_models.py), so a rehearsal meets what training modelled
    # (docs/sim2real.md): a command takes effect latency_ms after the twin received it (in whole physics steps;
    # None: the overlay's identified command latency, 0 without an overlay);
    # published joint states carry a per-joint offset drawn at start-up (an encoder's calibration, std
    # joint_pos_bias), per-message noise (std joint_pos_noise rad, joint_vel_noise rad/s) and are lost with
    # probability state_drop_prob; published object positions carry noise (std object_pos_noise m)
    latency_ms: float | None = None
    joint_pos_bias: float = 0.0
    joint_pos_noise: float = 0.0
    joint_vel_noise: float = 0.0
    object_pos_noise: float = 0.0
    state_drop_prob: float = 0.0
    noise_seed: int = 0
    report_interval: float = 10.0  # seconds between status lines in the log; 0: none
    # Periods whose deadline passed while the loop was late are simulated at once, unpublished, up to this many
    # per overrun, so the physics stays on the wall clock that stamps its states. Skipped, each left the physics a
    # period behind for good: 54 of them put 108 ms of drift into a 2 ms twin's system-identification recording
    # (bench/results/sysid.jsonl, 2026-11-28). Past the bound (an overloaded machine) periods are missed instead.
    max_catch_up_periods: int = 10
    realtime_priority: int = 0  # SCHED_FIFO priority (1-99) of the thread that runs the loop; 0: normal
    # Cartesian impedance control of the arm (hardware/twin_impedance.py) toward equilibrium poses of the robot
    # spec's end_effector_site on this topic (geometry_msgs/PoseStamped); "": off (so is a robot without a tool point)
    impedance_topic: str = "/cartesian_impedance_controller/equilibrium_pose"
    # N/m (x, y, z), then Nm/rad (about x, y, z), world axes: HIL-SERL's Franka values. On the twin's Panda they give
    # task-space modes of 10-43 rad/s at home, omega * dt <= 0.09 with the model's 2 ms physics step: far inside what
    # torques computed once a step keep stable (about 1) at any rate_hz; a 10 N push moves the tool 5 mm as on a robot
    impedance_stiffness: list[float] = field(default_factory=lambda: [2000.0, 2000.0, 2000.0, 150.0, 150.0, 150.0])
    # zeta of every task-space mode, their inertia included (SERL's 2 sqrt(K) damping assumes a 1 kg tool and
    # leaves the twin's 5-12 kg one underdamped); 1: a 2 cm step arrives without overshoot
    impedance_damping_ratio: float = 1.0
    # Nm/rad pulling the arm's redundant (elbow) motion toward the spec's home pose, as franka's example controller
    # pulls it toward its start: 10 brings it back within one or two seconds on the twin's joints (0.1-1.5 kg m^2
    # with their armature) at 1 Nm per 0.1 rad; the dynamically consistent projection keeps it out of the tool's motion
    impedance_nullspace_stiffness: float = 10.0
    # Nm/s per joint: Franka's example controller's delta_tau_max (1 Nm per 1 ms cycle), so a far equilibrium
    # ramps the torques up instead of kicking the arm
    impedance_torque_rate_limit: float = 1000.0
    # Nm per joint, at most the robot spec's effort_limit (a gentler rehearsal); None: the spec's (Franka: 87 x4, 12 x3)
    impedance_effort_limit: list[float] | None = None

    def validate(self) -> None:
        if not (isinstance(self.rate_hz, (int, float)) and math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise ValueError(f"rate_hz must be a finite number > 0, got {self.rate_hz!r}")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0 seconds or None (run until stopped), got {self.duration!r}")
        if not (isinstance(self.object_rate_hz, (int, float)) and 0 < self.object_rate_hz <= self.rate_hz):
            raise ValueError(f"object_rate_hz must be in (0, rate_hz={self.rate_hz}], got {self.object_rate_hz!r}")
        for name in self.objects:
            topic_for(self.object_topic, name, "object_topic")
        if not isinstance(self.gripper_actions, bool):
            raise ValueError(f"gripper_actions must be true or false, got {self.gripper_actions!r}")
        if self.gripper_actions and self.backend != "dds":
            raise ValueError(
                "gripper_actions=true serves ROS 2 actions, which run on the dds backend only; backend is "
                f"{self.backend!r}: set backend=dds"
            )
        for key in ("scene_reset_topic", "estop_topic", "gripper_action_namespace"):
            if getattr(self, key):
                try:
                    full_topic_name(getattr(self, key))  # a bad name fails here, before joining the domain
                except (TypeError, ValueError) as error:
                    raise ValueError(f"{key}: {error}") from None
        if not self.camera_rate_hz > 0:
            raise ValueError(f"camera_rate_hz must be > 0, got {self.camera_rate_hz!r}")
        if self.camera_width < 1 or self.camera_height < 1:
            raise ValueError(
                f"camera_width and camera_height must be >= 1, got {self.camera_width}x{self.camera_height}"
            )
        if self.report_interval < 0:
            raise ValueError(f"report_interval must be >= 0, got {self.report_interval!r}")
        if isinstance(self.max_catch_up_periods, bool) or not (
            isinstance(self.max_catch_up_periods, int) and self.max_catch_up_periods >= 0
        ):
            raise ValueError(f"max_catch_up_periods must be an integer >= 0, got {self.max_catch_up_periods!r}")
        if self.latency_ms is not None and not (
            math.isfinite(self.latency_ms) and 0 <= self.latency_ms <= MAX_LATENCY_S * 1000
        ):
            raise ValueError(
                f"latency_ms must be within [0, {MAX_LATENCY_S * 1000:g}] (the twin's command buffer), got "
                f"{self.latency_ms!r}"
            )
        for key in ("joint_pos_bias", "joint_pos_noise", "joint_vel_noise", "object_pos_noise"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a finite standard deviation >= 0, got {value!r}")
        if not (math.isfinite(self.state_drop_prob) and 0 <= self.state_drop_prob < 1):
            raise ValueError(f"state_drop_prob must be in [0, 1), got {self.state_drop_prob!r}")
        check_priority("realtime_priority", self.realtime_priority)
        if self.impedance_topic:
            try:
                full_topic_name(self.impedance_topic)
            except (TypeError, ValueError) as error:
                raise ValueError(f"impedance_topic: {error}") from None
        check_gains(
            list(self.impedance_stiffness),
            self.impedance_damping_ratio,
            self.impedance_nullspace_stiffness,
            self.impedance_torque_rate_limit,
            None if self.impedance_effort_limit is None else list(self.impedance_effort_limit),
            prefix="impedance_",
        )


def load_twin_model(cfg: SimTwinConfig, overlay: ModelOverlay | None = None) -> mujoco.MjModel:
    """The twin's model: `cfg.model`, or the robot's MJCF in the shared scene; `overlay`'s joint dynamics written
    into it."""
    if cfg.model is not None:
        path = Path(cfg.model)
        if not path.exists():
            raise FileNotFoundError(f"model {cfg.model!r} does not exist")
        spec = mujoco.MjSpec.from_file(str(path))
    else:
        robot_xml = ASSETS / f"{cfg.robot}.xml"
        if not robot_xml.exists():
            raise FileNotFoundError(f"robot {cfg.robot!r} has no model {robot_xml}; give one with model=<file.xml>")
        spec = mujoco.MjSpec.from_string(
            _SCENE.format(robot=cfg.robot, robot_xml=robot_xml, scene_xml=ASSETS / "scene.xml")
        )
    if overlay is not None:
        overlay.apply_to_spec(spec)
    return spec.compile()


class _Rejected(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass
class _Trajectory:
    """A JointTrajectory resolved to the twin's joints: positions [P, J] at `times` (seconds after `start`,
    wall clock), the first row the setpoint when it arrived; cubic Hermite when `velocities` is given."""

    joints: np.ndarray
    start: float
    times: np.ndarray
    positions: np.ndarray
    velocities: np.ndarray | None
    from_setpoint: bool  # the first row is the setpoint when it arrived (the first point is later than t=0)

    def sample(self, now: float) -> np.ndarray:
        t = now - self.start
        if t <= self.times[0]:
            return self.positions[0]
        if t >= self.times[-1]:
            return self.positions[-1]
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        t0, t1 = self.times[i], self.times[i + 1]
        h = t1 - t0
        s = (t - t0) / h
        p0, p1 = self.positions[i], self.positions[i + 1]
        if self.velocities is None:
            return p0 + s * (p1 - p0)
        v0, v1 = self.velocities[i] * h, self.velocities[i + 1] * h
        s2, s3 = s * s, s * s * s
        return (2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * v0 + (-2 * s3 + 3 * s2) * p1 + (s3 - s2) * v1


class SimTwin:
    """The twin: `step()` runs one control period unpaced, `run(duration)` paces it at `rate_hz` until the
    duration passes or `stop()` is called, `close()` leaves the ROS 2 domain. `stats()` reports periods,
    missed periods, period jitter and command counts.

    on_command(kind, msg, received_wall_time) runs on the bridge's receive thread after a command was
    accepted (kind "commands", "joint_trajectory", "equilibrium_pose" or "gripper"); benchmarks use it to time
    round trips.
    """

    def __init__(
        self,
        cfg: SimTwinConfig | None = None,
        bridge: Any | None = None,
        on_command: Callable[[str, Any, float], None] | None = None,
    ):
        self.cfg = cfg = cfg or SimTwinConfig()
        cfg.validate()
        self.spec: RobotSpec = load_robot_spec(cfg.robot)
        self.overlay = load_overlay(cfg.overlay) if cfg.overlay else None
        if self.overlay is not None and self.overlay.robot not in ("", cfg.robot):
            raise ValueError(f"overlay {cfg.overlay!r} identified a {self.overlay.robot}; the twin is a {cfg.robot}")
        self.model = load_twin_model(cfg, self.overlay)
        self.data = mujoco.MjData(self.model)
        self.period = 1.0 / cfg.rate_hz
        timestep = float(self.model.opt.timestep)
        self.substeps = max(1, round(self.period / timestep))
        if abs(self.substeps * timestep - self.period) > 1e-9 + 1e-6 * self.period:
            log.warning(
                "control period %.6f s is not a multiple of the model timestep %.6f s; each period steps %d "
                "times (%.6f s of simulated time)",
                self.period,
                timestep,
                self.substeps,
                self.substeps * timestep,
            )
        self._on_command = on_command

        # The commanded joints (spec order) and the joints published (those, then the gripper's).
        self.joint_names = list(self.spec.joints)
        self._joint_ids = np.array([self._id(mujoco.mjtObj.mjOBJ_JOINT, n, "joint") for n in self.joint_names])
        self._actuators = np.array([self._actuator_of(j) for j in self._joint_ids])
        self.lower = self.model.jnt_range[self._joint_ids, 0].copy()
        self.upper = self.model.jnt_range[self._joint_ids, 1].copy()
        gripper = self.spec.gripper
        if cfg.gripper_actions and gripper is None:
            raise ValueError(f"gripper_actions=true: robot {cfg.robot!r} has no gripper")
        self.has_gripper = gripper is not None and (bool(cfg.gripper_controller) or cfg.gripper_actions)
        self.state_names = self.joint_names + (list(gripper.joints) if gripper is not None else [])
        state_ids = np.array([self._id(mujoco.mjtObj.mjOBJ_JOINT, n, "joint") for n in self.state_names])
        self._qpos = self.model.jnt_qposadr[state_ids]
        self._qvel = self.model.jnt_dofadr[state_ids]
        if self.has_gripper:
            self._gripper_actuator = self._actuator_of(state_ids[len(self.joint_names)])
            self._gripper_range = (min(gripper.open, gripper.closed), max(gripper.open, gripper.closed))

        # Start at rest in the home pose, holding it.
        self.data.qpos[self.model.jnt_qposadr[self._joint_ids]] = self.spec.home.double().numpy()
        mujoco.mj_forward(self.model, self.data)
        self._setpoint = self.spec.home.double().numpy().copy()
        self._target: np.ndarray | None = None  # newest forward command (replaced whole, read by the loop)
        self._trajectory: _Trajectory | None = None
        self._gripper_target: float | None = gripper.open if self.has_gripper else None
        self.data.ctrl[self._actuators] = self._setpoint
        if self.has_gripper:
            self.data.ctrl[self._gripper_actuator] = self._gripper_target
        self._command_lock = threading.Lock()
        latency = cfg.latency_ms / 1000 if cfg.latency_ms is not None else 0.0
        if cfg.latency_ms is None and self.overlay is not None:
            latency = self.overlay.command_latency
        self.latency_steps = round(latency / timestep)
        self._commands = CommandDelay(self.latency_steps, self.data.ctrl)
        self._impedance = self._impedance_controller()
        # The newest equilibrium pose [x, y, z, qw, qx, qy, qz] (None: position control), and the one in force
        # behind the same latency as the actuators' targets (NaN: position control), so a mode switch and the
        # setpoint it goes with take effect in the same physics step
        self._equilibrium: np.ndarray | None = None
        self._equilibria = CommandDelay(self.latency_steps, np.full(7, np.nan))
        self._arm_gains: tuple[np.ndarray, np.ndarray] | None = None  # the position actuators' while switched off
        self._sensors = StateNoise(
            len(self.state_names),
            cfg.joint_pos_bias,
            cfg.joint_pos_noise,
            cfg.joint_vel_noise,
            cfg.object_pos_noise,
            cfg.state_drop_prob,
            cfg.noise_seed,
        )
        self.states_lost = 0

        # Counters and timing.
        self.periods = 0
        self.missed = 0
        self.caught_up = 0
        self.accepted: dict[str, int] = defaultdict(int)
        self.rejected: dict[str, int] = defaultdict(int)
        self.clamped = 0
        self.images = 0
        # Timings of the last TIMING_WINDOW periods (jitter is reported over those; hours at 500 Hz stay bounded)
        self._publish_times: deque[float] = deque(maxlen=TIMING_WINDOW)
        self._lateness: deque[float] = deque(maxlen=TIMING_WINDOW)
        self._last_warning: dict[str, float] = {}
        self._stop = threading.Event()
        for name in cfg.cameras:  # before the bridge: a failed construction must not keep the domain joined
            self._id(mujoco.mjtObj.mjOBJ_CAMERA, name, "camera")
        self._cameras: _CameraThread | None = None
        self._object_bodies = {}
        for name in cfg.objects:
            body = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, name)
            if body < 0:
                raise KeyError(
                    f"objects: body {name!r} is not in the twin's model ({cfg.model or 'the plain ' + cfg.robot}); "
                    f"give a scene that holds it, e.g. model={ASSETS / 'panda_push.xml'} for the puck"
                )
            self._object_bodies[name] = body
        self.object_poses = 0  # pose messages published
        # object -> (position, wxyz orientation or None: kept) to put it at before the next physics step
        self._placements: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        self.scene_resets = 0  # scene reset requests carried out
        self._object_every = max(1, round(cfg.rate_hz / cfg.object_rate_hz))  # control periods per pose

        self._gripper_server: TwinGripperServer | None = None
        self._owns_bridge = bridge is None
        self.bridge = bridge or make_bridge(cfg.backend, domain_id=cfg.domain_id, loopback=cfg.loopback)
        try:
            self._open_topics()
        except BaseException:
            self._close_gripper_server()
            if self._owns_bridge:
                self.bridge.close()
            raise

    def _impedance_controller(self) -> CartesianImpedance | None:
        """The arm's Cartesian impedance controller, or None when impedance_topic is off or the robot has no tool
        point."""
        cfg, spec = self.cfg, self.spec
        if not cfg.impedance_topic or spec.end_effector_site is None:
            return None
        site = self._id(mujoco.mjtObj.mjOBJ_SITE, spec.end_effector_site, "end_effector_site")
        limit = spec.effort_limit.double().numpy()
        if cfg.impedance_effort_limit is not None:
            wanted = np.asarray(list(cfg.impedance_effort_limit), dtype=np.float64)
            if wanted.shape != limit.shape:
                raise ValueError(
                    f"impedance_effort_limit must have {len(limit)} values (one per joint of {cfg.robot}), got "
                    f"{wanted.tolist()}"
                )
            if (wanted > limit).any():
                raise ValueError(
                    f"impedance_effort_limit {wanted.tolist()} exceeds robot {cfg.robot!r}'s effort_limit "
                    f"{limit.tolist()} (the robot's own cannot be raised)"
                )
            limit = wanted
        gains = ImpedanceGains(
            stiffness=tuple(float(k) for k in cfg.impedance_stiffness),
            damping_ratio=float(cfg.impedance_damping_ratio),
            nullspace_stiffness=float(cfg.impedance_nullspace_stiffness),
            effort_limit=tuple(limit.tolist()),
            torque_rate_limit=float(cfg.impedance_torque_rate_limit),
        )
        dofs = self.model.jnt_dofadr[self._joint_ids]
        qpos = self.model.jnt_qposadr[self._joint_ids]
        return CartesianImpedance(self.model, self.data, qpos, dofs, site, gains, spec.home.double().numpy())

    def _open_topics(self) -> None:
        # cyclonedds (the ros extra) loads with the message types
        from robotrl.hardware.ros2.msgs import Float64MultiArray, Image, JointState, JointTrajectory, PoseStamped

        cfg = self.cfg
        self._JointState = JointState
        self.joint_states = self.bridge.publisher(cfg.joint_states_topic, JointState, cfg.state_qos)
        self.topics = {"joint_states": self.joint_states.topic}
        self._subscriptions = []
        self._estop_button = None
        if cfg.estop_topic:
            from robotrl.hardware.ros2.msgs import Bool  # cyclonedds (the ros extra) loads with the message types

            self._estop_button = self.bridge.publisher(cfg.estop_topic, Bool, "latched")
            self._estop_button.publish(Bool(data=False))
            self.topics["estop"] = self._estop_button.topic
        if cfg.controller:
            topic = f"/{cfg.controller}/commands"
            self._subscriptions.append(
                self.bridge.subscription(topic, Float64MultiArray, cfg.command_qos, self._on_forward)
            )
            self.topics["commands"] = topic
        if cfg.trajectory_controller:
            topic = f"/{cfg.trajectory_controller}/joint_trajectory"
            self._subscriptions.append(
                self.bridge.subscription(topic, JointTrajectory, cfg.command_qos, self._on_trajectory)
            )
            self.topics["joint_trajectory"] = topic
        if self._impedance is not None:
            self._subscriptions.append(
                self.bridge.subscription(cfg.impedance_topic, PoseStamped, cfg.command_qos, self._on_equilibrium_pose)
            )
            self.topics["equilibrium_pose"] = cfg.impedance_topic
        if self.has_gripper and cfg.gripper_controller:
            topic = f"/{cfg.gripper_controller}/commands"
            self._subscriptions.append(
                self.bridge.subscription(topic, Float64MultiArray, cfg.command_qos, self._on_gripper)
            )
            self.topics["gripper"] = topic
        if cfg.gripper_actions:
            self._gripper_server = TwinGripperServer(
                self.bridge,
                self._set_gripper_target,
                lambda: self.finger_opening,
                self.spec.gripper,
                namespace=cfg.gripper_action_namespace,
            )
            self.topics.update({f"gripper_action/{k}": name for k, name in self._gripper_server.actions.items()})

        from robotrl.hardware.ros2.tensors import pose_msg, time_msg  # the ros extra, imported with the bridge

        self._pose_msg, self._time_msg = pose_msg, time_msg  # kept: publish_object_poses runs in the control loop
        self._object_pubs = {}
        for name in cfg.objects:
            topic = cfg.object_topic.format(name=name)
            self._object_pubs[name] = self.bridge.publisher(topic, PoseStamped, "sensor_data")
            self.topics[f"object/{name}"] = self._object_pubs[name].topic
        if cfg.scene_reset_topic:
            from robotrl.hardware.ros2.msgs import Bool  # cyclonedds (the ros extra) loads with the message types

            self._subscriptions.append(
                self.bridge.subscription(cfg.scene_reset_topic, Bool, "default", self._on_scene_reset)
            )
            self.topics["scene_reset"] = cfg.scene_reset_topic
        if cfg.cameras:
            publishers = {
                name: self.bridge.publisher(f"/camera/{name}/image_raw", Image, "sensor_data") for name in cfg.cameras
            }
            self.topics.update({f"camera/{name}": p.topic for name, p in publishers.items()})
            self._cameras = _CameraThread(self, publishers)

    # -- model lookups ------------------------------------------------------------------------------
    def _id(self, kind, name: str, what: str) -> int:
        idx = mujoco.mj_name2id(self.model, kind, name)
        if idx < 0:
            raise KeyError(f"{what} {name!r} of robot {self.cfg.robot!r} is not in its model")
        return idx

    def _actuator_of(self, joint_id: int) -> int:
        for a in range(self.model.nu):
            if int(self.model.actuator_trntype[a]) == int(mujoco.mjtTrn.mjTRN_JOINT) and (
                self.model.actuator_trnid[a, 0] == joint_id
            ):
                return a
        raise KeyError(f"joint {mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_JOINT, joint_id)!r} has no actuator")

    # -- commands (run on the bridge's receive thread) -------------------------------------------------
    def _reject(self, kind: str, error: _Rejected) -> None:
        with self._command_lock:
            self.rejected[error.reason] += 1
        now = time.monotonic()
        if now - self._last_warning.get(error.reason, -math.inf) >= 1.0:  # at most one line per reason a second
            self._last_warning[error.reason] = now
            log.warning("rejected a %s message (%s): %s", kind, error.reason, error)

    def _clamp(self, positions: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
        clamped = np.clip(positions, lower, upper)
        if not np.array_equal(clamped, positions):
            with self._command_lock:
                self.clamped += 1
        return clamped

    def _accepted(self, kind: str, msg: Any) -> None:
        received = time.time()
        with self._command_lock:
            self.accepted[kind] += 1
        if self._on_command is not None:
            self._on_command(kind, msg, received)

    def _on_forward(self, msg) -> None:
        try:
            values = _finite(msg.data, len(self.joint_names), "commands")
        except _Rejected as error:
            return self._reject("commands", error)
        target = self._clamp(values, self.lower, self.upper)
        with self._command_lock:
            self._target, self._trajectory, self._equilibrium = target, None, None
        self._accepted("commands", msg)

    def _on_gripper(self, msg) -> None:
        try:
            (value,) = _finite(msg.data, 1, "gripper commands")
        except _Rejected as error:
            return self._reject("gripper", error)
        lo, hi = self._gripper_range
        clamped = min(max(value, lo), hi)
        with self._command_lock:
            self.clamped += int(clamped != value)
            self._gripper_target = clamped
        self._accepted("gripper", msg)

    def _set_gripper_target(self, value: float) -> None:
        """A gripper action's finger target (metres per finger; on the action server's goal threads)."""
        lo, hi = self._gripper_range
        clamped = min(max(float(value), lo), hi)
        with self._command_lock:
            self.clamped += int(clamped != value)
            self._gripper_target = clamped
            self.accepted["gripper_action"] += 1

    @property
    def finger_opening(self) -> float:
        """The gripper's opening in the simulation, metres per finger (the mean of its finger joints)."""
        fingers = self._qpos[len(self.joint_names) :]
        if not len(fingers):
            raise ValueError(f"robot {self.cfg.robot!r} has no gripper")
        return float(np.mean(self.data.qpos[fingers]))

    def _on_trajectory(self, msg) -> None:
        try:
            trajectory = self._resolve_trajectory(msg, time.time())
        except _Rejected as error:
            return self._reject("joint_trajectory", error)
        with self._command_lock:
            # The setpoint is read here, under the lock, so the trajectory starts where the arm is being held.
            if trajectory.from_setpoint:
                trajectory.positions[0] = self._setpoint[trajectory.joints]
            self._trajectory, self._target, self._equilibrium = trajectory, None, None
        self._accepted("joint_trajectory", msg)

    def _on_equilibrium_pose(self, msg) -> None:
        try:
            equilibrium = self._resolve_equilibrium(msg)
        except _Rejected as error:
            return self._reject("equilibrium_pose", error)
        with self._command_lock:
            self._equilibrium, self._target, self._trajectory = equilibrium, None, None
        self._accepted("equilibrium_pose", msg)

    def _resolve_equilibrium(self, msg) -> np.ndarray:
        """[x, y, z, qw, qx, qy, qz] of a PoseStamped (ROS orders a quaternion x, y, z, w; MuJoCo w, x, y, z)."""
        frame = self.cfg.frame_id
        if frame and msg.header.frame_id != frame:
            raise _Rejected(
                "wrong_frame", f"equilibrium pose in frame {msg.header.frame_id!r}, the twin's is {frame!r}"
            )
        p, q = msg.pose.position, msg.pose.orientation
        position = _finite([p.x, p.y, p.z], 3, "equilibrium position")
        quat = _finite([q.w, q.x, q.y, q.z], 4, "equilibrium orientation")
        try:
            quat = unit_quaternion(quat)
        except ValueError as error:
            raise _Rejected("bad_quaternion", f"equilibrium orientation (w, x, y, z): {error}") from None
        return np.concatenate([position, quat])

    def _resolve_trajectory(self, msg, now: float) -> _Trajectory:
        names = list(msg.joint_names)
        if not names:
            raise _Rejected("unknown_joint", "joint_trajectory names no joints")
        unknown = [n for n in names if n not in self.joint_names]
        if unknown:
            raise _Rejected("unknown_joint", f"unknown joints {unknown}; this robot has {self.joint_names}")
        if len(set(names)) != len(names):
            raise _Rejected("unknown_joint", f"joint names repeat: {names}")
        if not msg.points:
            raise _Rejected("bad_trajectory", "joint_trajectory has no points")
        joints = np.array([self.joint_names.index(n) for n in names])
        times, positions, velocities = [], [], []
        for i, point in enumerate(msg.points):
            positions.append(_finite(point.positions, len(names), f"point {i} positions"))
            if point.velocities:
                velocities.append(_finite(point.velocities, len(names), f"point {i} velocities"))
            t = point.time_from_start.sec + point.time_from_start.nanosec * 1e-9
            if times and not t > times[-1]:
                raise _Rejected(
                    "bad_trajectory", f"time_from_start must increase: point {i} at {t} s after {times[-1]} s"
                )
            times.append(t)
        if velocities and len(velocities) != len(positions):
            raise _Rejected("bad_trajectory", "either every point gives velocities or none does")
        if times[0] < 0:
            raise _Rejected("bad_trajectory", f"time_from_start must be >= 0, got {times[0]} s")
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        positions_arr = self._clamp(np.stack(positions), self.lower[joints], self.upper[joints])
        # Prepend the setpoint at t=0 (filled in under the lock) unless the first point is at t=0 itself.
        from_setpoint = times[0] > 0
        if from_setpoint:
            times.insert(0, 0.0)
            positions_arr = np.concatenate([positions_arr[:1], positions_arr])
            if velocities:
                velocities.insert(0, np.zeros(len(names)))
        return _Trajectory(
            joints=joints,
            start=stamp if stamp > 0 else now,
            times=np.asarray(times),
            positions=positions_arr,
            velocities=np.stack(velocities) if velocities else None,
            from_setpoint=from_setpoint,
        )

    # -- the control period -------------------------------------------------------------------------
    def step(self) -> None:
        """One control period, in ros2_control's order: publish the state read at the period's start (stamped now),
        then apply the newest command and simulate the period. Publishing after simulating stamped each state a
        period before the physics it showed, and an identified command latency came out a period short
        (bench/results/sysid.jsonl, 2026-11-28: 6.9 ms fitted for a 12 ms twin at 250 Hz)."""
        self.publish_joint_state()
        if self._object_pubs and self.periods % self._object_every == 0:
            self.publish_object_poses()
        if self._cameras is not None:
            self._cameras.offer(self.data)
        self._simulate_period()

    def _simulate_period(self, wall: float | None = None) -> None:
        """Apply the newest command (and any object placements) and step the physics through one period; a
        trajectory is sampled at `wall` (the period's own wall-clock time when caught up late; None: now)."""
        arm = self.data.qpos[self._qpos[: len(self.joint_names)]]
        with self._command_lock:
            equilibrium = self._equilibrium
            if equilibrium is not None:
                self._setpoint[:] = arm  # where a joint command that takes over starts from
            elif self._trajectory is not None:
                trajectory = self._trajectory
                self._setpoint[trajectory.joints] = trajectory.sample(time.time() if wall is None else wall)
            elif self._target is not None:
                self._setpoint[:] = self._target
            sent = self._commands.in_force.copy()
            sent[self._actuators] = self._setpoint
            if self._gripper_target is not None:
                sent[self._gripper_actuator] = self._gripper_target
            placements, self._placements = self._placements, {}
        self._commands.send(sent)
        if self._impedance is not None:
            self._equilibria.send(np.full(7, np.nan) if equilibrium is None else equilibrium)
        for name, (position, quat) in placements.items():
            joint = self._free_joint(name)
            qpos, dof = self.model.jnt_qposadr[joint], self.model.jnt_dofadr[joint]
            self.data.qpos[qpos : qpos + 3] = position
            if quat is not None:
                self.data.qpos[qpos + 3 : qpos + 7] = quat
            self.data.qvel[dof : dof + 6] = 0.0
        for _ in range(self.substeps):
            self.data.ctrl[:] = self._commands.tick()  # the command in force, latency_ms after it was sent
            equilibrium = self._equilibria.tick() if self._impedance is not None else None
            if equilibrium is not None:
                self._switch_arm_control(impedance=not np.isnan(equilibrium[0]))
            if self._arm_gains is None:
                mujoco.mj_step(self.model, self.data)
            else:  # the torques from the state this step starts from: kinematics first, then the rest of the step
                mujoco.mj_step1(self.model, self.data)
                self.data.qfrc_applied[self._impedance.dof_ids] = self._impedance.torques(
                    equilibrium[:3], equilibrium[3:]
                )
                mujoco.mj_step2(self.model, self.data)
        self.periods += 1

    def _switch_arm_control(self, impedance: bool) -> None:
        """Switch the arm's position actuators off (their gains saved; the impedance torques take over from the
        torques they were applying) or back on (the impedance torques gone). The gripper's actuator stays."""
        model, arm, dofs = self.model, self._actuators, self._impedance.dof_ids
        if impedance and self._arm_gains is None:
            self._arm_gains = (model.actuator_gainprm[arm].copy(), model.actuator_biasprm[arm].copy())
            self._impedance.reset(self.data.qfrc_actuator[dofs])
            model.actuator_gainprm[arm] = 0.0
            model.actuator_biasprm[arm] = 0.0
        elif not impedance and self._arm_gains is not None:
            model.actuator_gainprm[arm], model.actuator_biasprm[arm] = self._arm_gains
            self._arm_gains = None
            self.data.qfrc_applied[dofs] = 0.0

    @property
    def control_mode(self) -> str:
        """How the arm is controlled in the physics now: "position" or "impedance"."""
        return "position" if self._arm_gains is None else "impedance"

    def place_object(self, name: str, position, quat=None) -> None:
        """Put tracked object `name` (a free body) at `position` [x, y, z] at rest, turned to `quat` [w, x, y, z]
        (normalised; None keeps its orientation), before the next physics step: what a person does between robot
        episodes."""
        if name not in self._object_bodies:
            raise KeyError(f"place_object: {name!r} is not a tracked object (objects: {list(self._object_bodies)})")
        if self._free_joint(name) is None:
            raise ValueError(f"place_object: body {name!r} is not free to move (no free joint)")
        position = np.asarray(position, dtype=np.float64)
        if position.shape != (3,) or not np.isfinite(position).all():
            raise ValueError(f"place_object: {name!r} needs a finite [x, y, z], got {position.tolist()}")
        if quat is not None:
            quat = np.asarray(quat, dtype=np.float64)
            norm = float(np.linalg.norm(quat)) if quat.shape == (4,) and np.isfinite(quat).all() else 0.0
            if norm < 1e-6:
                raise ValueError(f"place_object: {name!r} needs a finite, non-zero [w, x, y, z], got {quat.tolist()}")
            quat = quat / norm
        with self._command_lock:
            self._placements[name] = (position, quat)

    def _on_scene_reset(self, msg) -> None:
        """Every tracked object back where the model starts it (its free joint's qpos0), at rest."""
        if not msg.data:
            return
        with self._command_lock:
            for name in self._object_bodies:
                if (joint := self._free_joint(name)) is not None:
                    start = self.model.qpos0[self.model.jnt_qposadr[joint] :][:7].copy()
                    self._placements[name] = (start[:3], start[3:])
            self.scene_resets += 1

    def _free_joint(self, name: str) -> int | None:
        """The free joint of tracked object `name` (its position, orientation and velocity), or None."""
        joint = self.model.body_jntadr[self._object_bodies[name]]
        return int(joint) if joint >= 0 and self.model.jnt_type[joint] == mujoco.mjtJoint.mjJNT_FREE else None

    def publish_joint_state(self) -> None:
        if self._sensors.lost():
            self.states_lost += 1
            return
        data = self.data
        effort = data.qfrc_actuator[self._qvel]
        if self._arm_gains is not None:  # impedance control: the torques commanded (the actuators are off)
            effort[: len(self.joint_names)] = self._impedance.torque
        now = time.time()
        position, velocity = self._sensors.joint_state(data.qpos[self._qpos], data.qvel[self._qvel])
        msg = self._JointState(
            name=self.state_names,
            position=position.tolist(),
            velocity=velocity.tolist(),
            effort=effort.tolist(),
        )
        ns = int(now * 1e9)
        msg.header.stamp.sec, msg.header.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
        msg.header.frame_id = self.cfg.frame_id
        self.joint_states.publish(msg)
        self._publish_times.append(time.monotonic())

    def publish_object_poses(self) -> None:
        """Each tracked body's world pose (MuJoCo's xpos, xquat), stamped now."""
        stamp = self._time_msg(time.time())
        for name, body in self._object_bodies.items():
            position = self._sensors.object_position(self.data.xpos[body])
            msg = self._pose_msg(position, self.data.xquat[body], stamp, self.cfg.object_frame)
            self._object_pubs[name].publish(msg)
            self.object_poses += 1

    @property
    def setpoint(self) -> np.ndarray:
        with self._command_lock:
            return self._setpoint.copy()

    # -- pacing -------------------------------------------------------------------------------------
    def run(self, duration: float | None = None) -> dict[str, Any]:
        """Step at `rate_hz` on absolute deadlines until `duration` seconds pass (None: the config's; still
        None: until `stop()`). Returns `stats()`."""
        duration = self.cfg.duration if duration is None else duration
        set_realtime_priority("realtime_priority", self.cfg.realtime_priority)  # this thread, from here on
        if self._cameras is not None and not self._cameras.is_alive():
            self._cameras.start()
            self._cameras.ready.wait(30.0)  # creating the GL context stalls the process for ~100 ms: not in the loop
        period = self.period
        start = time.monotonic()
        end = math.inf if duration is None else start + duration
        ticks = math.inf if duration is None else math.ceil(duration / period - 1e-9)  # deadlines before the end
        next_report = start + self.cfg.report_interval if self.cfg.report_interval > 0 else math.inf
        tick = 0
        while not self._stop.is_set():
            deadline = start + tick * period
            if deadline >= end:
                break
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            now = time.monotonic()
            latest_due = min(int((now - start) / period), ticks)  # the newest deadline already passed
            if latest_due > tick:  # a period or more late (a long step, an overslept wait): catch up first, so the
                tick = self._catch_up(tick, latest_due, start, period)  # state published next shows its stamp's time
                deadline = start + tick * period
                if deadline >= end:
                    break
            self._lateness.append(time.monotonic() - deadline)
            self.step()
            tick += 1
            if now >= next_report:
                next_report = now + self.cfg.report_interval
                log.info("sim twin: %s", json.dumps(self.stats()))
        return self.stats()

    def _catch_up(self, tick: int, latest_due: int, start: float, period: float) -> int:
        """Simulate the periods from `tick` to before `latest_due` unpublished, up to max_catch_up_periods of them
        (the rest are missed), each commanded as at its own deadline; the period to serve next."""
        behind = latest_due - tick
        catch_up = min(behind, self.cfg.max_catch_up_periods)
        wall, mono = time.time(), time.monotonic()
        for k in range(catch_up):
            self._simulate_period(wall - (mono - (start + (tick + k) * period)))  # the period's own wall time
        self.caught_up += catch_up
        self.missed += behind - catch_up
        return latest_due

    def reset_stats(self) -> None:
        """Start the counters and timings of `stats()` afresh (after a warm-up, say)."""
        with self._command_lock:
            self.periods = self.missed = self.caught_up = self.clamped = self.images = self.object_poses = 0
            self.accepted.clear()
            self.rejected.clear()
            self._publish_times.clear()
            self._lateness.clear()

    def stop(self) -> None:
        """Make `run` return after the period in progress (thread- and signal-safe)."""
        self._stop.set()

    def stats(self) -> dict[str, Any]:
        intervals = np.diff(np.asarray(self._publish_times)) if len(self._publish_times) > 1 else np.zeros(0)
        lateness = np.asarray(self._lateness)
        due = self.periods + self.missed
        with self._command_lock:
            accepted, rejected, clamped = dict(self.accepted), dict(self.rejected), self.clamped

        def ms(values: np.ndarray, fn) -> float | None:
            return round(float(fn(values)) * 1e3, 4) if values.size else None

        return {
            "rate_hz": self.cfg.rate_hz,
            "periods": self.periods,  # simulated, caught-up ones included
            "caught_up": self.caught_up,  # simulated late, without a state published
            "missed": self.missed,  # never simulated (beyond max_catch_up_periods)
            "missed_frac": self.missed / due if due else 0.0,
            "period_mean_ms": ms(intervals, np.mean),
            "period_jitter_ms": ms(intervals, np.std),  # std of the intervals between joint states
            "period_max_ms": ms(intervals, np.max),
            "lateness_p99_ms": ms(lateness, lambda x: np.percentile(x, 99)),  # wake-up after the deadline
            "lateness_max_ms": ms(lateness, np.max),
            "accepted": accepted,
            "rejected": {reason: rejected.get(reason, 0) for reason in REJECT_REASONS}
            | {reason: rejected[reason] for reason in POSE_REJECT_REASONS if rejected.get(reason)},
            "control_mode": self.control_mode,
            "clamped": clamped,
            "images": self.images,
            "object_poses": self.object_poses,
            "scene_resets": self.scene_resets,
            "states_lost": self.states_lost,  # joint state messages state_drop_prob kept back
        }

    def _close_gripper_server(self) -> None:
        if self._gripper_server is not None:
            self._gripper_server.close()
            self._gripper_server = None

    def close(self) -> None:
        self._stop.set()
        if self._cameras is not None:
            self._cameras.close()
            self._cameras = None
        self._close_gripper_server()  # before the bridge: its goals end, its endpoints leave
        if self._owns_bridge and self.bridge is not None:
            self.bridge.close()
        self.bridge = None

    def __enter__(self) -> SimTwin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _finite(values, length: int, what: str) -> np.ndarray:
    if len(values) != length:
        raise _Rejected("wrong_length", f"{what} must have {length} values, got {len(values)}")
    array = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise _Rejected("non_finite", f"{what} has non-finite values at indices {bad.tolist()}")
    return array


class _CameraThread(threading.Thread):
    """Renders the cameras from a copy of the newest state at camera_rate_hz, off the control loop (an EGL
    frame costs milliseconds; the control loop only copies qpos when a frame is due)."""

    def __init__(self, twin: SimTwin, publishers: dict):
        super().__init__(name="robotrl-sim-twin-cameras", daemon=True)
        self.twin = twin
        self.publishers = publishers
        self.period = 1.0 / twin.cfg.camera_rate_hz
        self.data = mujoco.MjData(twin.model)
        self._qpos: np.ndarray | None = None
        self._ready = threading.Condition()
        self._next = 0.0
        self._closing = False
        self.ready = threading.Event()

    def offer(self, data) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = max(self._next + self.period, now)
        with self._ready:
            self._qpos = data.qpos.copy()
            self._ready.notify()

    def run(self) -> None:
        from robotrl.hardware.ros2.msgs import Image  # cyclonedds (the ros extra) loads with the message types

        cfg = self.twin.cfg
        try:
            renderer = mujoco.Renderer(self.twin.model, cfg.camera_height, cfg.camera_width)
        finally:
            self.ready.set()
        try:
            while True:
                with self._ready:
                    self._ready.wait_for(lambda: self._qpos is not None or self._closing)
                    if self._closing:
                        return
                    qpos, self._qpos = self._qpos, None
                self.data.qpos[:] = qpos
                mujoco.mj_forward(self.twin.model, self.data)
                now = time.time()
                ns = int(now * 1e9)
                for name, publisher in self.publishers.items():
                    renderer.update_scene(self.data, name)
                    pixels = renderer.render()
                    msg = Image(
                        height=cfg.camera_height,
                        width=cfg.camera_width,
                        encoding="rgb8",
                        step=cfg.camera_width * 3,
                        data=pixels.tobytes(),
                    )
                    msg.header.stamp.sec, msg.header.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
                    msg.header.frame_id = f"{name}_optical_frame"
                    publisher.publish(msg)
                    self.twin.images += 1
        finally:
            renderer.close()

    def close(self) -> None:
        with self._ready:
            self._closing = True
            self._ready.notify()
        if self.is_alive():
            self.join(timeout=5.0)


# ---- Hydra entry point -----------------------------------------------------------------------------------


def register_config() -> None:
    """Registers `sim_twin_schema` with Hydra (done by main; tools that compose the config call it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="sim_twin_schema", node=SimTwinConfig)


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    register_config()

    @hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="sim_twin")
    @reports_errors("robotrl-sim-twin")
    def _hydra_main(cfg: DictConfig) -> None:
        twin_cfg: SimTwinConfig = strict_object(SimTwinConfig, cfg)
        twin = SimTwin(twin_cfg)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: twin.stop())
        log.info(
            "sim twin of %s at %g Hz (%d physics steps a period) on ROS 2 domain %d (%s%s): %s",
            twin_cfg.robot,
            twin_cfg.rate_hz,
            twin.substeps,
            twin_cfg.domain_id,
            twin.bridge.backend,
            ", loopback" if twin_cfg.loopback else "",
            ", ".join(twin.topics.values()),
        )
        try:
            stats = twin.run()
        finally:
            twin.close()
        print(json.dumps({"sim_twin": stats}), flush=True)

    _hydra_main()


if __name__ == "__main__":
    main()
