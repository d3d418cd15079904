"""The robot env's link to the robot: its topics on the ROS 2 bridge, the control thread, the shield in the
command path, the e-stop (hardware/estop.py) and real-time scheduling (hardware/realtime.py).

A control thread at `control_rate_hz` passes the newest policy command (`post`, or None) through
`robotrl.safety.Shield.filter` with the newest joint state every period, then publishes the shield's setpoint
on `/<controller>/commands` (std_msgs/Float64MultiArray) and the gripper on `/<gripper_controller>/commands`
or, with `gripper_interface` franka_action or gripper_command, as action goals (hardware/gripper_actions.py):
after the arm's command, outside the lock, a changed gripper setpoint goes to the client's `send` and its `poll`
runs every period, neither blocking. While the shield is latched (an e-stop, a stop) the goal in flight is
cancelled and nothing new is sent until the shield restarts: a gripper must not keep closing through an e-stop.
The shield's corrections are counted per policy period (`take_info`) and over the link's life (`totals`); the
gripper client's goals, failures, deadlines and holds in `stats` (`gripper_<count>`) and per policy period in
`take_info` (`gripper/<count>`).
With `hardware.command=cartesian_pose` the arm takes equilibrium poses for an impedance controller instead
(`publish_pose`, geometry_msgs/PoseStamped on `pose_topic`, sent by the robot env at the policy rate after its pose
shield): no joint setpoint is published, and the joint shield runs as the arm's monitor, given the measured joints
as its command every period, which keeps its e-stop latch, its joint-state watchdog and its gripper checks on the
command path. While it is latched no pose goes out; when an e-stop latches it, the tool's measured pose is sent
once as the equilibrium (the controller holds the arm where it is).
The e-stop topic latches the shield's e-stop; the acknowledgement topic (or `acknowledge_estop`) lets the next
`restart_shield` restart it once every live publisher says released. The link also opens the topics observation
assembly reads (cameras, tracked objects) and the scene-reset request; it never decides what to observe. A camera
whose `hardware.camera_sources` entry is `opencv:...` is read on this machine (hardware/cameras.py) instead of a
topic, through the same `latest()`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from robotrl.hardware.cameras import OpenCVCamera
from robotrl.hardware.estop import EStopInput
from robotrl.hardware.gripper_actions import GripperActionClient
from robotrl.hardware.realtime import lock_memory, set_realtime_priority
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.robot_observation import JointReading, read_joint_state
from robotrl.hardware.ros2 import make_bridge
from robotrl.hardware.state_clock import StampClock

from robotrl.core.robot_spec import RobotSpec
from robotrl.safety import EStopLatchedError, Shield, ShieldResetError

log = logging.getLogger(__name__)

# The joint shield's corrections that concern its own setpoint, which command=cartesian_pose never publishes (it
# follows the measured arm as a monitor): not reported as corrections of the robot's motion
MONITOR_ONLY = frozenset(
    f"safety/{kind}"
    for kind in ("velocity", "acceleration", "jerk", "delta_clip", "workspace", "workspace_guard", "position_limit")
)

# the gripper action client's counts the link reports (stats: gripper_<count>; take_info: gripper/<count>)
GRIPPER_COUNTS = (
    "goals_sent",
    "succeeded",
    "failed",
    "rejected",
    "accept_timeouts",
    "result_timeouts",
    "holds",
    "recoveries",
    "cancels",
    "canceled",
)


class EStopMissingError(ShieldResetError):
    """reset() was refused: nothing publishes on the e-stop topic (`require_estop_publisher`)."""


class ResetTimeoutError(TimeoutError):
    """reset() did not reach the home pose within reset_timeout."""


class RobotLink:
    """See the module docstring. Joins `bridge` (or a bridge of its own, left at `close`), listens to the
    cameras in `cfg.cameras` and the objects in `objects`, and starts the control thread."""

    def __init__(
        self,
        cfg: RobotEnvConfig,
        spec: RobotSpec,
        shield: Shield,
        stats: Counter[str],
        objects: list[str] = (),
        bridge: Any | None = None,
        tool_pose: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
    ):
        """`tool_pose(q) -> (position, quaternion wxyz)`: forward kinematics for the e-stop's hold pose, needed with
        command=cartesian_pose; called on the control thread, so it must not share state with the policy thread's."""
        self.cfg, self.spec, self.shield, self.stats = cfg, spec, shield, stats
        self.pose_mode = cfg.command == "cartesian_pose"
        if self.pose_mode and tool_pose is None:
            raise ValueError("hardware.command=cartesian_pose needs the tool point's forward kinematics")
        self.tool_pose = tool_pose
        self._pose_held = False  # the e-stop's hold pose was sent for the current latch
        self._pose_pub = None
        self.n = len(spec.joints)
        # state shared with the control thread and the bridge's callbacks (an e-stop may arrive as soon as its
        # subscription exists), under lock
        self.lock = threading.Lock()
        self._state_clock = StampClock()  # joint states' measurement times from their header stamps
        self._parsed: tuple[Any, JointReading | None] = (None, None)  # (the message received, its parse)
        self.started = False  # the shield has been reset from a measured state (restart_shield)
        self._pending: torch.Tensor | None = None
        self._pending_gripper: float | None = None
        self._period_info: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()  # shield corrections (control periods) over the link's life
        # the watchdog, measured: the oldest state the shield still tracked on, and the state's age when
        # each stall (joint states stopped arriving) first made the shield hold or stop
        self.max_tracked_state_age = 0.0
        self.stall_reactions: list[float] = []
        self._stalled = False
        self.state_period: float | None = None  # measured joint-state interval (s), at the first reset
        self._last_setpoint: np.ndarray | None = None
        self._gripper_sent = (math.nan, -math.inf)  # (value, time) of the last gripper command published
        # the gripper's action client (control thread only): the setpoint last given to it, whether the shield's
        # latch stopped it, and its counts already reported
        self._gripper_given: float | None = None
        self._gripper_stopped = False
        self._gripper_reported: dict[str, int] = dict.fromkeys(GRIPPER_COUNTS, 0)
        # called on the control thread with each arm command message just published and the wall-clock time (ns)
        # it was sent: a recording of commands at their send time (robotrl-sysid), not when a subscriber got them
        self.on_command: Callable[[Any, int], None] | None = None
        self._closing = threading.Event()

        self._owns_bridge = bridge is None
        self.bridge = bridge or make_bridge(cfg.backend, domain_id=cfg.domain_id, loopback=cfg.loopback)
        self.images: dict[str, Any] = {}
        self.gripper_actions: GripperActionClient | None = None
        try:
            self._open_topics(list(objects))
        except BaseException:  # a failed construction must not keep the domain joined, nor a camera open
            self._close_cameras()
            self._close_gripper_actions()
            if self._owns_bridge:
                self.bridge.close()
            raise
        self.thread = threading.Thread(target=self._control_loop, name="robotrl-robot-env-control", daemon=True)
        self.thread.start()
        try:
            if cfg.lock_memory:
                lock_memory("hardware.lock_memory")
            set_realtime_priority("hardware.realtime_priority", cfg.realtime_priority, self.thread.native_id)
        except BaseException:
            self.close()
            raise

    # -- topics -------------------------------------------------------------------------------------
    def _open_topics(self, objects: list[str]) -> None:
        # lazy: the message types need cyclonedds (the ros extra)
        from robotrl.hardware.ros2.msgs import Bool, Float64MultiArray, Image, JointState, PoseStamped

        cfg = self.cfg
        self.topics = {"joint_states": cfg.joint_states_topic, "commands": f"/{cfg.controller}/commands"}
        self.joint_states = self.bridge.subscription(cfg.joint_states_topic, JointState, cfg.state_qos)
        if self.pose_mode:  # no joint command goes out: the arm's controller is the impedance controller
            del self.topics["commands"]
            self.topics["pose"] = cfg.pose_topic
            self._pose_pub = self.bridge.publisher(cfg.pose_topic, PoseStamped, cfg.command_qos)
        else:
            self._command_pub = self.bridge.publisher(self.topics["commands"], Float64MultiArray, cfg.command_qos)
        self.gripper_pub = None  # the gripper's topic (gripper_interface topic)
        if cfg.gripper_controller and self.spec.gripper is not None:
            if cfg.gripper_interface == "topic":
                self.topics["gripper"] = f"/{cfg.gripper_controller}/commands"
                self.gripper_pub = self.bridge.publisher(self.topics["gripper"], Float64MultiArray, cfg.command_qos)
            else:  # its action client (the action modules load cyclonedds, as the message types above do)
                self.gripper_actions = GripperActionClient(self.bridge, cfg.gripper_action_config(), self.spec.gripper)
        self.estop_input: EStopInput | None = None
        if cfg.estop_topic:
            self.topics["estop"] = cfg.estop_topic
            self.estop_input = EStopInput(self.bridge, cfg.estop_topic, self.estop)
        if cfg.estop_ack_topic:
            self.topics["estop_ack"] = cfg.estop_ack_topic
            self._estop_ack_sub = self.bridge.subscription(cfg.estop_ack_topic, Bool, "default", self._on_estop_ack)
        self._scene_reset_pub = None
        if cfg.scene_reset_topic:
            self.topics["scene_reset"] = cfg.scene_reset_topic
            self._scene_reset_pub = self.bridge.publisher(cfg.scene_reset_topic, Bool, "default")
        # camera -> its newest frame's source (`latest()`): a topic's subscription, or a USB camera read here
        self.images = {}
        for name in cfg.cameras:
            kind, source = cfg.camera_source(name)
            if kind == "opencv":
                self.images[name] = OpenCVCamera(name, source)
            else:
                self.images[name] = self.bridge.subscription(cfg.camera_topic.format(name=name), Image, "sensor_data")
        # best effort: matches a reliable publisher too (a tracker may publish either way)
        self.object_poses = {
            name: self.bridge.subscription(cfg.object_topic.format(name=name), PoseStamped, "sensor_data")
            for name in objects
        }
        self.topics.update({f"object/{name}": cfg.object_topic.format(name=name) for name in objects})

    def request_scene_reset(self) -> None:
        """Ask whatever puts objects back by itself (std_msgs/Bool true on scene_reset_topic, if one is set)."""
        if self._scene_reset_pub is not None:
            # lazy: the message types need cyclonedds (the ros extra)
            from robotrl.hardware.ros2.msgs import Bool

            self._scene_reset_pub.publish(Bool(data=True))

    def _on_estop_ack(self, msg) -> None:
        if msg.data:
            try:
                self.acknowledge_estop()
            except ShieldResetError as error:
                log.warning("e-stop acknowledgement on %s ignored: %s", self.cfg.estop_ack_topic, error)

    # -- joint states --------------------------------------------------------------------------------
    def state(self) -> JointReading | None:
        """The newest joint state, parsed once per message (joint names matched to the spec's); under `lock`."""
        received = self.joint_states.latest()
        if received is None:
            return None
        # The message itself, not its id(): a freed message's address is reused by a newer one
        last, parsed = self._parsed
        if last is received:
            return parsed
        try:
            parsed = read_joint_state(received.msg, received.received_at, self.spec, self._state_clock)
        except (KeyError, ValueError) as error:
            self.stats["bad_joint_state"] += 1
            log.warning("robot env: ignoring a joint state: %s", error)
            parsed = self._parsed[1]  # keep the last good one (it ages, so the shield holds)
        self._parsed = (received, parsed)
        return parsed

    def locked_state(self) -> JointReading | None:
        with self.lock:
            return self.state()

    def judged_state(self) -> tuple[JointReading | None, str | None]:
        """The newest joint state and why the shield refuses it (out of order, a glitch), if it does: the
        shield's own rule, so a state it refuses is not acted on by the policy either."""
        with self.lock:
            state = self.state()
            refused = (
                None if state is None or not self.started else self.shield.judge_state(state.position, state.stamp)
            )
        return state, refused

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
        gripper, latched = self._arm_step()
        if self.gripper_actions is not None:
            self._gripper_action_step(gripper, latched)

    def _arm_step(self) -> tuple[float | None, str | None]:
        """The shield's setpoint published (and the gripper's, on its topic); the gripper setpoint for an action
        client (None: none this period) and the shield's latch, read under the lock."""
        self.joint_states.poll()  # a state that has arrived counts as fresh even if the receive thread lags
        with self.lock:
            state = self.state()
            # read under the lock, after the state: a reset() in between (which holds the lock) must not be
            # newer than this period (the shield refuses time going back), nor may any state look younger than 0
            now = time.monotonic()
            if not self.started or state is None:
                return None, self.shield.latched
            command, self._pending = self._pending, None
            if self.pose_mode:  # the joint shield monitors the arm the impedance controller moves
                command = state.position
            gripper, self._pending_gripper = self._pending_gripper, None
            safe = self.shield.filter(
                command, state.position, state.stamp, now, gripper=gripper, joint_velocity=state.velocity
            )
            for key, value in safe.info.items():
                if value and not (self.pose_mode and key in MONITOR_ONLY):
                    self._period_info[key] += 1
                    self.totals[key] += 1
            age = now - state.stamp
            if safe.mode == "track":
                self.max_tracked_state_age = max(self.max_tracked_state_age, age)
                self._stalled = False
            elif not self._stalled and (safe.info.get("safety/stale_hold") or safe.info.get("safety/stale_stop")):
                self._stalled = True
                self.stall_reactions.append(age)
            latched = self.shield.latched
            setpoint = safe.target.numpy()
            if not np.isfinite(setpoint).all():  # the shield guarantees this; never publish otherwise
                self.stats["non_finite_setpoint"] += 1
                return None, latched
            self._last_setpoint = setpoint
            hold_pose = self.pose_mode and self.shield.latched == "estop" and not self._pose_held
            if hold_pose:
                self._pose_held = True
                position, quat = self.tool_pose(state.position.numpy())
                if np.isfinite(position).all() and np.isfinite(quat).all():  # else the controller keeps the last one
                    self._send_pose(position, quat)
        # lazy: the message types need cyclonedds (the ros extra); cached after the first period
        from robotrl.hardware.ros2.tensors import float64_multi_array

        if not self.pose_mode:
            message, sent = float64_multi_array(setpoint, self.n), time.time_ns()
            self._command_pub.publish(message)
            self.stats["commands"] += 1
            if self.on_command is not None:
                self.on_command(message, sent)
        if self.gripper_pub is not None and safe.gripper is not None:
            # a new gripper setpoint at once, an unchanged one at 10 Hz (a forward controller holds it)
            value = float(safe.gripper)
            if value != self._gripper_sent[0] or now - self._gripper_sent[1] >= 0.1:
                self._gripper_sent = (value, now)
                self.gripper_pub.publish(float64_multi_array([value], 1))
        if self.gripper_actions is None or safe.gripper is None:
            return None, latched
        return float(safe.gripper), latched

    def _gripper_action_step(self, setpoint: float | None, latched: str | None) -> None:
        """The gripper's action client, once per control period, outside the lock (neither call blocks): a changed
        setpoint sent, the goal in flight advanced; while the shield is latched, the goal cancelled (once per latch)
        and nothing sent. A failure is counted and logged once; the arm goes on under the shield."""
        client = self.gripper_actions
        try:
            if latched is not None:
                if not self._gripper_stopped:
                    self._gripper_stopped, self._gripper_given = True, None
                    client.cancel()
            elif setpoint is not None:
                self._gripper_stopped = False
                if setpoint != self._gripper_given:
                    client.send(setpoint)
                    self._gripper_given = setpoint
            client.poll()
            self._report_gripper(client.stats)
        except Exception:
            self.stats["gripper_errors"] += 1
            if self.stats["gripper_errors"] == 1:
                log.exception("robot env: the gripper's action client failed (counted in gripper_errors)")

    def _report_gripper(self, stats: dict[str, Any]) -> None:
        changed = {key: stats[key] - self._gripper_reported[key] for key in GRIPPER_COUNTS}
        changed = {key: n for key, n in changed.items() if n}
        if not changed:
            return
        for key, n in changed.items():
            self._gripper_reported[key] += n
            self.stats[f"gripper_{key}"] += n
        with self.lock:
            for key, n in changed.items():
                self._period_info[f"gripper/{key}"] += n

    @property
    def drives_gripper(self) -> bool:
        """Whether gripper setpoints reach a gripper (its topic or its action client)."""
        return self.gripper_pub is not None or self.gripper_actions is not None

    @property
    def gripper_stats(self) -> dict[str, Any] | None:
        """The gripper action client's counts, state and last error (None: no action client)."""
        return None if self.gripper_actions is None else self.gripper_actions.stats

    def post(self, target: np.ndarray | torch.Tensor, gripper: float | None = None) -> None:
        """The policy's next joint target (and gripper opening) for the control thread."""
        with self.lock:
            self._pending = torch.as_tensor(target, dtype=torch.float64)
            if gripper is not None:
                self._pending_gripper = gripper

    def post_gripper(self, gripper: float) -> None:
        """The policy's next gripper opening alone (command=cartesian_pose: the arm takes poses)."""
        with self.lock:
            self._pending_gripper = gripper

    def publish_pose(self, position: np.ndarray, quat: np.ndarray) -> bool:
        """Send an equilibrium pose the pose shield let through (position in metres, quaternion wxyz, base frame);
        False (nothing sent) while the shield is latched or not started."""
        with self.lock:
            if not self.started or self.shield.latched is not None:
                self.stats["poses_withheld"] += 1
                return False
            self._send_pose(position, quat)
            return True

    def _send_pose(self, position: np.ndarray, quat: np.ndarray) -> None:
        from robotrl.hardware.ros2.msgs import Header, Point, Pose, PoseStamped, Quaternion, Time

        stamp = time.time_ns()
        w, x, y, z = (float(v) for v in quat)
        message = PoseStamped(
            header=Header(stamp=Time(sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id=self.cfg.pose_frame),
            pose=Pose(position=Point(*(float(v) for v in position)), orientation=Quaternion(x=x, y=y, z=z, w=w)),
        )
        self._pose_pub.publish(message)
        self.stats["poses"] += 1

    def take_info(self) -> dict[str, int]:
        """The shield's corrections since the last call: control periods in which each kind fired; and the gripper
        action client's new counts (`gripper/<count>`)."""
        with self.lock:
            info, self._period_info = dict(self._period_info), Counter()
        return info

    @property
    def latched(self) -> str | None:
        with self.lock:
            return self.shield.latched

    @property
    def at_rest(self) -> bool:
        """The shield's setpoint has stopped, read between control periods: once True, `setpoint` is the
        resting one (the shield's own flag, read unlocked, can change mid-period, before that period's
        setpoint is published)."""
        with self.lock:
            return self.shield.at_rest

    @property
    def setpoint(self) -> np.ndarray | None:
        """The last setpoint published."""
        with self.lock:
            return None if self._last_setpoint is None else self._last_setpoint.copy()

    # -- the e-stop and the shield's restart ----------------------------------------------------------
    def estop(self, active: bool = True) -> None:
        with self.lock:
            self.shield.estop(active)

    def acknowledge_estop(self) -> None:
        """After the e-stop is released, the next restart may go ahead (raises while the e-stop, by any live
        publisher on its topic, is still pressed or not known to be released)."""
        why = None if self.estop_input is None else self.estop_input.not_known_released()
        with self.lock:
            if why is not None:
                self.shield.estop(True)
                raise EStopLatchedError(f"acknowledgement refused: {why}", pressed=True)
            if self.estop_input is not None:
                # every live publisher said released: the shield hears it from the votes, not only from the
                # release's callback, which runs after the vote is counted (an acknowledgement in between was
                # refused as still pressed); a press counted after this still latches through its callback
                self.shield.estop(False)
            self.shield.acknowledge_estop()

    def check_estop_publisher(self) -> None:
        """Latch the e-stop if its required publisher is gone: nothing could stop the arm now."""
        estop = self.estop_input
        if estop is not None and self.cfg.require_estop_publisher and not estop.has_publisher():
            self.stats["estop_publisher_lost"] += 1
            self.estop(True)

    def require_estop_publisher(self, deadline: float) -> None:
        """Wait until something publishes on the e-stop topic (discovery takes a moment) and every publisher
        there has said it is released; refuse without (the e-stop latches as pressed until then)."""
        if self.estop_input is None or not self.cfg.require_estop_publisher:
            return
        while True:
            present = self.estop_input.has_publisher()
            why = self.estop_input.not_known_released() if present else None  # read once: the answer may change
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

    def check_state_rate(self, window: float = 0.2) -> None:
        """Measure the joint-state interval and refuse a hold_after the stream cannot keep: with states
        further apart than the watchdog's limit the shield would hold between every two of them."""
        self.joint_states.take()
        time.sleep(window)
        arrivals = [received.received_at for received in self.joint_states.take()]
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

    def restart_shield(self, deadline: float) -> None:
        """Start the shield from the measured state; after a latch, let its brake finish and restart it."""
        while True:
            pressed = self.estop_input is not None and self.estop_input.pressed  # any live publisher's word
            with self.lock:
                if pressed:
                    self.shield.estop(True)
                state = self.state()
                now = time.monotonic()
                if not self.started or self.shield.latched or self.shield.at_rest:
                    try:
                        self.shield.reset(state.position, state.stamp, now)
                        self.started = True
                        self._pose_held = False
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

    # -- closing --------------------------------------------------------------------------------------
    def _wait_at_rest(self, timeout: float) -> bool:
        """Whether the setpoint came to rest within `timeout` (True at once if there is nothing to wait for)."""
        deadline = time.monotonic() + timeout
        while self.started and self.thread.is_alive():
            if self.at_rest:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def _close_gripper_actions(self) -> None:
        """Cancel a gripper goal still in flight and leave the action servers (before the bridge closes)."""
        if self.gripper_actions is not None:
            self.gripper_actions.close()

    def _close_cameras(self) -> None:
        """Stop the USB cameras' reading threads (a topic's frames end with the bridge)."""
        for camera in self.images.values():
            if isinstance(camera, OpenCVCamera):
                camera.close()

    def close(self) -> None:
        """Send no new targets; once the setpoint rests the control thread stops and the bridge is left. A move
        still under way after `close_timeout` is braked (the shield's e-stop) before the thread stops: a forward
        controller left holding a moving setpoint would stop the arm dead."""
        if self._closing.is_set():
            return
        with self.lock:
            self._pending = None
        if not self._wait_at_rest(self.cfg.close_timeout):
            self.estop(True)
            log.warning(
                "robot env close: still moving after %.1f s; braking before the control thread stops",
                self.cfg.close_timeout,
            )
            if not self._wait_at_rest(2 * self.shield.limits.brake_time + 0.1):
                log.error("robot env close: the setpoint did not come to rest; stopping the control thread")
        self._closing.set()
        self.thread.join(timeout=2.0)
        self._close_gripper_actions()
        self._close_cameras()
        if self._owns_bridge and self.bridge is not None:
            self.bridge.close()
        self.bridge = None
