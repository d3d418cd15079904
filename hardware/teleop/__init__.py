"""Teleop devices (robotrl.hil.teleop's interface): keyboard, SpaceMouse, gamepad. Their libraries are
imported when a device is built, so importing this package needs none of them."""

from robotrl.hardware.teleop.gamepad import GamepadTeleop
from robotrl.hardware.teleop.keyboard import KeyboardTeleop
from robotrl.hardware.teleop.spacemouse import SpaceMouseTeleop

__all__ = ["GamepadTeleop", "KeyboardTeleop", "SpaceMouseTeleop"]
