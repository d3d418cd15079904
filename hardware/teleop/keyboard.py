"""Keyboard teleop in a plain terminal: no display, works over SSH.

Keys are read from stdin (or a given file descriptor) in non-canonical, no-echo mode without blocking, and
the terminal settings are restored on close, at exit and after exceptions (the device is a context manager).

Key map (also in `KEYMAP`), in the robot base frame:

    w / s      +x / -x            i / k      +angular x / -angular x
    a / d      +y / -y            j / l      +angular y / -angular y
    r / f      +z / -z            u / o      +angular z / -angular z
    space      toggle the gripper (starts open)
    t          toggle a persistent takeover (the operator holds the robot until t again)
    Enter / y  mark the episode a success          n   mark it a failure
    Backspace / x  reset                          q / Ctrl-C   quit

Terminals report key presses but no releases, so a motion key engages for `hold_s` after its last press
(held keys repeat, about every 30 ms after the OS's initial repeat delay). Upper-case letters act as
lower-case ones; escape sequences (arrow keys, function keys) are ignored. With `intercept_ctrl_c` (the
default) Ctrl-C arrives as the "quit" event instead of a KeyboardInterrupt, so the loop can stop the robot
cleanly; it then only works while something polls the device.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import select
import sys
import time
from collections.abc import Callable

import torch

from robotrl.hil.teleop import GRIPPER_CLOSED, GRIPPER_OPEN, TeleopCommand, TeleopDevice, TeleopUnavailableError

KEYMAP: dict[str, str] = {
    "w": "+linear_x",
    "s": "-linear_x",
    "a": "+linear_y",
    "d": "-linear_y",
    "r": "+linear_z",
    "f": "-linear_z",
    "i": "+angular_x",
    "k": "-angular_x",
    "j": "+angular_y",
    "l": "-angular_y",
    "u": "+angular_z",
    "o": "-angular_z",
    " ": "toggle_gripper",
    "t": "toggle_takeover",
    "\r": "success",
    "\n": "success",
    "y": "success",
    "n": "failure",
    "\x7f": "reset",  # Backspace (DEL) on most terminals
    "\x08": "reset",  # Backspace (BS) on some
    "x": "reset",
    "q": "quit",
    "\x03": "quit",  # Ctrl-C with intercept_ctrl_c
}
AXES = ("linear_x", "linear_y", "linear_z", "angular_x", "angular_y", "angular_z")
EVENT_ACTIONS = frozenset({"success", "failure", "reset", "quit", "toggle_takeover"})

# CSI sequences (ESC [ params final) and SS3 sequences (ESC O x), so their letters are not read as keys.
ESCAPE_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1bO.|\x1b")
# The start of such a sequence at the end of what was read: its rest arrives with the next read (over SSH,
# or past the read cap), and its final letter must not be taken for a key then.
INCOMPLETE_ESCAPE = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*|O)?\Z")
READ_CHUNK = 4096
MAX_READS_PER_POLL = 64


def describe_keymap() -> str:
    """One line per binding, for printing to the operator."""
    names = {" ": "space", "\r": "Enter", "\n": "Enter", "\x7f": "Backspace", "\x08": "Backspace", "\x03": "Ctrl-C"}
    lines: dict[str, list[str]] = {}
    for key, action in KEYMAP.items():
        label = names.get(key, key)
        if label not in lines.setdefault(action, []):
            lines[action].append(label)
    return "\n".join(f"{' / '.join(keys):>18}  {action}" for action, keys in lines.items())


class KeyboardTeleop(TeleopDevice):
    """Terminal keys -> TeleopCommand. `fd`: read this file descriptor instead of stdin (a pty in tests);
    it is configured if it is a terminal and is never closed by the device."""

    name = "keyboard"

    def __init__(
        self,
        fd: int | None = None,
        hold_s: float = 0.15,
        intercept_ctrl_c: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        if isinstance(hold_s, bool) or not isinstance(hold_s, (int, float)) or not 0.0 < hold_s < 10.0:
            raise ValueError(f"KeyboardTeleop hold_s must be seconds in (0, 10), got {hold_s!r}")
        if fd is None:
            fd = sys.stdin.fileno()
            if not os.isatty(fd):
                raise TeleopUnavailableError(
                    "the keyboard teleop reads keys from a terminal, but stdin is not a tty (a pipe, a file or a "
                    "service?); run it in a terminal (SSH works), or pass fd= for another input"
                )
        elif isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise ValueError(f"KeyboardTeleop fd must be a file descriptor (int >= 0), got {fd!r}")
        self.fd, self.hold_s, self.clock = fd, float(hold_s), clock
        self.connected = True
        self.gripper = GRIPPER_OPEN
        self.takeover = False
        # float64: monotonic clocks count seconds since boot, beyond float32's millisecond resolution.
        self._last_press = torch.full((6,), -math.inf, dtype=torch.float64)
        self._press_sign = torch.zeros(6)
        self._last_gripper_toggle = -math.inf
        self._saved_attributes = None
        self._partial_escape = ""  # an escape sequence cut by the end of the last read
        self._configure_terminal(intercept_ctrl_c)

    def _configure_terminal(self, intercept_ctrl_c: bool) -> None:
        if not os.isatty(self.fd):
            return
        import termios

        self._saved_attributes = termios.tcgetattr(self.fd)
        attributes = termios.tcgetattr(self.fd)
        iflag, lflag, cc = 0, 3, 6
        attributes[iflag] &= ~termios.IXON  # Ctrl-S / Ctrl-Q must not freeze the terminal mid-session
        attributes[lflag] &= ~(termios.ICANON | termios.ECHO)
        if intercept_ctrl_c:
            attributes[lflag] &= ~termios.ISIG
        attributes[cc][termios.VMIN] = 1
        attributes[cc][termios.VTIME] = 0
        # Registered before the change, so an exception or exit at any later point restores the terminal.
        atexit.register(self.close)
        termios.tcsetattr(self.fd, termios.TCSADRAIN, attributes)

    def close(self) -> None:
        if self._saved_attributes is not None:
            import termios

            saved, self._saved_attributes = self._saved_attributes, None
            with contextlib.suppress(termios.error, OSError):  # the terminal may already be gone
                termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
            atexit.unregister(self.close)
        self.connected = False

    def poll(self) -> TeleopCommand:
        if not self.connected:
            return TeleopCommand.idle(self.gripper, connected=False)
        now = self.clock()
        events: set[str] = set()
        for key in self._read_keys():
            action = KEYMAP.get(key.lower())
            if action is not None:
                self._apply(action, now, events)
        if not self.connected:
            return TeleopCommand.idle(self.gripper, connected=False)
        active = (now - self._last_press) < self.hold_s
        twist = torch.where(active, self._press_sign, torch.zeros(6))
        gripper_recent = now - self._last_gripper_toggle < self.hold_s
        engaged = self.takeover or bool(active.any()) or gripper_recent
        return TeleopCommand(engaged, twist, self.gripper, connected=True, events=frozenset(events))

    def _apply(self, action: str, now: float, events: set[str]) -> None:
        if action in EVENT_ACTIONS:
            events.add(action)
            if action == "toggle_takeover":
                self.takeover = not self.takeover
        elif action == "toggle_gripper":
            self.gripper = GRIPPER_CLOSED if self.gripper == GRIPPER_OPEN else GRIPPER_OPEN
            self._last_gripper_toggle = now
        else:
            axis = AXES.index(action[1:])
            sign = 1.0 if action[0] == "+" else -1.0
            # A key pressed against the other direction of its axis replaces it rather than cancelling it.
            self._press_sign[axis] = sign
            self._last_press[axis] = now

    def _read_keys(self) -> str:
        chunks = []
        for _ in range(MAX_READS_PER_POLL):
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.0)
                if not ready:
                    break
                data = os.read(self.fd, READ_CHUNK)
            except OSError:  # EIO: the terminal (or the pty's other end) is gone; EBADF: fd closed
                self.connected = False
                break
            if not data:  # EOF
                self.connected = False
                break
            chunks.append(data)
        text = self._partial_escape + b"".join(chunks).decode("utf-8", errors="ignore")
        cut = INCOMPLETE_ESCAPE.search(text)
        self._partial_escape, text = (text[cut.start() :], text[: cut.start()]) if cut else ("", text)
        return ESCAPE_SEQUENCE.sub("", text)
