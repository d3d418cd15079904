"""Teleop devices: the command interface, the keyboard through a real pty, SpaceMouse HID reports from
fixture bytes (and an unplugged device), the gamepad mapping, and make_teleop's errors."""

from __future__ import annotations

import math
import os
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from itertools import accumulate
from pathlib import Path

import pytest
import torch
from robotrl.hardware.teleop import gamepad
from robotrl.hardware.teleop.gamepad import (
    GamepadAxes,
    GamepadBindings,
    GamepadState,
    GamepadTeleop,
    PygameLayout,
    gamepad_command,
    normalize_axis,
    pygame_inputs,
)
from robotrl.hardware.teleop.keyboard import KEYMAP, KeyboardTeleop
from robotrl.hardware.teleop.spacemouse import (
    AXIS_MAPS,
    SpaceMouseState,
    SpaceMouseTeleop,
    find_spacemouse,
    parse_report,
    spacemouse_twist,
)

from robotrl.hil.teleop import (
    AxisMap,
    TeleopCommand,
    TeleopUnavailableError,
    command_to_action,
    make_teleop,
)

DATA = Path(__file__).resolve().parent / "data"
TWIST = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5, -0.6])


# ---------------------------------------------------------------- command_to_action, make_teleop


def command(twist=TWIST, gripper=1.0, engaged=True) -> TeleopCommand:
    return TeleopCommand(engaged=engaged, twist=twist.clone(), gripper=gripper)


@pytest.mark.parametrize(
    ("dim", "expected"),
    [
        (3, [0.1, -0.2, 0.3]),
        (4, [0.1, -0.2, 0.3, 1.0]),
        (6, [0.1, -0.2, 0.3, -0.4, 0.5, -0.6]),
        (7, [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 1.0]),
    ],
)
def test_command_to_action_per_dim(dim, expected):
    action = command_to_action(command(), dim)
    assert action.dtype == torch.float32 and action.shape == (dim,)
    torch.testing.assert_close(action, torch.tensor(expected))


def test_command_to_action_gain_scales_twist_not_gripper_and_clamps():
    action = command_to_action(command(gripper=-1.0), 7, gain=2.0)
    torch.testing.assert_close(action, torch.tensor([0.2, -0.4, 0.6, -0.8, 1.0, -1.0, -1.0]))


@pytest.mark.parametrize("dim", [0, 1, 2, 5, 8, "7", True, 7.0])
def test_command_to_action_rejects_unsupported_dims(dim):
    with pytest.raises(ValueError, match=r"action_dim=.*supported: 3 .*4 .*6 .*7"):
        command_to_action(command(), dim)


def test_command_to_action_rejects_non_finite_commands():
    with pytest.raises(ValueError, match="twist is not finite"):
        command_to_action(command(twist=torch.tensor([0.0, math.nan, 0, 0, 0, 0])), 6)
    with pytest.raises(ValueError, match="gripper is not finite"):
        command_to_action(command(gripper=math.inf), 4)
    with pytest.raises(ValueError, match="gain"):
        command_to_action(command(), 6, gain=math.nan)


def test_teleop_command_validates_its_fields():
    with pytest.raises(ValueError, match=r"shape \(6,\), got \(5,\)"):
        TeleopCommand(engaged=False, twist=torch.zeros(5), gripper=0.0)
    with pytest.raises(ValueError, match="unknown teleop events"):
        TeleopCommand(engaged=False, twist=torch.zeros(6), gripper=0.0, events=frozenset({"sucess"}))
    assert TeleopCommand(False, torch.zeros(6, dtype=torch.float64), 0.0).twist.dtype == torch.float32


def test_make_teleop_errors_list_the_kinds():
    with pytest.raises(ValueError, match=r"kind 'joystick'; available: gamepad, joy, keyboard, spacemouse, twist"):
        make_teleop("joystick")
    with pytest.raises(ValueError, match=r"scripted.*needs an env.*gamepad, joy, keyboard, spacemouse, twist"):
        make_teleop("scripted")
    with pytest.raises(ValueError, match="unknown teleop kind"):
        make_teleop(["keyboard"])


def test_make_teleop_builds_a_device_with_its_options():
    read_end, write_end = os.pipe()
    try:
        with make_teleop("keyboard", fd=read_end, hold_s=0.2) as device:
            assert isinstance(device, KeyboardTeleop) and device.hold_s == 0.2
    finally:
        os.close(read_end)
        os.close(write_end)


def test_axis_map_validates_and_permutes():
    mapped = AxisMap(order=(1, 0, 2, 4, 3, 5), signs=(1, -1, 1, 1, 1, -1)).apply(torch.arange(6.0))
    torch.testing.assert_close(mapped, torch.tensor([1.0, -0.0, 2.0, 4.0, 3.0, -5.0]))
    with pytest.raises(ValueError, match=r"permutation of 0\.\.5"):
        AxisMap(order=(0, 0, 1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"\+1 or -1"):
        AxisMap(signs=(1, 1, 1, 1, 1, 2))


# ---------------------------------------------------------------- keyboard, through a real pty


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pty_pair():
    master, slave = os.openpty()
    yield master, slave
    for fd in (master, slave):
        try:
            os.close(fd)
        except OSError:
            pass


def type_keys(master: int, slave: int, keys: bytes) -> None:
    """Write keys to the terminal and wait until the slave side can read them (the pty pushes input
    through a kernel work queue, so it is not readable the instant write returns)."""
    os.write(master, keys)
    ready, _, _ = select.select([slave], [], [], 2.0)
    assert ready, "the pty never delivered the keys"


def test_keyboard_engages_while_a_key_repeats_and_releases_after_hold(pty_pair):
    master, slave = pty_pair
    clock = FakeClock()
    with KeyboardTeleop(fd=slave, hold_s=0.15, clock=clock) as keyboard:
        assert not keyboard.poll().engaged
        type_keys(master, slave, b"w")
        first = keyboard.poll()
        assert first.engaged and first.connected
        torch.testing.assert_close(first.twist, torch.tensor([1.0, 0, 0, 0, 0, 0]))
        for _ in range(5):  # OS key repeat: a press every 30 ms keeps it engaged
            clock.now += 0.03
            type_keys(master, slave, b"w")
            assert keyboard.poll().engaged
        clock.now += 0.1  # no new press for 0.1 s < hold_s
        assert keyboard.poll().twist[0] == 1.0
        clock.now += 0.06  # 0.16 s since the last press
        released = keyboard.poll()
        assert not released.engaged and not bool(released.twist.any())


def test_keyboard_keys_combine_axes_and_latest_direction_wins(pty_pair):
    master, slave = pty_pair
    with KeyboardTeleop(fd=slave, clock=FakeClock()) as keyboard:
        type_keys(master, slave, b"wdrjo")
        torch.testing.assert_close(keyboard.poll().twist, torch.tensor([1.0, -1.0, 1.0, 0.0, 1.0, -1.0]))
        type_keys(master, slave, b"sI")  # upper case acts as lower case
        torch.testing.assert_close(keyboard.poll().twist, torch.tensor([-1.0, -1.0, 1.0, 1.0, 1.0, -1.0]))


def test_keyboard_gripper_toggle_and_events(pty_pair):
    master, slave = pty_pair
    clock = FakeClock()
    with KeyboardTeleop(fd=slave, clock=clock) as keyboard:
        assert keyboard.poll().gripper == -1.0
        type_keys(master, slave, b" ")
        closed = keyboard.poll()
        assert closed.gripper == 1.0 and closed.engaged  # a gripper change is a correction too
        clock.now += 1.0
        assert keyboard.poll().gripper == 1.0 and not keyboard.poll().engaged
        type_keys(master, slave, b" ")
        assert keyboard.poll().gripper == -1.0

        type_keys(master, slave, b"\r")
        assert keyboard.poll().events == {"success"}
        assert keyboard.poll().events == frozenset()  # one-shot
        type_keys(master, slave, b"ynx\x7fq\x03")
        assert keyboard.poll().events == {"success", "failure", "reset", "quit"}

        type_keys(master, slave, b"t")
        toggled = keyboard.poll()
        assert toggled.events == {"toggle_takeover"} and toggled.engaged
        clock.now += 5.0
        held = keyboard.poll()
        assert held.engaged and not bool(held.twist.any())  # persistent takeover: the operator holds the robot
        type_keys(master, slave, b"t")
        assert not keyboard.poll().engaged


def test_keyboard_ignores_escape_sequences(pty_pair):
    master, slave = pty_pair
    with KeyboardTeleop(fd=slave, clock=FakeClock()) as keyboard:
        type_keys(master, slave, b"\x1b[A\x1b[1;5D\x1bOP")  # arrow up, ctrl+arrow left, F1: no 'a', 'd', 'p'
        polled = keyboard.poll()
        assert not polled.engaged and polled.events == frozenset()


@pytest.mark.parametrize(("head", "tail"), [(b"\x1b[", b"D"), (b"\x1b", b"OA"), (b"\x1b[1;5", b"C")])
def test_keyboard_ignores_an_escape_sequence_split_across_polls(pty_pair, head, tail):
    """Over SSH a sequence can arrive in two reads: its last letter ('D', 'A', 'C') is no motion key."""
    master, slave = pty_pair
    with KeyboardTeleop(fd=slave, clock=FakeClock()) as keyboard:
        type_keys(master, slave, head)
        assert not keyboard.poll().engaged
        type_keys(master, slave, tail + b"w")
        polled = keyboard.poll()
        assert polled.engaged and polled.twist.tolist() == [1.0, 0, 0, 0, 0, 0]  # the 'w' that followed, only


def test_keyboard_disconnects_when_the_terminal_goes_away(pty_pair):
    master, slave = pty_pair
    with KeyboardTeleop(fd=slave, clock=FakeClock()) as keyboard:
        type_keys(master, slave, b"w")
        os.close(master)  # the SSH session drops: reads on the slave fail with EIO
        polled = keyboard.poll()
        assert not polled.connected and not polled.engaged
        assert not keyboard.poll().connected


def test_keyboard_eof_on_a_pipe_disconnects():
    read_end, write_end = os.pipe()
    try:
        keyboard = KeyboardTeleop(fd=read_end)
        os.write(write_end, b"a")
        assert keyboard.poll().twist[1] == 1.0
        os.close(write_end)
        assert not keyboard.poll().connected
    finally:
        os.close(read_end)


def test_keyboard_restores_terminal_attributes(pty_pair):
    _, slave = pty_pair
    before = termios.tcgetattr(slave)
    keyboard = KeyboardTeleop(fd=slave)
    during = termios.tcgetattr(slave)
    assert not during[3] & termios.ICANON and not during[3] & termios.ECHO and not during[3] & termios.ISIG
    keyboard.close()
    assert termios.tcgetattr(slave) == before
    keyboard.close()  # idempotent

    with pytest.raises(RuntimeError, match="boom"), KeyboardTeleop(fd=slave):
        raise RuntimeError("boom")
    assert termios.tcgetattr(slave) == before


def test_keyboard_without_a_tty_fails_clearly(monkeypatch):
    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as not_a_tty:
        monkeypatch.setattr(sys, "stdin", not_a_tty)
        with pytest.raises(TeleopUnavailableError, match="stdin is not a tty"):
            KeyboardTeleop()
    os.close(write_end)
    with pytest.raises(ValueError, match="hold_s"):
        KeyboardTeleop(fd=0, hold_s=0)
    with pytest.raises(ValueError, match="fd must be"):
        KeyboardTeleop(fd=-1)


def test_keymap_covers_the_documented_keys():
    assert {KEYMAP[k] for k in "wsadrfikjluo"} == {f"{s}{a}_{x}" for s in "+-" for a in ("linear", "angular")
                                                   for x in "xyz"}  # fmt: skip
    assert KEYMAP[" "] == "toggle_gripper" and KEYMAP["t"] == "toggle_takeover"
    assert KEYMAP["\x03"] == KEYMAP["q"] == "quit"


# ---------------------------------------------------------------- SpaceMouse HID reports
#
# Fixture layout (tests/data/spacemouse_*.bin): a sequence of records, each one length byte N followed by N
# bytes of one HID input report exactly as hidapi returns it (report id first). In a report, axes are
# int16 little endian in the device frame (x right, y toward the operator, z down): id 1 carries the
# translation (6 bytes; 12 bytes with the rotation on the newer devices), id 2 the rotation, id 3 the
# button bitmask (bit 0 left, bit 1 right). The bytes were synthesized to that layout (see
# write_spacemouse_fixtures, `python tests/test_teleop.py` rewrites them), not captured from a device.


def _axes(report_id: int, *counts: int) -> bytes:
    return bytes([report_id]) + struct.pack(f"<{len(counts)}h", *counts)


def _buttons(mask: int) -> bytes:
    return bytes([3]) + mask.to_bytes(2, "little")


# SpaceNavigator / SpaceMouse Compact generation: translation (id 1) and rotation (id 2) in separate reports.
SEPARATE_REPORTS = [
    _axes(1, 0, 0, 0), _axes(2, 0, 0, 0),  # 0-1 at rest
    _axes(1, 0, -40, 0), _axes(2, 2, 0, 0),  # 2-3 starting to push the cap away
    _axes(1, 0, -175, 3), _axes(2, 4, -2, 0),  # 4-5 half way
    _axes(1, 0, -350, 5), _axes(2, 6, -3, 1),  # 6-7 full deflection
    _axes(1, 6, -4, 3), _axes(2, -5, 7, 2),  # 8-9 let go: sensor noise
    _axes(1, 0, 0, 420), _axes(2, 0, 0, 0),  # 10-11 pressed down hard, past the nominal 350
    _axes(1, 0, 0, 0), _axes(2, 0, 0, -175),  # 12-13 twisted half way
    _buttons(1), _buttons(0), _buttons(2), _buttons(0), _buttons(3), _buttons(0),  # 14-19 left, right, both
    _axes(1, 0, 0, 0), _axes(2, 0, 0, 0),  # 20-21 at rest
]  # fmt: skip
# SpaceMouse Wireless / Pro Wireless / Enterprise generation: one 12-byte report id 1 with all six axes.
COMBINED_REPORTS = [
    _axes(1, 0, 0, 0, 0, 0, 0),  # 0 at rest
    _axes(1, 120, 0, 0, 0, 0, 0),  # 1 sliding right
    _axes(1, 350, -10, 4, 0, 0, 15),  # 2 full right, a little yaw
    bytes([0x17, 100]),  # 3 battery level report: ignored
    _axes(1, -3, 5, -2, 4, -6, 1),  # 4 let go: sensor noise
    _axes(1, 0, 0, 0, -350, 0, 0),  # 5 tilted fully about x
    _buttons(1), _buttons(0), _buttons(2), _buttons(0),  # 6-9 left, right
    _axes(1, 0, 0, 0, 0, 0, 0),  # 10 at rest
]  # fmt: skip
FIXTURES = {"spacemouse_separate.bin": SEPARATE_REPORTS, "spacemouse_combined.bin": COMBINED_REPORTS}


def write_spacemouse_fixtures(directory: Path = DATA) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, reports in FIXTURES.items():
        (directory / name).write_bytes(b"".join(bytes([len(report)]) + report for report in reports))


def read_reports(name: str) -> list[bytes]:
    data, reports, at = (DATA / name).read_bytes(), [], 0
    while at < len(data):
        length = data[at]
        reports.append(data[at + 1 : at + 1 + length])
        at += 1 + length
    return reports


def fold_states(reports: list[bytes]) -> list[SpaceMouseState]:
    """The state after each report."""
    return list(accumulate(reports, lambda state, report: parse_report(report, state), initial=SpaceMouseState()))[1:]


def test_fixtures_hold_the_documented_reports():
    for name, reports in FIXTURES.items():
        assert read_reports(name) == reports


def test_parse_separate_translation_and_rotation_reports():
    states = fold_states(read_reports("spacemouse_separate.bin"))
    assert states[6] == SpaceMouseState(translation=(0, -350, 5), rotation=(4, -2, 0), buttons=0)
    assert states[7] == SpaceMouseState(translation=(0, -350, 5), rotation=(6, -3, 1), buttons=0)
    assert states[13].rotation == (0, 0, -175) and states[13].translation == (0, 0, 0)
    assert [s.buttons for s in states[14:20]] == [1, 0, 2, 0, 3, 0]
    assert states[-1] == SpaceMouseState()


def test_parse_combined_six_axis_reports():
    states = fold_states(read_reports("spacemouse_combined.bin"))
    assert states[2] == SpaceMouseState(translation=(350, -10, 4), rotation=(0, 0, 15))
    assert states[3] == states[2]  # the battery report changes nothing
    assert states[5].rotation == (-350, 0, 0)
    assert [s.buttons for s in states[6:10]] == [1, 0, 2, 0]


def test_spacemouse_twist_scaling_signs_and_deadzone():
    states = fold_states(read_reports("spacemouse_separate.bin"))
    facing, behind, device = AXIS_MAPS["facing"], AXIS_MAPS["behind"], AXIS_MAPS["device"]
    # Half deflection away from the operator: 175 / 350 counts. Facing the robot, that is toward its base (-x).
    half = spacemouse_twist(states[4], deadzone=0.0, axis_map=device)
    torch.testing.assert_close(half[:3], torch.tensor([0.0, -0.5, 3 / 350]))
    assert spacemouse_twist(states[4], deadzone=0.0, axis_map=facing)[0] == pytest.approx(-0.5)
    assert spacemouse_twist(states[4], deadzone=0.0, axis_map=behind)[0] == pytest.approx(0.5)
    # Full deflection, with the deadzone rescaling: the small cross-axis counts vanish, the main one stays 1.
    full = spacemouse_twist(states[7], deadzone=0.05, axis_map=facing)
    torch.testing.assert_close(full, torch.tensor([-1.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
    # Noise after letting go is inside the deadzone.
    assert not spacemouse_twist(states[9], deadzone=0.05).any()
    assert spacemouse_twist(states[9], deadzone=0.0).abs().max() > 0
    # Pressing down (+z in the device frame) is -z in the robot base frame, clamped at full scale.
    assert spacemouse_twist(states[11], axis_map=facing)[2] == -1.0
    # Twist: device rotation z -> robot angular z with the sign flip of the z axis.
    assert spacemouse_twist(states[13], axis_map=facing)[5] == pytest.approx(0.5)
    # Deadzone rescaling is continuous: 0.5 with a 0.1 deadzone -> (0.5 - 0.1) / 0.9.
    assert spacemouse_twist(states[4], deadzone=0.1, axis_map=device)[1] == pytest.approx(-0.4 / 0.9)


def test_spacemouse_twist_combined_generation():
    states = fold_states(read_reports("spacemouse_combined.bin"))
    twist = spacemouse_twist(states[2], deadzone=0.05, axis_map=AXIS_MAPS["facing"])
    # Right in the device frame is the robot's +y for an operator facing it; yaw 15/350 < deadzone.
    torch.testing.assert_close(twist, torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    assert spacemouse_twist(states[5], axis_map=AXIS_MAPS["facing"])[4] == -1.0  # device rx -> robot ry
    assert not spacemouse_twist(states[4], deadzone=0.05).any()


def test_parse_report_rejects_malformed_reports():
    with pytest.raises(ValueError, match="6 or 12 data bytes, got 4"):
        parse_report(bytes([1, 0, 0, 0, 0]), SpaceMouseState())
    with pytest.raises(ValueError, match="rotation report"):
        parse_report(bytes([2, 0]), SpaceMouseState())
    with pytest.raises(ValueError, match="empty"):
        parse_report(b"", SpaceMouseState())
    with pytest.raises(TypeError, match="list"):
        parse_report([1, 0, 0, 0, 0, 0, 0], SpaceMouseState())
    assert parse_report(bytes([9, 1, 2, 3]), SpaceMouseState(buttons=2)) == SpaceMouseState(buttons=2)


class FakeHid:
    """A hidapi device for the reader thread: hands out queued reports, then idles (or fails, unplugged)."""

    def __init__(self, reports: list[bytes], unplug_after: bool = False):
        self.reports, self.unplug_after = list(reports), unplug_after
        self.drained, self.closed = threading.Event(), False

    def read(self, max_length: int, timeout_ms: int) -> list[int]:
        if self.reports:
            return list(self.reports.pop(0))[:max_length]
        self.drained.set()
        if self.unplug_after:
            raise OSError("read error")
        time.sleep(timeout_ms / 1000)
        return []

    def close(self) -> None:
        self.closed = True


def replay(reports: list[bytes], **options) -> tuple[SpaceMouseTeleop, FakeHid]:
    fake = FakeHid(reports, unplug_after=options.pop("unplug_after", False))
    device = SpaceMouseTeleop(device=fake, read_timeout_ms=2, **options)
    assert fake.drained.wait(5.0)
    return device, fake


def test_spacemouse_device_replays_reports():
    reports = read_reports("spacemouse_combined.bin")
    with replay(reports[:3])[0] as device:
        moving = device.poll()
        assert moving.engaged and moving.connected and moving.twist[1] == 1.0 and moving.gripper == -1.0
    device, fake = replay(reports)
    polled = device.poll()
    # Left toggled the gripper closed, right toggled the takeover on; the cap is back at rest.
    assert polled.gripper == 1.0 and polled.events == {"toggle_takeover"} and polled.engaged
    assert not polled.twist.any()
    assert device.poll().events == frozenset() and device.poll().engaged  # takeover persists
    device.close()
    assert fake.closed and not device.poll().connected


def test_spacemouse_button_bindings_are_configurable():
    taps = [_buttons(1), _buttons(0), _buttons(4), _buttons(0)]
    device, _ = replay(taps, gripper_button=None, takeover_button=2, button_events={0: "success"})
    polled = device.poll()
    assert polled.gripper == -1.0 and polled.events == {"success", "toggle_takeover"}
    device.close()
    with pytest.raises(ValueError, match="bound twice"):
        SpaceMouseTeleop(device=FakeHid([]), button_events={1: "reset"})
    with pytest.raises(ValueError, match="unknown event"):
        SpaceMouseTeleop(device=FakeHid([]), button_events={5: "win"})
    with pytest.raises(ValueError, match="axis_map"):
        SpaceMouseTeleop(device=FakeHid([]), axis_map="upside_down")


def test_spacemouse_unplugged_reads_disconnected_without_raising():
    moving = read_reports("spacemouse_separate.bin")[:8]
    device, fake = replay(moving, unplug_after=True)
    device._reader.join(5.0)
    polled = device.poll()
    assert not polled.connected and not polled.engaged and not polled.twist.any()
    assert not device.poll().connected
    device.close()
    assert fake.closed


def test_spacemouse_malformed_reports_are_skipped():
    device, _ = replay([bytes([1, 5]), _axes(1, 0, 350, 0)], axis_map="device", deadzone=0.0)
    assert device.poll().twist[1] == 1.0 and device.malformed_reports == 1
    device.close()


def test_a_malformed_motion_report_leaves_the_cap_at_rest_not_at_its_last_deflection():
    # full deflection, then a truncated report (perhaps the return to rest): no motion until the next report
    device, _ = replay([_axes(1, 0, 350, 0), bytes([1, 0, 0, 0])], axis_map="device", deadzone=0.0)
    polled = device.poll()
    assert device.malformed_reports == 1 and not polled.twist.any() and not polled.engaged
    device.close()


def test_spacemouse_discovery(monkeypatch):
    class FakeHidModule:
        def __init__(self, devices):
            self.devices = devices

        def enumerate(self):
            return self.devices

    logitech_mouse = {"vendor_id": 0x046D, "product_id": 0xC077, "usage_page": 1, "usage": 2, "path": b"m"}
    new_model = {"vendor_id": 0x256F, "product_id": 0xC6FF, "usage_page": 1, "usage": 8, "path": b"new"}
    compact_keys = {"vendor_id": 0x256F, "product_id": 0xC635, "usage_page": 12, "usage": 1, "path": b"k"}
    compact_axes = {"vendor_id": 0x256F, "product_id": 0xC635, "usage_page": 1, "usage": 8, "path": b"c"}
    assert find_spacemouse(FakeHidModule([logitech_mouse, new_model, compact_keys, compact_axes]))["path"] == b"c"
    assert find_spacemouse(FakeHidModule([logitech_mouse, new_model]))["path"] == b"new"
    with pytest.raises(TeleopUnavailableError, match="no SpaceMouse found"):
        find_spacemouse(FakeHidModule([logitech_mouse]))
    monkeypatch.setitem(sys.modules, "hid", FakeHidModule([]))
    with pytest.raises(TeleopUnavailableError, match="udev"):
        SpaceMouseTeleop()


def test_spacemouse_without_hidapi_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "hid", None)
    with pytest.raises(ImportError, match=r"pip install robotrl\[teleop\]"):
        SpaceMouseTeleop()


# ---------------------------------------------------------------- gamepad


def poll_pad(axes: GamepadAxes | None = None, held=(), state: GamepadState | None = None, **options):
    return gamepad_command(axes or GamepadAxes(), frozenset(held), state or GamepadState(), **options)


def test_gamepad_axes_map_to_the_robot_frame():
    cases = [
        (GamepadAxes(left_y=-1.0), 0, 1.0),  # left stick up: +x
        (GamepadAxes(left_x=1.0), 1, -1.0),  # left stick right: -y
        (GamepadAxes(right_trigger=1.0), 2, 1.0),
        (GamepadAxes(left_trigger=1.0), 2, -1.0),
        (GamepadAxes(right_y=-1.0), 4, 1.0),  # right stick up: +angular y
        (GamepadAxes(right_x=-1.0), 5, 1.0),  # right stick left: +angular z
    ]
    for axes, index, value in cases:
        command, _ = poll_pad(axes)
        expected = torch.zeros(6)
        expected[index] = value
        torch.testing.assert_close(command.twist, expected)
        assert command.engaged
    roll, _ = poll_pad(held={"rb"})
    assert roll.twist[3] == 1.0 and roll.engaged
    swapped, _ = poll_pad(GamepadAxes(left_y=-1.0), axis_map=AxisMap(order=(1, 0, 2, 3, 4, 5)))
    assert swapped.twist[1] == 1.0


def test_gamepad_deadzone():
    resting, _ = poll_pad(GamepadAxes(left_x=0.05, left_y=-0.08, right_x=0.09, left_trigger=0.04), deadzone=0.1)
    assert not resting.engaged and not resting.twist.any()
    half, _ = poll_pad(GamepadAxes(left_y=-0.55), deadzone=0.1)
    assert half.twist[0] == pytest.approx(0.5)


def test_gamepad_buttons_toggle_on_press_and_fire_events_once():
    state = GamepadState()
    command, state = poll_pad(held={"a"}, state=state)
    assert command.gripper == 1.0 and command.engaged
    command, state = poll_pad(held={"a"}, state=state)  # still held: no second toggle
    assert command.gripper == 1.0 and command.engaged
    command, state = poll_pad(state=state)
    assert command.gripper == 1.0 and not command.engaged
    command, state = poll_pad(held={"b", "start"}, state=state)
    assert command.events == {"toggle_takeover", "success"} and command.engaged
    command, state = poll_pad(held={"b", "start"}, state=state)
    assert command.events == frozenset()
    command, state = poll_pad(held={"back", "y"}, state=state)
    assert command.events == {"reset", "failure"} and command.engaged  # takeover still on
    command, state = poll_pad(held={"b"}, state=state)
    command, state = poll_pad(state=state)
    assert not command.engaged and not state.takeover


def test_gamepad_mapping_validates_inputs():
    with pytest.raises(ValueError, match="unknown gamepad buttons"):
        poll_pad(held={"z"})
    with pytest.raises(ValueError, match="not finite"):
        poll_pad(GamepadAxes(left_x=math.nan))
    with pytest.raises(ValueError, match="not one of"):
        GamepadBindings(gripper="triangle")
    with pytest.raises(ValueError, match="bound twice"):
        GamepadBindings(events={"a": "success"})


def test_pygame_and_evdev_raw_values():
    raw_axes = [0.0, -1.0, -1.0, 0.5, 0.0, 1.0]  # LX, LY, LT (released), RX, RY, RT (pulled)
    raw_buttons = [1, 0, 0, 0, 0, 0, 0, 1]
    axes, held = pygame_inputs(raw_axes, raw_buttons)
    assert axes == GamepadAxes(left_x=0.0, left_y=-1.0, right_x=0.5, right_y=0.0, left_trigger=0.0, right_trigger=1.0)
    assert held == {"a", "start"}
    with pytest.raises(ValueError, match="needs 6 axes"):
        pygame_inputs(raw_axes[:4], raw_buttons)
    with pytest.raises(ValueError, match="unknown buttons"):
        PygameLayout(buttons={"select": 6})
    assert normalize_axis(-32768, -32768, 32767, centered=True) == -1.0
    assert normalize_axis(1023, 0, 1023, centered=False) == 1.0
    assert normalize_axis(0, 0, 255, centered=False) == 0.0
    with pytest.raises(ValueError, match="maximum > minimum"):
        normalize_axis(0, 5, 5, centered=True)


def test_gamepad_without_a_pad_fails_clearly():
    with pytest.raises(TeleopUnavailableError, match=r"SDL \(pygame\) sees 0 joystick"):
        GamepadTeleop(backend="pygame")
    with pytest.raises(TeleopUnavailableError, match="no gamepad found through evdev"):
        GamepadTeleop(backend="evdev")
    with pytest.raises(ValueError, match="unknown gamepad backend 'sdl'"):
        GamepadTeleop(backend="sdl")


def test_gamepad_removed_reads_disconnected(monkeypatch):
    class VanishingPad:
        name = "fake pad"

        def __init__(self, index, layout):
            self.reads = [(GamepadAxes(left_y=-1.0), frozenset({"a"}))]
            self.closed = False

        def read(self):
            if not self.reads:
                raise OSError("gamepad 'fake pad' was removed")
            return self.reads.pop()

        def close(self):
            self.closed = True

    monkeypatch.setattr(gamepad, "_PygameReader", VanishingPad)
    pad = GamepadTeleop()
    first = pad.poll()
    assert first.engaged and first.twist[0] == 1.0 and first.gripper == 1.0
    gone = pad.poll()
    assert not gone.connected and not gone.engaged and gone.gripper == 1.0
    assert pad._reader.closed and not pad.poll().connected


def _fake_evdev_pad(monkeypatch, batches, stick_range=(-32768, 32767)):
    """A fake /dev/input pad whose absinfo reports its true current axis values (`pad.now`)."""
    import evdev
    from evdev import AbsInfo, ecodes

    class Pad:
        name = "Fake pad"
        now = {}

        def __init__(self, path):
            self.batches = list(batches)

        def capabilities(self):
            axes = [ecodes.ABS_X, ecodes.ABS_Y, ecodes.ABS_Z, ecodes.ABS_RX, ecodes.ABS_RY, ecodes.ABS_RZ]
            return {ecodes.EV_KEY: [ecodes.BTN_SOUTH], ecodes.EV_ABS: [(a, None) for a in axes]}

        def absinfo(self, code):
            if code in (ecodes.ABS_Z, ecodes.ABS_RZ):
                return AbsInfo(Pad.now.get(code, 0), 0, 1023, 0, 0, 0)
            return AbsInfo(Pad.now.get(code, 0), *stick_range, 16, 128, 0)

        def active_keys(self):
            return []

        def read(self):
            if not self.batches:
                raise BlockingIOError
            return iter(self.batches.pop(0))

        def close(self):
            pass

    monkeypatch.setattr(evdev, "list_devices", lambda: ["/dev/input/event7"])
    monkeypatch.setattr(evdev, "InputDevice", Pad)
    return Pad


def test_gamepad_resyncs_after_the_kernel_dropped_events(monkeypatch):
    from evdev import InputEvent, ecodes

    pushed = [InputEvent(0, 0, ecodes.EV_ABS, ecodes.ABS_Y, -32768)]
    dropped = [InputEvent(0, 0, ecodes.EV_SYN, ecodes.SYN_DROPPED, 0)]  # the recentring was among the lost
    pad_class = _fake_evdev_pad(monkeypatch, [pushed, dropped])
    pad = GamepadTeleop(backend="evdev", deadzone=0.05)
    assert pad.poll().twist[0] == pytest.approx(1.0, abs=1e-4)
    pad_class.now = {ecodes.ABS_Y: 0}  # where the stick really is now
    assert not pad.poll().twist.any()  # never the stale full deflection


def test_gamepad_with_an_empty_axis_range_is_refused_at_open(monkeypatch):
    _fake_evdev_pad(monkeypatch, [], stick_range=(0, 0))
    with pytest.raises(TeleopUnavailableError, match=r"empty range.*left_x"):
        GamepadTeleop(backend="evdev")


def test_gamepad_evdev_backend_with_a_fake_event_device(monkeypatch):
    import evdev
    from evdev import AbsInfo, InputEvent, ecodes

    class FakePad:
        name = "Fake Xbox pad"

        def __init__(self, path):
            self.batches = [
                [
                    InputEvent(0, 0, ecodes.EV_ABS, ecodes.ABS_Y, -32768),
                    InputEvent(0, 0, ecodes.EV_ABS, ecodes.ABS_RZ, 1023),
                ],
                [],  # nothing pending
                [InputEvent(0, 0, ecodes.EV_KEY, ecodes.BTN_SOUTH, 1)],
            ]
            self.closed = False

        def capabilities(self):
            axes = [ecodes.ABS_X, ecodes.ABS_Y, ecodes.ABS_Z, ecodes.ABS_RX, ecodes.ABS_RY, ecodes.ABS_RZ]
            return {ecodes.EV_KEY: [ecodes.BTN_SOUTH, ecodes.BTN_EAST], ecodes.EV_ABS: [(a, None) for a in axes]}

        def absinfo(self, code):
            trigger = code in (ecodes.ABS_Z, ecodes.ABS_RZ)
            return AbsInfo(0, 0, 1023, 0, 0, 0) if trigger else AbsInfo(0, -32768, 32767, 16, 128, 0)

        def active_keys(self):
            return []

        def read(self):
            if not self.batches:
                raise OSError(19, "No such device")
            batch = self.batches.pop(0)
            if not batch:
                raise BlockingIOError
            return iter(batch)

        def close(self):
            self.closed = True

    monkeypatch.setattr(evdev, "list_devices", lambda: ["/dev/input/event7"])
    monkeypatch.setattr(evdev, "InputDevice", FakePad)
    pad = GamepadTeleop(backend="evdev", deadzone=0.05)
    assert pad.product == "Fake Xbox pad"
    moving = pad.poll()
    torch.testing.assert_close(moving.twist, torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), atol=1e-4, rtol=0)
    assert pad.poll().twist[2] == pytest.approx(1.0, abs=1e-4)  # no events: axes stay where they were
    pressed = pad.poll()
    assert pressed.gripper == 1.0 and pressed.twist[0] == pytest.approx(1.0, abs=1e-4)
    gone = pad.poll()
    assert not gone.connected and pad._reader.device.closed


def test_importing_the_devices_loads_no_device_library():
    code = "import sys, robotrl.hardware.teleop; print(sorted({'hid', 'pygame', 'evdev'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


if __name__ == "__main__":
    write_spacemouse_fixtures()
