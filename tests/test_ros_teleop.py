"""Teleop from ROS 2 topics (hardware/teleop/ros_topics.py), over real Cyclone DDS on loopback: a pad as joy_node
publishes it and a SpaceMouse as spacenav_node does, mapped as the local devices map them; stale messages stop the
motion and a silent node disconnects the device."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from helpers import wait_until
from robotrl.hardware.ros2.bridge import make_bridge
from robotrl.hardware.ros2.msgs import Joy, Twist, Vector3

from robotrl.hil.config import HILConfig
from robotrl.hil.setup import ros_teleop_options
from robotrl.hil.teleop import GRIPPER_CLOSED, GRIPPER_OPEN, make_teleop

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

# joy_node's Xbox layout: sticks left/up positive, triggers 1 released .. -1 pressed
REST = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
BUTTONS = [0] * 11


def _joy(axes=REST, buttons=BUTTONS) -> Joy:
    return Joy(axes=[float(a) for a in axes], buttons=list(buttons))


def test_a_pad_through_joy_node_moves_grips_and_takes_over():
    with make_bridge("dds", domain_id=221) as robot_side:
        publisher = robot_side.publisher("/joy", Joy, "sensor_data")
        device = make_teleop("joy", domain_id=221, max_age_s=0.5, disconnect_s=2.0)
        try:
            assert device.poll().engaged is False  # nothing heard yet: idle, still connected
            assert wait_until(lambda: device.subscription.publisher_count() > 0)
            up_and_pressed = list(REST)
            up_and_pressed[1] = 1.0  # left stick up: +x
            up_and_pressed[5] = -1.0  # right trigger pressed: +z
            publisher.publish(_joy(up_and_pressed))
            assert wait_until(lambda: device.poll().engaged)
            command = device.poll()
            torch.testing.assert_close(command.twist, torch.tensor([1.0, 0, 1.0, 0, 0, 0]))
            a_pressed = list(BUTTONS)
            a_pressed[0] = 1  # A: toggle the gripper
            publisher.publish(_joy(buttons=a_pressed))
            assert wait_until(lambda: device.poll().gripper == GRIPPER_CLOSED)
            b_pressed = list(BUTTONS)
            b_pressed[1] = 1  # B: a persistent takeover
            publisher.publish(_joy(buttons=b_pressed))
            assert wait_until(lambda: "toggle_takeover" in device.poll().events or device._state.takeover)
            publisher.publish(_joy())
            time.sleep(0.1)
            assert device.poll().engaged and device.poll().twist.abs().max() == 0  # taken over, standing still
            nan_stick = list(REST)
            nan_stick[0] = float("nan")
            publisher.publish(_joy(nan_stick))  # a driver's NaN, or a message with too few axes: no motion
            time.sleep(0.1)
            assert device.poll().twist.abs().max() == 0
            publisher.publish(_joy([1.0, 1.0]))
            time.sleep(0.1)
            assert device.poll().twist.abs().max() == 0
            publisher.publish(_joy())
            time.sleep(0.6)  # older than max_age_s: idle, never the last motion
            stale = device.poll()
            assert not stale.engaged and stale.connected and stale.gripper == GRIPPER_CLOSED
            time.sleep(1.5)  # silent past disconnect_s
            assert device.poll().connected is False
            publisher.publish(_joy())  # joy_node restarted: the operator has the robot back
            assert wait_until(lambda: device.poll().connected)
            start_pressed = list(BUTTONS)
            start_pressed[7] = 1
            publisher.publish(_joy(buttons=start_pressed))  # pressed and released between two polls
            publisher.publish(_joy())
            time.sleep(0.2)
            assert "success" in device.poll().events
        finally:
            device.close()


def test_a_press_counts_however_long_the_loop_goes_without_polling():
    """A robot's reset drives the arm home for seconds without polling the pad; joy_node repeats the held state at
    20 Hz meanwhile, more messages than a subscription keeps. The B pressed and released in that time still toggles
    the takeover at the next poll."""
    with make_bridge("dds", domain_id=228) as robot_side:
        publisher = robot_side.publisher("/joy", Joy, "sensor_data")
        device = make_teleop("joy", domain_id=228)
        try:
            assert wait_until(lambda: device.subscription.publisher_count() > 0)
            b_pressed = list(BUTTONS)
            b_pressed[1] = 1
            for buttons in [b_pressed] * 3 + [BUTTONS] * 20:  # held 0.15 s, then a second at rest
                publisher.publish(_joy(buttons=buttons))
                time.sleep(0.05)
            command = device.poll()
            assert "toggle_takeover" in command.events and command.engaged
        finally:
            device.close()


def test_a_spacemouse_through_spacenav_node():
    with make_bridge("dds", domain_id=222) as robot_side:
        twists = robot_side.publisher("/spacenav/twist", Twist, "sensor_data")
        buttons = robot_side.publisher("/spacenav/joy", Joy, "sensor_data")
        device = make_teleop("twist", domain_id=222)
        try:
            assert wait_until(lambda: device.subscription.publisher_count() > 0 and device.buttons.publisher_count())
            twists.publish(Twist(linear=Vector3(0.5, -0.5, 0.0), angular=Vector3(0.0, 0.0, float("nan"))))
            assert wait_until(lambda: device.poll().engaged)
            twist = device.poll().twist
            assert twist[0] > 0.4 and twist[1] < -0.4 and twist[2:].abs().max() == 0  # NaN moves nothing
            assert device.poll().gripper == GRIPPER_OPEN
            buttons.publish(Joy(buttons=[1, 0]))  # the left button: toggle the gripper
            assert wait_until(lambda: device.poll().gripper == GRIPPER_CLOSED)
            twists.publish(Twist())  # released: spacenav_node's zeros, then silence
            assert wait_until(lambda: not device.poll().engaged)
            time.sleep(2.2)  # quiet past disconnect_s, at rest: still connected
            assert device.poll().connected
        finally:
            device.close()


def test_settings_reach_the_device_and_bad_ones_are_refused():
    assert ros_teleop_options(HILConfig(operator="joy", teleop_topic="/pad", teleop_domain_id=7)) == {
        "domain_id": 7,
        "topic": "/pad",
    }
    assert ros_teleop_options(HILConfig(operator="keyboard")) == {}
    with pytest.raises(ValueError, match=r"hil.teleop_domain_id must be a ROS 2 domain id in 0..232, got 300"):
        HILConfig(operator="joy", teleop_domain_id=300).validate()
    with pytest.raises(ValueError, match=r"joy teleop disconnect_s \(0.1\) must be >= max_age_s \(0.5\)"):
        make_teleop("joy", domain_id=223, disconnect_s=0.1)


def test_robotrl_record_takes_demonstrations_from_a_pad_on_ros(tmp_path):
    """robotrl-record teleop=joy: a person's pad at another machine of the ROS graph (here a thread publishing as
    joy_node does, left stick pushed up) drives a recorded episode of panda_reach."""
    import threading

    from robotrl.tasks import TASK_CONFIGS

    from robotrl.data.dataset import EpisodeDataset
    from robotrl.record import RecordConfig, record

    pushed = list(REST)
    pushed[1] = 0.8  # left stick up: +x
    stop = threading.Event()
    with make_bridge("dds", domain_id=223) as person:
        publisher = person.publisher("/pad", Joy, "sensor_data")

        def joy_node() -> None:  # autorepeat at 20 Hz, as joy_node does while a stick is held
            while not stop.is_set():
                publisher.publish(_joy(pushed))
                time.sleep(0.05)

        thread = threading.Thread(target=joy_node, daemon=True)
        thread.start()
        try:
            task = TASK_CONFIGS["panda_reach"](name="panda_reach", episode_steps=20)
            cfg = RecordConfig(task=task, teleop="joy", teleop_topic="/pad", teleop_domain_id=223, episodes=1)
            record(cfg, tmp_path / "demos")
        finally:
            stop.set()
            thread.join(timeout=5)
    dataset = EpisodeDataset.open(tmp_path / "demos")
    (episode,) = dataset.load_all()
    assert len(episode.action) == 20 and episode.metadata["device"] == "joy"
    assert (episode.action[5:, 0] > 0.5).all()  # the stick's +x, from the first steps the messages arrived
