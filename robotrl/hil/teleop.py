"""The teleop device interface: what a keyboard, SpaceMouse or gamepad reports to the intervention loop.

A device is polled once per control step (`TeleopDevice.poll`, non-blocking) and answers with a
`TeleopCommand`: whether the operator is taking over this step, a normalized twist in the robot base frame,
the gripper command, whether the device is still there, and one-shot events (episode marks, quit).
`command_to_action` turns a command into an action for the built-in tasks' `ee_delta` control.

The devices live in `robotrl.hardware.teleop` and import their libraries (hidapi, pygame, evdev) lazily;
`make_teleop` builds one by name. The shared pieces they are written with are here: `AxisMap` (device axes
to the robot base frame), `apply_deadzone`, `require_library` and `TeleopUnavailableError`.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

EVENTS = frozenset({"success", "failure", "reset", "quit", "toggle_takeover"})
GRIPPER_OPEN, GRIPPER_CLOSED = -1.0, 1.0
TELEOP_EXTRA_HINT = "pip install robotrl[teleop]"

# kind -> "module:class"; imported on demand so that asking for a keyboard never loads hidapi or pygame.
DEVICE_KINDS = {
    "gamepad": "robotrl.hardware.teleop.gamepad:GamepadTeleop",
    "joy": "robotrl.hardware.teleop.ros_topics:JoyTeleop",
    "twist": "robotrl.hardware.teleop.ros_topics:TwistTeleop",
    "keyboard": "robotrl.hardware.teleop.keyboard:KeyboardTeleop",
    "spacemouse": "robotrl.hardware.teleop.spacemouse:SpaceMouseTeleop",
}
SUPPORTED_ACTION_DIMS = {
    3: "linear xyz",
    4: "linear xyz + gripper",
    6: "twist",
    7: "twist + gripper",
}


class TeleopUnavailableError(RuntimeError):
    """The device cannot be used here: not plugged in, no permission, or no terminal to read keys from."""


@dataclass
class TeleopCommand:
    engaged: bool  # the operator is taking over this step (moved beyond the deadzone, a button held, takeover on)
    twist: torch.Tensor  # [6] float32 in [-1, 1]: linear x, y, z, angular x, y, z in the robot base frame
    gripper: float  # -1 open .. +1 closed (last commanded; devices toggle or hold)
    connected: bool = True  # False once the device disconnected (read error / unplugged); engaged is then False
    events: frozenset[str] = frozenset()  # one-shot events this poll, a subset of EVENTS

    def __post_init__(self):
        if not isinstance(self.twist, torch.Tensor) or self.twist.shape != (6,):
            shape = tuple(self.twist.shape) if isinstance(self.twist, torch.Tensor) else type(self.twist).__name__
            raise ValueError(f"TeleopCommand.twist must be a tensor of shape (6,), got {shape}")
        if not self.twist.is_floating_point():
            raise ValueError(f"TeleopCommand.twist must be floating point, got {self.twist.dtype}")
        self.twist = self.twist.to(torch.float32)
        self.events = frozenset(self.events)
        unknown = self.events - EVENTS
        if unknown:
            raise ValueError(f"unknown teleop events {sorted(unknown)}; known events: {', '.join(sorted(EVENTS))}")

    @classmethod
    def idle(
        cls, gripper: float = GRIPPER_OPEN, connected: bool = True, events: frozenset[str] = frozenset()
    ) -> TeleopCommand:
        """No takeover and no motion: what a device reports when untouched, or once it is gone."""
        return cls(engaged=False, twist=torch.zeros(6), gripper=gripper, connected=connected, events=events)


class TeleopDevice(ABC):
    """A teleop device, polled once per control step. Use it as a context manager, or call `close`."""

    name: str = "teleop"

    @abstractmethod
    def poll(self) -> TeleopCommand:
        """The latest state, without blocking. Never raises for a device that went away: `connected` says so."""

    def close(self) -> None:  # noqa: B027 (optional: a device with nothing to release keeps this one)
        """Release the device (and restore whatever it changed, such as terminal settings). Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def command_to_action(command: TeleopCommand, action_dim: int, gain: float = 1.0) -> torch.Tensor:
    """[action_dim] float32 in [-1, 1] for `ee_delta` control: 3 -> linear xyz, 4 -> xyz + gripper,
    6 -> twist, 7 -> twist + gripper. `gain` scales the twist, not the gripper; the result is clamped."""
    if isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim not in SUPPORTED_ACTION_DIMS:
        supported = ", ".join(f"{dim} ({what})" for dim, what in SUPPORTED_ACTION_DIMS.items())
        raise ValueError(f"teleop cannot drive action_dim={action_dim!r}; supported: {supported}")
    if not isinstance(gain, (int, float)) or not math.isfinite(gain) or gain < 0:
        raise ValueError(f"teleop gain must be a finite number >= 0, got {gain!r}")
    twist = command.twist.to(torch.float32)
    if not bool(torch.isfinite(twist).all()):
        raise ValueError(f"teleop command twist is not finite: {twist.tolist()}")
    if not math.isfinite(command.gripper):
        raise ValueError(f"teleop command gripper is not finite: {command.gripper!r}")
    motion = twist[:3] if action_dim in (3, 4) else twist
    parts = [motion * gain]
    if action_dim in (4, 7):
        parts.append(torch.tensor([command.gripper], dtype=torch.float32))
    return torch.cat(parts).clamp(-1.0, 1.0)


def make_teleop(kind: str, **options) -> TeleopDevice:
    """A teleop device by name: keyboard, spacemouse, gamepad, joy or twist; `options` go to its constructor."""
    kinds = ", ".join(sorted(DEVICE_KINDS))
    if kind == "scripted":
        raise ValueError(
            f"teleop kind 'scripted' is not a device: the scripted operator needs an env, so it is built with the "
            f"env (robotrl/hil); make_teleop builds the device kinds: {kinds}"
        )
    if not isinstance(kind, str) or kind not in DEVICE_KINDS:
        raise ValueError(f"unknown teleop kind {kind!r}; available: {kinds} ('scripted' is built with an env)")
    module_name, class_name = DEVICE_KINDS[kind].split(":")
    device_class = getattr(importlib.import_module(module_name), class_name)
    return device_class(**options)


@dataclass(frozen=True)
class AxisMap:
    """Device axes -> robot base frame twist: `out[i] = signs[i] * values[order[i]]` for the six axes
    (linear x, y, z, angular x, y, z). A frame change is a signed permutation; keep its determinant +1 (a
    rotation) so linear and angular axes stay consistent."""

    order: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    signs: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0)

    def __post_init__(self):
        order, signs = tuple(self.order), tuple(self.signs)
        if sorted(order) != list(range(6)) or any(isinstance(i, bool) or not isinstance(i, int) for i in order):
            raise ValueError(f"AxisMap.order must be a permutation of 0..5, got {list(order)}")
        if len(signs) != 6 or any(s not in (-1, 1) for s in signs):
            raise ValueError(f"AxisMap.signs must be six values of +1 or -1, got {list(signs)}")
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "signs", tuple(float(s) for s in signs))

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        if values.shape != (6,):
            raise ValueError(f"AxisMap.apply takes six axis values, got shape {tuple(values.shape)}")
        return values[list(self.order)] * torch.tensor(self.signs, dtype=values.dtype)


def apply_deadzone(values: torch.Tensor, deadzone: float) -> torch.Tensor:
    """Zero within `deadzone` of rest; beyond it rescale so the output still ramps from 0 to 1 without a jump."""
    magnitude = (values.abs() - deadzone).clamp(min=0.0) / (1.0 - deadzone)
    return torch.sign(values) * magnitude.clamp(max=1.0)


def check_deadzone(deadzone: float) -> float:
    if isinstance(deadzone, bool) or not isinstance(deadzone, (int, float)) or not 0.0 <= deadzone < 1.0:
        raise ValueError(f"deadzone must be a number in [0, 1), got {deadzone!r}")
    return float(deadzone)


def check_button_events(button_events: dict, buttons: Sequence | None = None) -> dict:
    """Validate a {button: event} binding: events from EVENTS; buttons from `buttons` when given."""
    bindings = dict(button_events)
    for button, event in bindings.items():
        if event not in EVENTS:
            raise ValueError(f"button {button!r} is bound to unknown event {event!r}; events: {sorted(EVENTS)}")
        if buttons is not None and button not in buttons:
            raise ValueError(f"unknown button {button!r} in button_events; buttons: {list(buttons)}")
    return bindings


def require_library(module: str, device: str) -> ModuleType:
    """Import a device library, or fail with an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"the {device} teleop device needs the '{module}' module, which is not importable ({error}); "
            f"install the teleop extra: {TELEOP_EXTRA_HINT}"
        ) from error
