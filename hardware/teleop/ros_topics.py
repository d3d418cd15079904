"""Teleop from ROS 2 topics, through the bridge (Cyclone DDS or rclpy): a joystick as `joy_node` publishes it
(sensor_msgs/Joy, `JoyTeleop`), and a SpaceMouse as `spacenav_node` publishes it (geometry_msgs/Twist, or
TwistStamped, with its buttons as sensor_msgs/Joy; `TwistTeleop`). The pad or the SpaceMouse may then sit at
another machine of the lab's ROS graph, where the local devices (gamepad, spacemouse) need it plugged in here.

A command is only as fresh as its message: a message older than `max_age_s` gives an idle command (no takeover,
no motion: a joystick node that stopped must not keep the robot moving), and `disconnect_s` of silence after the
first message marks the device disconnected (`hil.on_disconnect` applies). joy_node repeats a held state at 20 Hz
(`autorepeat_rate`), spacenav_node publishes while the cap is pushed and zeros on release.

Button presses are seen as their messages arrive, not only at a poll: a subscription keeps the last few messages
(sensor_data: 5, a quarter of a second of joy_node), and a control loop may not poll for seconds (a robot's reset
driving the arm home), so a B pressed and released meanwhile would otherwise never have been pressed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import torch
from robotrl.hardware.teleop.gamepad import GamepadBindings, GamepadState, PygameLayout, gamepad_command, pygame_inputs

from robotrl.hil.teleop import (
    GRIPPER_CLOSED,
    GRIPPER_OPEN,
    AxisMap,
    TeleopCommand,
    TeleopDevice,
    apply_deadzone,
    check_deadzone,
)

log = logging.getLogger(__name__)

BUTTON_CHANGES_KEPT = 64  # a person's presses between two polls, not a message rate, fill this


class _ButtonChanges:
    """A subscription callback that keeps, in arrival order, each message whose held buttons differ from the
    message before it, read with `read(received) -> (value, held buttons)` (None: a message to ignore). `take()`
    hands them to the poll: every press and release since the last one, however many messages came between."""

    def __init__(self, read: Callable[[Any], tuple[Any, frozenset] | None]):
        self.read = read
        self._lock = threading.Lock()
        self._changes: deque[tuple[Any, frozenset]] = deque(maxlen=BUTTON_CHANGES_KEPT)
        self._held: frozenset | None = None

    def __call__(self, received: Any) -> None:
        read = self.read(received)
        if read is None:
            return
        with self._lock:
            if read[1] != self._held:
                self._held = read[1]
                self._changes.append(read)

    def take(self) -> list[tuple[Any, frozenset]]:
        with self._lock:
            changes = list(self._changes)
            self._changes.clear()
        return changes


class _TopicDevice(TeleopDevice):
    """The bridge, the freshness rules and the connection state shared by the two devices."""

    def __init__(self, domain_id: int, backend: str, loopback: bool, max_age_s: float, disconnect_s: float):
        for label, value in (("max_age_s", max_age_s), ("disconnect_s", disconnect_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{self.name} teleop {label} must be a finite number > 0, got {value!r}")
        if disconnect_s < max_age_s:
            raise ValueError(f"{self.name} teleop disconnect_s ({disconnect_s}) must be >= max_age_s ({max_age_s})")
        from robotrl.hardware.ros2.bridge import make_bridge

        self.max_age_s, self.disconnect_s = float(max_age_s), float(disconnect_s)
        self.bridge = make_bridge(backend, domain_id=domain_id, loopback=loopback)
        self._connected = True

    def _fresh(self, received: Any | None, gripper: float, resting: bool = False) -> TeleopCommand | None:
        """None where `received` is fresh enough to act on; else the idle command, disconnected after disconnect_s
        of silence unless the device went quiet `resting` (a node that publishes only while moved). A fresh message
        connects it again: a node restarted mid-session gives the operator the robot back."""
        if self.bridge is None:  # closed
            return TeleopCommand.idle(gripper, connected=False)
        if received is None:
            return TeleopCommand.idle(gripper)
        age = received.age()
        if age <= self.max_age_s:
            self._connected = True
            return None
        if age > self.disconnect_s and not resting:
            self._connected = False
        return TeleopCommand.idle(gripper, connected=self._connected)

    def close(self) -> None:
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None
        self._connected = False


class JoyTeleop(_TopicDevice):
    """A pad through joy_node (sensor_msgs/Joy on `topic`), mapped as the local gamepad device maps one
    (hardware/teleop/gamepad.py: sticks move, A toggles the gripper, B a takeover, Start/Y/Back are events).
    joy_node reads the pad through SDL and publishes each axis negated (sticks left and up positive, triggers 1
    released to -1 pressed), buttons in SDL's order: `layout` is the local device's SDL layout."""

    name = "joy"

    def __init__(
        self,
        topic: str = "/joy",
        domain_id: int = 0,
        backend: str = "dds",
        loopback: bool = True,
        deadzone: float = 0.1,
        bindings: GamepadBindings | Mapping | None = None,
        axis_map: AxisMap | None = None,
        layout: PygameLayout | None = None,
        max_age_s: float = 0.5,
        disconnect_s: float = 2.0,
    ):
        self.deadzone = check_deadzone(deadzone)
        self.bindings = GamepadBindings(**bindings) if isinstance(bindings, Mapping) else bindings or GamepadBindings()
        self.axis_map, self.layout = axis_map or AxisMap(), layout or PygameLayout()
        super().__init__(domain_id, backend, loopback, max_age_s, disconnect_s)
        from robotrl.hardware.ros2.bridge import OnReceived
        from robotrl.hardware.ros2.msgs import Joy

        self.topic = topic
        self._state = GamepadState()
        self._refused: Any = None  # the last message ignored (logged once)
        self._changes = _ButtonChanges(self._read)
        self.subscription = self.bridge.subscription(topic, Joy, "sensor_data", OnReceived(self._changes))

    def poll(self) -> TeleopCommand:
        if self.bridge is None:
            return TeleopCommand.idle(self._state.gripper, connected=False)
        # every change of the buttons since the last poll, so that a press and release between two polls counts
        events: set[str] = set()
        for read in self._changes.take():
            command, self._state = gamepad_command(*read, self._state, self.deadzone, self.bindings, self.axis_map)
            events |= command.events
        latest = self.subscription.latest()
        stale = self._fresh(latest, self._state.gripper)
        read = self._read(latest) if stale is None else None
        if read is None:  # stale, or a message that cannot move the robot
            return TeleopCommand.idle(self._state.gripper, stale is None or stale.connected, frozenset(events))
        command, self._state = gamepad_command(*read, self._state, self.deadzone, self.bindings, self.axis_map)
        return dataclasses.replace(command, events=frozenset(events | command.events))

    def _read(self, received: Any) -> tuple[Any, frozenset[str]] | None:
        """The pad's axes and held buttons in a message, or None (logged once) for one with a non-finite axis or too
        few axes: a driver's NaN or another device's message never moves the robot."""
        sdl_axes = [-float(value) for value in received.msg.axes]
        if len(sdl_axes) >= self.layout.axis_count and all(math.isfinite(value) for value in sdl_axes):
            return pygame_inputs(sdl_axes, list(received.msg.buttons), self.layout)
        if received is not self._refused:
            self._refused = received
            log.warning("joy teleop: ignored a Joy message on %s with axes %s", self.topic, list(received.msg.axes))
        return None


class TwistTeleop(_TopicDevice):
    """A SpaceMouse through spacenav_node: geometry_msgs/Twist (or TwistStamped, `stamped`) on `topic`, linear and
    angular in [-1, 1] (spacenav_node's default scales), and its buttons as sensor_msgs/Joy on `buttons_topic`:
    `gripper_button` toggles the gripper and `takeover_button` a persistent takeover, as the local spacemouse
    device does. `buttons_topic` "": no buttons (the gripper stays open)."""

    name = "twist"

    def __init__(
        self,
        topic: str = "/spacenav/twist",
        buttons_topic: str = "/spacenav/joy",
        stamped: bool = False,
        domain_id: int = 0,
        backend: str = "dds",
        loopback: bool = True,
        deadzone: float = 0.05,
        gripper_button: int | None = 0,
        takeover_button: int | None = 1,
        axis_map: AxisMap | None = None,
        max_age_s: float = 0.5,
        disconnect_s: float = 2.0,
    ):
        self.deadzone = check_deadzone(deadzone)
        self.axis_map = axis_map or AxisMap()
        self.gripper_button, self.takeover_button = gripper_button, takeover_button
        super().__init__(domain_id, backend, loopback, max_age_s, disconnect_s)
        from robotrl.hardware.ros2.bridge import OnReceived
        from robotrl.hardware.ros2.msgs import Joy, Twist, TwistStamped

        self.stamped = stamped
        self.subscription = self.bridge.subscription(topic, TwistStamped if stamped else Twist, "sensor_data")
        self._changes = _ButtonChanges(_held_buttons)
        self.buttons = None
        if buttons_topic:
            self.buttons = self.bridge.subscription(buttons_topic, Joy, "sensor_data", OnReceived(self._changes))
        self._gripper, self._takeover, self._held = GRIPPER_OPEN, False, frozenset()

    def poll(self) -> TeleopCommand:
        received = self.subscription.latest() if self.bridge is not None else None
        events = self._press_buttons() if self.bridge is not None else frozenset()
        stale = self._fresh(
            received, self._gripper, resting=received is not None and _at_rest(received.msg, self.stamped)
        )
        if stale is not None:
            engaged = self._takeover and stale.connected
            return TeleopCommand(engaged, stale.twist, self._gripper, stale.connected, events)
        raw = torch.tensor(_twist_values(received.msg, self.stamped), dtype=torch.float32)
        raw = torch.where(torch.isfinite(raw), raw, torch.zeros(()))  # a NaN from a driver never moves the robot
        twist = self.axis_map.apply(apply_deadzone(raw.clamp(-1.0, 1.0), self.deadzone)).clamp(-1.0, 1.0)
        engaged = self._takeover or bool(twist.abs().max() > 0)
        return TeleopCommand(engaged, twist, self._gripper, True, events)

    def _press_buttons(self) -> frozenset[str]:
        """Toggle the gripper and the takeover on presses since the last poll; the events that raised."""
        if self.buttons is None:
            return frozenset()
        events = set()
        for _, held in self._changes.take():
            pressed = held - self._held
            self._held = held
            if self.gripper_button in pressed:
                self._gripper = GRIPPER_CLOSED if self._gripper == GRIPPER_OPEN else GRIPPER_OPEN
            if self.takeover_button in pressed:
                self._takeover = not self._takeover
                events.add("toggle_takeover")
        return frozenset(events)


def _held_buttons(received: Any) -> tuple[None, frozenset[int]]:
    """The indices of the buttons a Joy message holds."""
    return None, frozenset(i for i, value in enumerate(received.msg.buttons) if value)


def _twist_values(msg: Any, stamped: bool) -> list[float]:
    """linear x, y, z and angular x, y, z of a Twist (or, `stamped`, a TwistStamped)."""
    twist = msg.twist if stamped else msg
    return [twist.linear.x, twist.linear.y, twist.linear.z, twist.angular.x, twist.angular.y, twist.angular.z]


def _at_rest(msg: Any, stamped: bool) -> bool:
    """Whether a twist message is spacenav_node's all-zero one at release (silence after it is rest, not loss)."""
    return all(value == 0.0 for value in _twist_values(msg, stamped))
