"""3Dconnexion SpaceMouse teleop through hidapi (raw HID: no 3Dconnexion driver, no spacenavd).

HID input reports (byte 0 is the report id; axes are int16 little endian, about +-350 at full deflection):

    id 1, 6 bytes    translation x, y, z                          (SpaceNavigator, SpaceMouse Pro, Compact)
    id 1, 12 bytes   translation x, y, z, then rotation x, y, z   (SpaceMouse Wireless, Pro Wireless, Enterprise)
    id 2, 6 bytes    rotation x, y, z                             (the older devices, right after each id 1)
    id 3, n bytes    button bitmask, little endian: bit 0 the left (menu) button, bit 1 the right (fit) button
    other ids        battery level and the like: ignored

The device frame is x right, y toward the operator, z down (pushing the cap down is +z), with rotations about
those axes by the right-hand rule. `AxisMap` presets take it to the robot base frame: "facing" (the default:
the operator faces the robot, as in HIL-SERL, so pulling the cap toward you moves the tool toward you) and
"behind" (the operator looks the way the robot base does); "device" keeps the device frame.

A reader thread drains the device continuously: the kernel's hidraw queue drops *new* reports once full, and
the SpaceMouse only reports changes, so a loop that stalled could otherwise miss the cap's return to rest and
keep moving the robot. A read error (unplugged, permission lost) marks the device disconnected.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from robotrl.hil.teleop import (
    GRIPPER_CLOSED,
    GRIPPER_OPEN,
    AxisMap,
    TeleopCommand,
    TeleopDevice,
    TeleopUnavailableError,
    apply_deadzone,
    check_button_events,
    check_deadzone,
    require_library,
)

log = logging.getLogger(__name__)

LOGITECH_VENDOR_ID, CONNEXION_VENDOR_ID = 0x046D, 0x256F  # older devices carry Logitech's vendor id
VENDOR_IDS = (LOGITECH_VENDOR_ID, CONNEXION_VENDOR_ID)
PRODUCTS = {
    (0x046D, 0xC626): "SpaceNavigator",
    (0x046D, 0xC627): "SpaceExplorer",
    (0x046D, 0xC628): "SpaceNavigator for Notebooks",
    (0x046D, 0xC629): "SpacePilot Pro",
    (0x046D, 0xC62B): "SpaceMouse Pro",
    (0x256F, 0xC62E): "SpaceMouse Wireless (cable)",
    (0x256F, 0xC62F): "SpaceMouse Wireless (receiver)",
    (0x256F, 0xC631): "SpaceMouse Pro Wireless (cable)",
    (0x256F, 0xC632): "SpaceMouse Pro Wireless (receiver)",
    (0x256F, 0xC633): "SpaceMouse Enterprise",
    (0x256F, 0xC635): "SpaceMouse Compact",
    (0x256F, 0xC652): "3Dconnexion Universal Receiver",
}
MULTI_AXIS_USAGE = (0x01, 0x08)  # HID usage page Generic Desktop, usage Multi-axis Controller

TRANSLATION_REPORT, ROTATION_REPORT, BUTTON_REPORT = 1, 2, 3
AXIS_SCALE = 350.0
REPORT_SIZE = 64
AXIS_MAPS = {
    "facing": AxisMap(order=(1, 0, 2, 4, 3, 5), signs=(1, 1, -1, 1, 1, -1)),
    "behind": AxisMap(order=(1, 0, 2, 4, 3, 5), signs=(-1, -1, -1, -1, -1, -1)),
    "device": AxisMap(),
}
UDEV_HINT = (
    'a udev rule such as KERNEL=="hidraw*", ATTRS{idVendor}=="256f", MODE="0660", GROUP="plugdev" '
    "(and 046d for older models) gives your user access"
)


@dataclass(frozen=True)
class SpaceMouseState:
    """Raw device state as last reported: axis counts in the device frame and the button bitmask."""

    translation: tuple[int, int, int] = (0, 0, 0)
    rotation: tuple[int, int, int] = (0, 0, 0)
    buttons: int = 0


def parse_report(data: bytes, state: SpaceMouseState) -> SpaceMouseState:
    """The state after one HID input report (report id first). Reports of other ids leave it unchanged."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"parse_report takes the report's bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise ValueError("parse_report got an empty report (no report id)")
    report_id, payload = data[0], data[1:]
    if report_id == TRANSLATION_REPORT:
        if len(payload) >= 12:
            values = struct.unpack_from("<6h", payload)
            return replace(state, translation=values[:3], rotation=values[3:])
        if len(payload) >= 6:
            return replace(state, translation=struct.unpack_from("<3h", payload))
        raise ValueError(f"translation report (id 1) needs 6 or 12 data bytes, got {len(payload)}: {data.hex(' ')}")
    if report_id == ROTATION_REPORT:
        if len(payload) >= 6:
            return replace(state, rotation=struct.unpack_from("<3h", payload))
        raise ValueError(f"rotation report (id 2) needs 6 data bytes, got {len(payload)}: {data.hex(' ')}")
    if report_id == BUTTON_REPORT:
        if payload:
            return replace(state, buttons=int.from_bytes(payload, "little"))
        raise ValueError("button report (id 3) has no data bytes")
    return state


def spacemouse_twist(
    state: SpaceMouseState,
    axis_scale: float = AXIS_SCALE,
    deadzone: float = 0.0,
    axis_map: AxisMap = AXIS_MAPS["facing"],
) -> torch.Tensor:
    """[6] float32 twist in [-1, 1] in the robot base frame: counts / axis_scale, mapped, deadzone applied."""
    counts = torch.tensor(state.translation + state.rotation, dtype=torch.float32)
    return apply_deadzone(axis_map.apply((counts / axis_scale).clamp(-1.0, 1.0)), deadzone)


def resolve_axis_map(axis_map: AxisMap | str) -> AxisMap:
    if isinstance(axis_map, AxisMap):
        return axis_map
    if isinstance(axis_map, str) and axis_map in AXIS_MAPS:
        return AXIS_MAPS[axis_map]
    raise ValueError(f"unknown SpaceMouse axis_map {axis_map!r}; use an AxisMap or one of {', '.join(AXIS_MAPS)}")


def find_spacemouse(hid) -> dict:
    """hidapi's description of the first SpaceMouse: known models first, then any 3Dconnexion multi-axis
    controller (a new model). Among a device's interfaces, the multi-axis controller one."""
    candidates = []
    for info in hid.enumerate():
        key = (info.get("vendor_id"), info.get("product_id"))
        known = key in PRODUCTS
        multi_axis = (info.get("usage_page"), info.get("usage")) == MULTI_AXIS_USAGE
        if known or (key[0] == CONNEXION_VENDOR_ID and multi_axis):
            candidates.append((not known, not multi_axis, info))
    if not candidates:
        raise TeleopUnavailableError(
            "no SpaceMouse found: hidapi lists no HID device with a 3Dconnexion vendor id (0x046d known models, "
            f"0x256f); check the cable or receiver, then `ls -l /dev/hidraw*` for permissions: {UDEV_HINT}"
        )
    candidates.sort(key=lambda candidate: candidate[:2])
    return candidates[0][2]


class SpaceMouseTeleop(TeleopDevice):
    """A SpaceMouse as a teleop device. The left button toggles the gripper, the right one toggles a
    persistent takeover (button bit indices `gripper_button`, `takeover_button`; None disables one);
    `button_events` binds further buttons (the Pro's numbered keys, say) to events, e.g. {12: "success"}.

    `device`: an already opened hidapi-like object (`read(max_length, timeout_ms) -> list[int] | bytes`,
    blocking at most timeout_ms, raising OSError once the device is gone; `close()`) to use instead of the
    first SpaceMouse found; the teleop closes it."""

    name = "spacemouse"

    def __init__(
        self,
        device=None,
        axis_scale: float = AXIS_SCALE,
        deadzone: float = 0.05,
        axis_map: AxisMap | str = "facing",
        gripper_button: int | None = 0,
        takeover_button: int | None = 1,
        button_events: Mapping[int, str] | None = None,
        read_timeout_ms: int = 20,
    ):
        if isinstance(axis_scale, bool) or not isinstance(axis_scale, (int, float)) or not axis_scale > 0:
            raise ValueError(f"SpaceMouse axis_scale must be a positive number of counts, got {axis_scale!r}")
        if isinstance(read_timeout_ms, bool) or not isinstance(read_timeout_ms, int) or read_timeout_ms < 1:
            raise ValueError(f"SpaceMouse read_timeout_ms must be an int >= 1, got {read_timeout_ms!r}")
        for label, bit in (("gripper_button", gripper_button), ("takeover_button", takeover_button)):
            if bit is not None and (isinstance(bit, bool) or not isinstance(bit, int) or bit < 0):
                raise ValueError(f"SpaceMouse {label} must be a button bit index >= 0 or None, got {bit!r}")
        self.button_events = check_button_events(button_events or {})
        used = [b for b in (gripper_button, takeover_button, *self.button_events) if b is not None]
        if len(set(used)) != len(used):
            raise ValueError(
                f"SpaceMouse buttons bound twice: gripper {gripper_button}, takeover {takeover_button}, "
                f"events {sorted(self.button_events)}"
            )
        self.axis_scale, self.deadzone = float(axis_scale), check_deadzone(deadzone)
        self.axis_map = resolve_axis_map(axis_map)
        self.gripper_button, self.takeover_button = gripper_button, takeover_button
        self.read_timeout_ms = read_timeout_ms
        self.product = "injected device"
        if device is None:
            device = self._open_first()

        self._device = device
        self._lock = threading.Lock()
        self._state = SpaceMouseState()
        self._connected = True
        self._gripper, self._takeover = GRIPPER_OPEN, False
        self._events: set[str] = set()
        self._pressed_since_poll = False
        self.malformed_reports = 0
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="spacemouse-reader", daemon=True)
        self._reader.start()

    def _open_first(self):
        hid = require_library("hid", "SpaceMouse")
        info = find_spacemouse(hid)
        key = (info["vendor_id"], info["product_id"])
        self.product = PRODUCTS.get(key, f"3Dconnexion device {key[0]:04x}:{key[1]:04x}")
        device = hid.device()
        try:
            device.open_path(info["path"])
        except OSError as error:
            raise TeleopUnavailableError(f"cannot open the {self.product} ({error}); {UDEV_HINT}") from error
        return device

    def _read_loop(self) -> None:
        try:
            while not self._stop.is_set():
                data = self._device.read(REPORT_SIZE, self.read_timeout_ms)
                if data:
                    self._consume(bytes(data))
        except Exception as error:  # any failure of the reader must read as a lost device, never as stale motion
            log.warning("SpaceMouse read failed (%s: %s); marking it disconnected", type(error).__name__, error)
            with self._lock:
                self._connected = False

    def _consume(self, report: bytes) -> None:
        with self._lock:
            try:
                new = parse_report(report, self._state)
            except ValueError as error:
                self.malformed_reports += 1
                log.debug("malformed SpaceMouse report: %s", error)
                if report[:1] in (bytes([TRANSLATION_REPORT]), bytes([ROTATION_REPORT])):
                    # the device reports only changes: the lost report may have been the return to rest, so
                    # the cap reads as at rest (never as the last deflection) until its next motion report
                    self._state = replace(self._state, translation=(0, 0, 0), rotation=(0, 0, 0))
                return
            pressed = new.buttons & ~self._state.buttons
            self._state = new
            if self._is_set(pressed, self.gripper_button) or self._is_set(pressed, self.takeover_button):
                self._pressed_since_poll = True  # a tap between two polls still counts as the operator acting
            if self._is_set(pressed, self.gripper_button):
                self._gripper = GRIPPER_CLOSED if self._gripper == GRIPPER_OPEN else GRIPPER_OPEN
            if self._is_set(pressed, self.takeover_button):
                self._takeover = not self._takeover
                self._events.add("toggle_takeover")
            for bit, event in self.button_events.items():
                if self._is_set(pressed, bit):
                    self._events.add(event)

    @staticmethod
    def _is_set(bits: int, index: int | None) -> bool:
        return index is not None and bool(bits >> index & 1)

    def poll(self) -> TeleopCommand:
        with self._lock:
            state, connected = self._state, self._connected
            gripper, takeover = self._gripper, self._takeover
            events, self._events = frozenset(self._events), set()
            pressed, self._pressed_since_poll = self._pressed_since_poll, False
        if not connected:
            return TeleopCommand.idle(gripper, connected=False, events=events)
        twist = spacemouse_twist(state, self.axis_scale, self.deadzone, self.axis_map)
        held = self._is_set(state.buttons, self.gripper_button) or self._is_set(state.buttons, self.takeover_button)
        engaged = takeover or held or pressed or bool(twist.abs().max() > 0)
        return TeleopCommand(engaged, twist, gripper, connected=True, events=events)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._reader.join(timeout=1.0 + self.read_timeout_ms / 1000)
        if self._reader.is_alive():  # closing under a blocked read would crash inside hidapi
            log.warning("SpaceMouse reader did not stop; leaving the device open")
        else:
            with contextlib.suppress(Exception):
                self._device.close()
        with self._lock:
            self._connected = False
