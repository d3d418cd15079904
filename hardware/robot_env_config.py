"""The robot env's settings (`hardware.*`): one robot's connection, rates, age limits and reset waits, checked
by name before a bridge joins the domain. `configs/hardware/<name>.yaml` gives one per robot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from robotrl.hardware.cameras import parse_source
from robotrl.hardware.gripper_actions import (
    ACTION_INTERFACES,
    GRIPPER_INTERFACES,
    GripperActionConfig,
    GripperActionSettings,
)
from robotrl.hardware.realtime import check_priority
from robotrl.hardware.ros2.names import full_topic_name, topic_for

from robotrl.core.camera_crop import check_camera_crops
from robotrl.safety import PoseLimits, ShieldConfig

ON_STALE = ("hold", "raise")
COMMANDS = ("joint_position", "cartesian_pose")


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
    # What the arm is commanded: joint_position (the shield's setpoints on /<controller>/commands at control_rate_hz)
    # or cartesian_pose (an ee_delta policy's equilibrium pose, geometry_msgs/PoseStamped on pose_topic at the policy
    # rate, for a Cartesian impedance controller, as HIL-SERL commands its Franka: compliant in contact; checked by
    # the pose shield, robotrl/safety/pose_shield.py; resets move there too, through the same interface)
    command: str = "joint_position"
    pose_topic: str = "/cartesian_impedance_controller/equilibrium_pose"
    pose_frame: str = ""  # header.frame_id of the poses sent (the arm's base frame, e.g. panda_link0)
    # cartesian_pose: home reached when the tool point is this close (m) to its pose at the spec's home joints,
    # within pose_reset_angle (rad), and every joint slower than reset_velocity (an impedance controller's
    # nullspace settles the joints only loosely, so home is judged at the tool)
    pose_reset_tolerance: float = 0.005
    pose_reset_angle: float = 0.05
    # The gripper's controller: with gripper_interface topic its commands go to /<gripper_controller>/commands;
    # "": the robot env drives no gripper, whatever the interface
    gripper_controller: str = "gripper_controller"
    # How gripper setpoints (the shield's, metres per finger) reach the gripper. A Franka Hand has no ros2_control
    # position joint to write to: franka_gripper serves it as actions, as ros2_control's gripper action controller
    # serves others. topic: std_msgs/Float64MultiArray on /<gripper_controller>/commands (a forward controller);
    # franka_action: franka_gripper's Move/Grasp goals; gripper_command: control_msgs/action/GripperCommand goals.
    # The two action interfaces need backend dds (hardware/gripper_actions.py)
    gripper_interface: str = "topic"
    # the action interfaces' names, deadlines and goal parameters (hardware/gripper_actions.py:GripperActionSettings)
    gripper_actions: GripperActionSettings = field(default_factory=GripperActionSettings)
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
    # Where each camera's frames come from: "ros" (camera_topic, the default for a camera not named here) or
    # "opencv:<index | path | URL>" (a USB camera read on this machine through OpenCV, extra cameras: no camera
    # node, no topic; hardware/cameras.py), e.g. {wrist: "opencv:0"}
    camera_sources: dict[str, str] = field(default_factory=dict)
    # camera -> [top, bottom, left, right] fractions of its frame: the region the policy sees, area-resized to
    # image_size (HIL-SERL crops its views so). Must be the crop the policy trained with (task.camera_crops):
    # robotrl-deploy warns when they differ
    camera_crops: dict[str, list[float]] = field(default_factory=dict)
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
        if self.command not in COMMANDS:
            raise ValueError(f"hardware.command must be one of {', '.join(COMMANDS)}, got {self.command!r}")
        if self.command == "cartesian_pose":
            if not self.shield_config().has_workspace:
                raise ValueError(
                    "hardware.command=cartesian_pose: the pose shield keeps equilibria in a box; give "
                    "hardware.shield.workspace_min and workspace_max"
                )
            for name in ("pose_reset_tolerance", "pose_reset_angle"):
                value = getattr(self, name)
                if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                    raise ValueError(f"hardware.{name} must be a finite number > 0, got {value!r}")
        self._check_gripper()
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
        self._check_cameras()
        self._check_topics()

    def _check_gripper(self) -> None:
        interface = self.gripper_interface
        if interface not in GRIPPER_INTERFACES:
            raise ValueError(
                f"hardware.gripper_interface must be one of {', '.join(GRIPPER_INTERFACES)}, got {interface!r}"
            )
        if not isinstance(self.gripper_actions, GripperActionSettings):
            raise ValueError(
                f"hardware.gripper_actions must hold GripperActionSettings' keys, got {self.gripper_actions!r}"
            )
        self.gripper_actions.validate("hardware.gripper_actions")
        if interface not in ACTION_INTERFACES:
            return
        if self.backend != "dds":
            raise ValueError(
                f"hardware.gripper_interface={interface} sends ROS 2 actions, which run on the dds backend only; "
                f"hardware.backend is {self.backend!r}: set hardware.backend=dds"
            )
        if not self.gripper_controller:
            raise ValueError(
                f"hardware.gripper_interface={interface} drives a gripper, but hardware.gripper_controller is empty "
                "(no gripper driven): name the gripper's controller (franka_gripper), or set gripper_interface=topic"
            )

    def gripper_action_config(self) -> GripperActionConfig:
        """What the gripper's action client takes (gripper_interface franka_action or gripper_command)."""
        settings = {name: getattr(self.gripper_actions, name) for name in GripperActionSettings.__dataclass_fields__}
        return GripperActionConfig(interface=self.gripper_interface, **settings)

    def _check_cameras(self) -> None:
        if isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or self.image_size < 1:
            raise ValueError(f"hardware.image_size must be an integer >= 1, got {self.image_size!r}")
        if len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"hardware.cameras names a camera twice: {list(self.cameras)}")
        for key in ("camera_sources", "camera_crops"):
            value = getattr(self, key)
            if not hasattr(value, "items"):
                raise ValueError(f"hardware.{key} must map camera names to settings, got {value!r}")
            unknown = sorted(str(name) for name in value if name not in self.cameras)
            if unknown:
                raise ValueError(
                    f"hardware.{key} names cameras {unknown} that are not in hardware.cameras {list(self.cameras)}"
                )
        for name, source in self.camera_sources.items():
            parse_source(source, f"hardware.camera_sources.{name}")
        check_camera_crops(self.camera_crops, list(self.cameras), "hardware.camera_crops")

    def camera_source(self, name: str) -> tuple[str, int | str | None]:
        """Camera `name`'s source as (kind, what to open): ("ros", None) or ("opencv", index or path)."""
        return parse_source(self.camera_sources.get(name, "ros"), f"hardware.camera_sources.{name}")

    def camera_crop(self, name: str) -> tuple[float, float, float, float] | None:
        """Camera `name`'s crop (top, bottom, left, right), or None: the whole frame."""
        crop = self.camera_crops.get(name)
        return None if crop is None else tuple(float(v) for v in crop)

    def _check_topics(self) -> None:
        """Every topic name the env will use, before a bridge joins the domain."""
        topics = [("joint_states_topic", self.joint_states_topic), ("controller", f"/{self.controller}/commands")]
        if self.command == "cartesian_pose":
            topics.append(("pose_topic", self.pose_topic))
        if self.gripper_controller and self.gripper_interface == "topic":
            topics.append(("gripper_controller", f"/{self.gripper_controller}/commands"))
        names = ("estop_topic", "estop_ack_topic", "scene_reset_topic")
        topics += [(name, getattr(self, name)) for name in names if getattr(self, name)]
        for camera in self.cameras:
            if self.camera_source(camera)[0] != "ros":
                continue  # read on this machine (hardware/cameras.py): no topic
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

    def pose_limits(self) -> PoseLimits:
        """The pose shield's limits (hardware.command=cartesian_pose): shield.* speeds as steps per policy period,
        the leads, and the shield's workspace box less its margin."""
        shield = self.shield_config()
        shield.validate()
        margin = shield.workspace_margin
        period = 1.0 / self.policy_rate_hz
        return PoseLimits(
            workspace_min=tuple(float(v) + margin for v in shield.workspace_min),
            workspace_max=tuple(float(v) - margin for v in shield.workspace_max),
            max_step=shield.pose_max_speed * period,
            max_step_angle=shield.pose_max_angular_speed * period,
            max_lead=shield.pose_max_lead,
            max_lead_angle=shield.pose_max_lead_angle,
        )

    def shield_config(self) -> ShieldConfig:
        known = set(ShieldConfig.__dataclass_fields__)
        unknown = sorted(set(self.shield) - known)
        if unknown:
            raise ValueError(f"hardware.shield has unknown keys {unknown}; ShieldConfig has {sorted(known)}")
        values = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in dict(self.shield).items()}
        return ShieldConfig(control_period=1.0 / self.control_rate_hz, **values)
