"""Gamepad teleop (Xbox-style pads) through pygame's SDL joystick API (`backend="pygame"`, no window: SDL's
dummy video driver) or Linux evdev (`backend="evdev"`, reads /dev/input/event* directly).

Default mapping, in the robot base frame (change it with `axis_map` and `bindings`):

    left stick          up +x, left +y              right stick   up +angular y, left +angular z
    right / left trigger  +z / -z                   RB / LB       +angular x / -angular x
    A  toggle the gripper (starts open)             B             toggle a persistent takeover
    Start  "success"     Y  "failure"               Back          "reset"

The mapping from stick, trigger and button values to a command is a pure function (`gamepad_command`), and
so are the backends' conversions of raw values (`pygame_inputs`, `normalize_axis`): all testable without a
pad. A pad that is unplugged marks the device disconnected.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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

BUTTONS = ("a", "b", "x", "y", "lb", "rb", "back", "start", "guide", "left_stick", "right_stick")
BACKENDS = ("pygame", "evdev")


@dataclass(frozen=True)
class GamepadAxes:
    """Normalized pad axes: sticks in [-1, 1] with right and down positive (the SDL and evdev convention),
    triggers in [0, 1] with 0 released."""

    left_x: float = 0.0
    left_y: float = 0.0
    right_x: float = 0.0
    right_y: float = 0.0
    left_trigger: float = 0.0
    right_trigger: float = 0.0


@dataclass(frozen=True)
class GamepadState:
    """What persists between polls: the toggles, and the buttons held at the last poll (to find presses)."""

    gripper: float = GRIPPER_OPEN
    takeover: bool = False
    held: frozenset[str] = frozenset()


@dataclass(frozen=True)
class GamepadBindings:
    gripper: str | None = "a"
    takeover: str | None = "b"
    events: Mapping[str, str] = field(default_factory=lambda: {"start": "success", "y": "failure", "back": "reset"})

    def __post_init__(self):
        for label, button in (("gripper", self.gripper), ("takeover", self.takeover)):
            if button is not None and button not in BUTTONS:
                raise ValueError(f"gamepad {label} button {button!r} is not one of {', '.join(BUTTONS)}")
        events = check_button_events(self.events, BUTTONS)
        used = [b for b in (self.gripper, self.takeover, *events) if b is not None]
        if len(set(used)) != len(used):
            raise ValueError(
                f"gamepad buttons bound twice: gripper {self.gripper!r}, takeover {self.takeover!r}, "
                f"events {sorted(events)}"
            )
        object.__setattr__(self, "events", events)


def gamepad_command(
    axes: GamepadAxes,
    held: frozenset[str],
    state: GamepadState,
    deadzone: float = 0.1,
    bindings: GamepadBindings | None = None,
    axis_map: AxisMap | None = None,
) -> tuple[TeleopCommand, GamepadState]:
    """The command for one poll, and the state to pass to the next. `held`: names from BUTTONS."""
    bindings = bindings or GamepadBindings()
    held = frozenset(held)
    unknown = held - set(BUTTONS)
    if unknown:
        raise ValueError(f"unknown gamepad buttons {sorted(unknown)}; buttons: {', '.join(BUTTONS)}")
    analog = torch.tensor(
        [axes.left_x, axes.left_y, axes.right_x, axes.right_y, axes.left_trigger, axes.right_trigger],
        dtype=torch.float32,
    )
    if not bool(torch.isfinite(analog).all()):
        raise ValueError(f"gamepad axes are not finite: {axes}")
    left_x, left_y, right_x, right_y, left_trigger, right_trigger = apply_deadzone(analog.clamp(-1, 1), deadzone)
    roll = float("rb" in held) - float("lb" in held)
    twist = torch.stack([-left_y, -left_x, right_trigger - left_trigger, torch.tensor(roll), -right_y, -right_x])
    twist = (axis_map or AxisMap()).apply(twist).clamp(-1.0, 1.0)

    pressed = held - state.held
    gripper, takeover = state.gripper, state.takeover
    events = {event for button, event in bindings.events.items() if button in pressed}
    if bindings.gripper in pressed:
        gripper = GRIPPER_CLOSED if gripper == GRIPPER_OPEN else GRIPPER_OPEN
    if bindings.takeover in pressed:
        takeover = not takeover
        events.add("toggle_takeover")
    engaged = takeover or bool(twist.abs().max() > 0) or bool({bindings.gripper, bindings.takeover} & held)
    command = TeleopCommand(engaged, twist, gripper, connected=True, events=frozenset(events))
    return command, GamepadState(gripper, takeover, held)


@dataclass(frozen=True)
class PygameLayout:
    """SDL joystick axis and button indices of an Xbox-style pad. The default is Linux's xpad driver (and
    most pads SDL reports the same way); on Windows (XInput) the axes are 0 LX, 1 LY, 2 RX, 3 RY, 4 LT, 5 RT."""

    left_x: int = 0
    left_y: int = 1
    left_trigger: int = 2
    right_x: int = 3
    right_y: int = 4
    right_trigger: int = 5
    buttons: Mapping[str, int] = field(
        default_factory=lambda: {
            "a": 0, "b": 1, "x": 2, "y": 3, "lb": 4, "rb": 5, "back": 6, "start": 7, "guide": 8,
            "left_stick": 9, "right_stick": 10,
        }
    )  # fmt: skip

    def __post_init__(self):
        unknown = set(self.buttons) - set(BUTTONS)
        if unknown:
            raise ValueError(f"PygameLayout names unknown buttons {sorted(unknown)}; buttons: {', '.join(BUTTONS)}")

    @property
    def axis_count(self) -> int:
        indices = (self.left_x, self.left_y, self.left_trigger, self.right_x, self.right_y, self.right_trigger)
        return max(indices) + 1


def pygame_inputs(
    axes: Sequence[float], buttons: Sequence[int | bool], layout: PygameLayout | None = None
) -> tuple[GamepadAxes, frozenset[str]]:
    """SDL joystick values (axes in [-1, 1], triggers resting at -1; buttons 0/1) -> normalized inputs."""
    layout = layout or PygameLayout()
    if len(axes) < layout.axis_count:
        raise ValueError(f"the gamepad layout needs {layout.axis_count} axes, the pad has {len(axes)}: {list(axes)}")
    normalized = GamepadAxes(
        left_x=axes[layout.left_x],
        left_y=axes[layout.left_y],
        right_x=axes[layout.right_x],
        right_y=axes[layout.right_y],
        left_trigger=(axes[layout.left_trigger] + 1.0) / 2.0,
        right_trigger=(axes[layout.right_trigger] + 1.0) / 2.0,
    )
    held = frozenset(name for name, index in layout.buttons.items() if index < len(buttons) and buttons[index])
    return normalized, held


def normalize_axis(value: float, minimum: float, maximum: float, centered: bool) -> float:
    """An evdev absolute axis value in [minimum, maximum] -> [-1, 1] (centered: sticks) or [0, 1] (triggers)."""
    if not maximum > minimum:
        raise ValueError(f"axis range must have maximum > minimum, got [{minimum}, {maximum}]")
    unit = min(max((value - minimum) / (maximum - minimum), 0.0), 1.0)
    return 2.0 * unit - 1.0 if centered else unit


class _PygameReader:
    """The first (or `index`-th) SDL joystick. read() raises OSError once the pad is gone."""

    JOYSTICK_EVENTS = (
        "JOYAXISMOTION",
        "JOYBUTTONDOWN",
        "JOYBUTTONUP",
        "JOYHATMOTION",
        "JOYBALLMOTION",
        "JOYDEVICEADDED",
        "JOYDEVICEREMOVED",
    )

    def __init__(self, index: int, layout: PygameLayout):
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # the event pump needs a video driver; no window opens
        os.environ.setdefault("SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS", "1")  # no focus in a terminal session
        pygame = require_library("pygame", "gamepad")
        self.pygame, self.layout = pygame, layout
        pygame.display.init()
        pygame.joystick.init()
        count = pygame.joystick.get_count()
        if index >= count:
            raise TeleopUnavailableError(
                f"no gamepad at index {index}: SDL (pygame) sees {count} joystick(s); plug one in, check read "
                "access to /dev/input/event* (the 'input' group), or try backend='evdev'"
            )
        self.joystick = pygame.joystick.Joystick(index)
        self.joystick.init()
        self.name = self.joystick.get_name()
        if self.joystick.get_numaxes() < layout.axis_count:
            raise TeleopUnavailableError(
                f"the gamepad {self.name!r} has {self.joystick.get_numaxes()} axes, the layout needs "
                f"{layout.axis_count}; pass a PygameLayout that matches it"
            )
        self.instance_id = self.joystick.get_instance_id()
        self.event_types = [getattr(pygame, name) for name in self.JOYSTICK_EVENTS]
        # SDL reports every axis as 0.0 until its first event, which for a trigger means half pressed.
        self.trigger_moved = {layout.left_trigger: False, layout.right_trigger: False}

    def read(self) -> tuple[GamepadAxes, frozenset[str]]:
        pygame = self.pygame
        try:
            # Only joystick events are taken, so a pygame window elsewhere in the process keeps its own.
            for event in pygame.event.get(self.event_types):
                if event.type == pygame.JOYDEVICEREMOVED and event.instance_id == self.instance_id:
                    raise OSError(f"gamepad {self.name!r} was removed")
            axes = [self.joystick.get_axis(i) for i in range(self.joystick.get_numaxes())]
            buttons = [self.joystick.get_button(i) for i in range(self.joystick.get_numbuttons())]
        except pygame.error as error:
            raise OSError(f"gamepad {self.name!r}: {error}") from error
        for index, moved in self.trigger_moved.items():
            if not moved and axes[index] != 0.0:
                self.trigger_moved[index] = True
            if not self.trigger_moved[index]:
                axes[index] = -1.0
        return pygame_inputs(axes, buttons, self.layout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.joystick.quit()


@dataclass(frozen=True)
class EvdevLayout:
    """evdev code names of an Xbox-style pad (the xpad driver's); other pads may put the right stick on
    ABS_Z/ABS_RZ and the triggers on ABS_BRAKE/ABS_GAS."""

    left_x: str = "ABS_X"
    left_y: str = "ABS_Y"
    right_x: str = "ABS_RX"
    right_y: str = "ABS_RY"
    left_trigger: str = "ABS_Z"
    right_trigger: str = "ABS_RZ"
    buttons: Mapping[str, str] = field(
        default_factory=lambda: {
            "a": "BTN_SOUTH", "b": "BTN_EAST", "x": "BTN_X", "y": "BTN_Y", "lb": "BTN_TL", "rb": "BTN_TR",
            "back": "BTN_SELECT", "start": "BTN_START", "guide": "BTN_MODE", "left_stick": "BTN_THUMBL",
            "right_stick": "BTN_THUMBR",
        }
    )  # fmt: skip


class _EvdevReader:
    """A pad read from /dev/input/event* without blocking. read() raises OSError once the pad is gone."""

    def __init__(self, device_path: str | None, layout: EvdevLayout):
        evdev = require_library("evdev", "gamepad")
        self.ecodes, self.layout = evdev.ecodes, layout
        codes = evdev.ecodes.ecodes
        axis_fields = ("left_x", "left_y", "right_x", "right_y", "left_trigger", "right_trigger")
        names = [getattr(layout, f) for f in axis_fields] + list(layout.buttons.values())
        missing = [name for name in names if name not in codes]
        if missing:
            raise ValueError(f"EvdevLayout names unknown evdev codes {missing}")
        self.axis_codes = {f: codes[getattr(layout, f)] for f in axis_fields}
        self.button_codes = {codes[code]: name for name, code in layout.buttons.items()}
        self.device = self._open(evdev, device_path)
        self.name = self.device.name
        self.ranges, self.values = {}, {}
        for field_name, code in self.axis_codes.items():
            info = self.device.absinfo(code)
            if not info.max > info.min:  # read() would divide by nothing
                self.device.close()
                raise TeleopUnavailableError(
                    f"gamepad {self.name!r} reports an empty range [{info.min}, {info.max}] for {field_name} "
                    f"({getattr(layout, field_name)}): pass an EvdevLayout that names its real axes"
                )
            self.ranges[code], self.values[code] = (info.min, info.max), info.value
        self._resync()

    def _resync(self) -> None:
        """Read every axis and button from the device itself (at open, and after the kernel dropped events:
        a release or recentring among them would otherwise leave a stick or button stuck)."""
        for code in self.axis_codes.values():
            self.values[code] = self.device.absinfo(code).value
        self.held = {code for code in self.device.active_keys() if code in self.button_codes}

    def _open(self, evdev, device_path: str | None):
        ecodes = evdev.ecodes
        if device_path is not None:
            try:
                return evdev.InputDevice(device_path)
            except OSError as error:
                raise TeleopUnavailableError(f"cannot open gamepad {device_path!r}: {error}") from error
        paths = evdev.list_devices()
        for path in paths:
            try:
                device = evdev.InputDevice(path)
            except OSError:
                continue
            capabilities = device.capabilities()
            is_pad = ecodes.BTN_SOUTH in capabilities.get(ecodes.EV_KEY, []) and ecodes.EV_ABS in capabilities
            has_axes = all(code in dict(capabilities.get(ecodes.EV_ABS, [])) for code in self.axis_codes.values())
            if is_pad and has_axes:
                return device
            device.close()
        raise TeleopUnavailableError(
            f"no gamepad found through evdev: {len(paths)} readable input device(s) under /dev/input, none with "
            "gamepad buttons and the layout's axes; plug one in, check read access to /dev/input/event* (the "
            "'input' group), pass device_path=, or try backend='pygame'"
        )

    def read(self) -> tuple[GamepadAxes, frozenset[str]]:
        ecodes = self.ecodes
        with contextlib.suppress(BlockingIOError):  # no pending events
            for event in self.device.read():
                if event.type == ecodes.EV_SYN and event.code == ecodes.SYN_DROPPED:
                    self._resync()
                elif event.type == ecodes.EV_ABS and event.code in self.ranges:
                    self.values[event.code] = event.value
                elif event.type == ecodes.EV_KEY and event.code in self.button_codes:
                    (self.held.add if event.value else self.held.discard)(event.code)
        axes = {}
        for field_name, code in self.axis_codes.items():
            axes[field_name] = normalize_axis(self.values[code], *self.ranges[code], "trigger" not in field_name)
        return GamepadAxes(**axes), frozenset(self.button_codes[code] for code in self.held)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.device.close()


class GamepadTeleop(TeleopDevice):
    """An Xbox-style pad as a teleop device. `index` picks the SDL joystick (pygame backend), `device_path`
    the /dev/input/event* node (evdev backend; default: the first pad found)."""

    name = "gamepad"

    def __init__(
        self,
        backend: str = "pygame",
        index: int = 0,
        device_path: str | None = None,
        deadzone: float = 0.1,
        bindings: GamepadBindings | Mapping | None = None,
        axis_map: AxisMap | None = None,
        layout: PygameLayout | EvdevLayout | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"unknown gamepad backend {backend!r}; available: {', '.join(BACKENDS)}")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"gamepad index must be an int >= 0, got {index!r}")
        self.deadzone = check_deadzone(deadzone)
        if isinstance(bindings, Mapping):
            bindings = GamepadBindings(**bindings)
        self.bindings = bindings or GamepadBindings()
        self.axis_map = axis_map or AxisMap()
        if not isinstance(self.axis_map, AxisMap):
            raise ValueError(f"gamepad axis_map must be an AxisMap, got {type(self.axis_map).__name__}")
        if backend == "pygame":
            if layout is not None and not isinstance(layout, PygameLayout):
                raise ValueError(f"the pygame backend takes a PygameLayout, got {type(layout).__name__}")
            self._reader = _PygameReader(index, layout or PygameLayout())
        else:
            if layout is not None and not isinstance(layout, EvdevLayout):
                raise ValueError(f"the evdev backend takes an EvdevLayout, got {type(layout).__name__}")
            self._reader = _EvdevReader(device_path, layout or EvdevLayout())
        self.product = self._reader.name
        self._state = GamepadState()
        self._connected = True

    def poll(self) -> TeleopCommand:
        if not self._connected:
            return TeleopCommand.idle(self._state.gripper, connected=False)
        try:
            axes, held = self._reader.read()
        except OSError:
            self.close()
            return TeleopCommand.idle(self._state.gripper, connected=False)
        command, self._state = gamepad_command(axes, held, self._state, self.deadzone, self.bindings, self.axis_map)
        return command

    def close(self) -> None:
        if self._connected:
            self._connected = False
            self._reader.close()
