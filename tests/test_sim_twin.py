"""The simulated twin (hardware/sim_twin.py) on real MuJoCo and real Cyclone DDS over loopback: joint states,
forward position commands, joint trajectories, malformed commands, and the robotrl-sim-twin command line in
a process of its own. Each test has its own ROS 2 domain id, so tests never hear each other."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from helpers import run_module, wait_until
from robotrl.hardware.ros2 import make_bridge
from robotrl.hardware.ros2.msgs import (
    Duration,
    Float64MultiArray,
    Image,
    JointState,
    JointTrajectory,
    JointTrajectoryPoint,
)
from robotrl.hardware.ros2.tensors import time_msg, time_seconds
from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

from robotrl.core.robot_spec import load_robot_spec

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
SPEC = load_robot_spec("panda")
HOME = SPEC.home.double().numpy()
NAMES = [*SPEC.joints, *SPEC.gripper.joints]


@contextmanager
def running_twin(domain_id: int, rate_hz: float = 100.0):
    """A twin running on a thread, and a client bridge on the same domain (as a policy process would have)."""
    twin = SimTwin(SimTwinConfig(rate_hz=rate_hz, domain_id=domain_id, report_interval=0))
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    client = make_bridge("dds", domain_id=domain_id)
    try:
        yield twin, client
    finally:
        twin.stop()
        thread.join(timeout=5.0)
        client.close()
        twin.close()
    assert not thread.is_alive()


def states_of(client, depth: int = 1000):
    from robotrl.hardware.ros2 import QoSProfile

    subscription = client.subscription("/joint_states", JointState, QoSProfile(depth=depth))
    assert wait_until(lambda: subscription.latest() is not None), "no joint state arrived"
    return subscription


def arm_position(subscription) -> np.ndarray:
    msg = subscription.latest().msg
    index = {name: i for i, name in enumerate(msg.name)}
    return np.array([msg.position[index[name]] for name in SPEC.joints])


def command_publisher(client, topic: str, msg_type):
    publisher = client.publisher(topic, msg_type)
    assert wait_until(lambda: publisher.subscription_count() >= 1), f"the twin did not subscribe to {topic}"
    return publisher


def test_joint_states_have_names_fields_stamps_and_rate():
    with running_twin(domain_id=171, rate_hz=100.0) as (twin, client):
        subscription = states_of(client)
        subscription.take()
        time.sleep(1.0)
        received = subscription.take()
        stats = twin.stats()
    assert 60 <= len(received) <= 105, f"{len(received)} joint states in 1 s at 100 Hz"
    for r in received:
        msg = r.msg
        assert list(msg.name) == NAMES
        assert len(msg.position) == len(msg.velocity) == len(msg.effort) == len(NAMES)
        assert all(math.isfinite(v) for v in (*msg.position, *msg.velocity, *msg.effort))
    stamps = np.array([time_seconds(r.msg.header.stamp) for r in received])
    assert np.all(np.diff(stamps) > 0) and abs(stamps[-1] - time.time()) < 1.0
    assert 0.005 < float(np.median(np.diff(stamps))) < 0.015  # 10 ms apart
    np.testing.assert_allclose(arm_position(subscription), HOME, atol=0.01)  # at rest in the home pose
    assert stats["periods"] >= 100 and stats["missed_frac"] < 0.2
    assert stats["period_mean_ms"] == pytest.approx(10.0, rel=0.2)


def test_a_command_moves_the_arm_to_its_target():
    with running_twin(domain_id=172) as (twin, client):
        subscription = states_of(client)
        publisher = command_publisher(client, "/forward_position_controller/commands", Float64MultiArray)
        target = HOME + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])
        publisher.publish(Float64MultiArray(data=target.tolist()))
        assert wait_until(lambda: np.abs(arm_position(subscription) - target).max() < 0.02, timeout=5.0), (
            f"arm at {arm_position(subscription)}, commanded {target}"
        )
        # Out of the model's range: clamped to it and counted, not refused.
        beyond = target.copy()
        beyond[0] = 10.0
        publisher.publish(Float64MultiArray(data=beyond.tolist()))
        assert wait_until(lambda: twin.setpoint[0] == twin.upper[0])
        assert twin.upper[0] == pytest.approx(2.8973)
        assert twin.stats()["clamped"] == 1 and twin.stats()["accepted"]["commands"] == 2


def test_a_joint_trajectory_is_followed_in_time():
    with running_twin(domain_id=173) as (twin, client):
        subscription = states_of(client)
        publisher = command_publisher(client, "/joint_trajectory_controller/joint_trajectory", JointTrajectory)
        a = HOME + np.array([0.4, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0])
        c = HOME + np.array([-0.2, 0.2, 0.0, 0.3, 0.0, 0.0, 0.0])
        names = list(reversed(SPEC.joints))  # matched by name, not by order

        def point(positions, seconds):
            return JointTrajectoryPoint(
                positions=positions[::-1].tolist(),
                time_from_start=Duration(sec=int(seconds), nanosec=round(seconds % 1 * 1e9)),
            )

        # Starting 0.2 s from now (header.stamp): reach a by 0.6 s, hold it until 1.2 s, then go to c by 1.8 s.
        subscription.take()
        start = time.time() + 0.2
        trajectory = JointTrajectory(joint_names=names, points=[point(a, 0.6), point(a, 1.2), point(c, 1.8)])
        trajectory.header.stamp = time_msg(start)
        publisher.publish(trajectory)
        time.sleep(2.6)
        states = [r.msg for r in subscription.take()]
    stamps = np.array([time_seconds(m.header.stamp) - start for m in states])
    positions = np.array([[m.position[m.name.index(n)] for n in SPEC.joints] for m in states])

    def at(seconds: float) -> np.ndarray:
        return positions[int(np.argmin(np.abs(stamps - seconds)))]

    np.testing.assert_allclose(at(-0.05), HOME, atol=0.005)  # nothing moves before the stamp
    early = at(0.2)
    assert 0.02 < early[0] - HOME[0] < 0.3, f"joint1 at 0.2 s: {early[0] - HOME[0]:+.3f} from home (no jump to a)"
    np.testing.assert_allclose(at(1.15), a, atol=0.02)  # the held middle point
    np.testing.assert_allclose(positions[-1], c, atol=0.02)  # the end
    assert twin.stats()["accepted"]["joint_trajectory"] == 1


def test_malformed_commands_are_rejected_counted_and_never_applied():
    with running_twin(domain_id=174) as (twin, client):
        subscription = states_of(client)
        forward = command_publisher(client, "/forward_position_controller/commands", Float64MultiArray)
        trajectories = command_publisher(client, "/joint_trajectory_controller/joint_trajectory", JointTrajectory)
        joints = list(SPEC.joints)
        good = (HOME + 0.1).tolist()

        forward.publish(Float64MultiArray(data=[0.1, 0.2, 0.3]))  # wrong length
        forward.publish(Float64MultiArray(data=[*good[:6], math.nan]))  # NaN
        forward.publish(Float64MultiArray(data=[math.inf, *good[1:]]))  # inf
        forward.publish(Float64MultiArray(data=[]))  # empty

        def trajectory(names, *points):
            return JointTrajectory(
                joint_names=names,
                points=[JointTrajectoryPoint(positions=p, time_from_start=Duration(sec=s)) for p, s in points],
            )

        trajectories.publish(trajectory([*joints[:6], "elbow"], (good, 1)))  # unknown joint name
        trajectories.publish(trajectory([*joints[:6], joints[0]], (good, 1)))  # a name twice
        trajectories.publish(trajectory(joints, (good[:5], 1)))  # a point of the wrong length
        trajectories.publish(trajectory(joints, (good, 2), (good, 1)))  # time goes back
        trajectories.publish(trajectory(joints))  # no points
        trajectories.publish(trajectory(joints, ([math.nan] * 7, 1)))  # NaN position

        expected = {"wrong_length": 3, "non_finite": 3, "unknown_joint": 2, "bad_trajectory": 2}
        assert wait_until(lambda: twin.stats()["rejected"] == expected), twin.stats()["rejected"]
        time.sleep(0.2)
        np.testing.assert_array_equal(twin.setpoint, HOME)  # nothing was applied
        np.testing.assert_allclose(arm_position(subscription), HOME, atol=0.01)
        assert twin.stats()["accepted"] == {}

        forward.publish(Float64MultiArray(data=good))  # the twin still takes a good command
        assert wait_until(lambda: np.abs(arm_position(subscription) - np.array(good)).max() < 0.02, timeout=5.0)
        assert twin.stats()["clamped"] == 0


@pytest.mark.parametrize("catch_up", [0, 10])
def test_pacing_catches_up_or_counts_missed_periods_and_does_not_drift(catch_up):
    """An overrun's passed deadlines are simulated at once without a state published (the physics stays on the
    wall clock), up to max_catch_up_periods; those beyond it are missed."""
    twin = SimTwin(SimTwinConfig(rate_hz=100.0, domain_id=177, report_interval=0, max_catch_up_periods=catch_up))
    step, calls, returned = twin.step, [], []

    def slow_step() -> None:
        calls.append(time.monotonic())
        step()
        if len(calls) == 10:
            time.sleep(0.035)  # the 10th period (deadline 9) overruns by at least 3.5 periods
            returned.append(time.monotonic())

    twin.step = slow_step
    try:
        stats = twin.run(0.5)
    finally:
        twin.close()
    # Deadlines that passed more than a period before the loop got back are missed; the next one is served at
    # once (its deadline is at most a period old), and the loop is back on its original grid (start + k *
    # period) after that. Times are read from the clock, not assumed from the sleep: a loaded machine
    # oversleeps.
    start = calls[0]
    back = (returned[0] - start) / 0.01  # in periods
    passed = stats["caught_up"] + stats["missed"]  # deadlines the loop was a period or more late for
    assert stats["periods"] + stats["missed"] == 50 and passed >= int(back - 1) - 9 >= 2
    if catch_up:  # simulated, not published: the calls (one state each) stay one per served deadline
        assert stats["missed"] == 0 and stats["caught_up"] == passed and len(calls) == 50 - passed
    else:
        assert stats["caught_up"] == 0
    after = [(t - start) / 0.01 for t in calls[10:]]  # period indices of the calls after the overrun
    assert after[0] == pytest.approx(back, abs=0.3)
    # On the grid, lateness (time past the period's deadline) does not grow: a loop that slept a period after
    # each step would fall behind by its step time every period. A busy machine adds lateness, not a trend.
    lateness = [x - math.floor(x) for x in after[3:]]
    early, late = sorted(lateness[:10])[5], sorted(lateness[-10:])[5]
    assert late - early < 0.2, after


def test_trajectory_with_velocities_is_cubic():
    from robotrl.hardware.sim_twin import _Trajectory

    trajectory = _Trajectory(
        joints=np.array([0]),
        start=100.0,
        times=np.array([0.0, 1.0]),
        positions=np.array([[0.0], [1.0]]),
        velocities=np.array([[0.0], [0.0]]),
        from_setpoint=True,
    )
    for t, expected in ((99.0, 0.0), (100.25, 0.15625), (100.5, 0.5), (100.75, 0.84375), (102.0, 1.0)):
        assert trajectory.sample(t)[0] == pytest.approx(expected)  # smoothstep: zero velocity at both ends


def test_command_line_runs_for_its_duration_with_a_camera_in_another_process():
    domain_id = 175
    client = make_bridge("dds", domain_id=domain_id)
    try:
        states = client.subscription("/joint_states", JointState)
        images = client.subscription("/camera/front/image_raw", Image, "sensor_data")
        env = dict(os.environ, OMP_NUM_THREADS="1", MUJOCO_GL="egl")
        command = [
            sys.executable,
            "-m",
            "robotrl.hardware.sim_twin",
            "robot=panda",
            "rate_hz=100",
            "duration=3",
            f"domain_id={domain_id}",
            "cameras=[front]",
            "camera_rate_hz=5",
            "camera_width=64",
            "camera_height=48",
        ]
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            out, _ = process.communicate(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 0, out[-3000:]
        assert wait_until(lambda: images.latest() is not None, timeout=2.0)
    finally:
        received_state, received_image = states.latest(), images.latest()
        client.close()
    assert list(received_state.msg.name) == NAMES
    image = received_image.msg
    assert (image.width, image.height, image.encoding, image.step) == (64, 48, "rgb8", 64 * 3)
    assert len(image.data) == 64 * 48 * 3 and len(set(image.data)) > 1  # a rendered picture, not a blank
    stats = json.loads(out.strip().splitlines()[-1])["sim_twin"]
    assert 250 <= stats["periods"] + stats["missed"] <= 301 and stats["images"] >= 5


def test_latency_holds_a_command_whole_physics_steps_and_states_carry_noise(monkeypatch):
    """latency_ms=10 at 500 Hz (one 2 ms physics step a period): a command is in force exactly 5 steps after the
    twin took it. Published joint states carry the offset drawn at start-up and per-message noise of their set
    sizes, and a fifth of them are lost (counted, not sent)."""
    cfg = SimTwinConfig(rate_hz=500.0, domain_id=178, report_interval=0, latency_ms=10.0, joint_pos_bias=0.01)
    cfg.joint_pos_noise, cfg.state_drop_prob, cfg.noise_seed = 0.001, 0.2, 3
    twin = SimTwin(cfg)
    try:
        assert twin.latency_steps == 5
        sent, truth = [], []
        real = twin.joint_states.publish
        monkeypatch.setattr(
            twin.joint_states,
            "publish",
            lambda msg: (
                sent.append(np.array(msg.position)),
                truth.append(twin.data.qpos[twin._qpos].copy()),
                real(msg),
            ),
        )
        target = HOME + 0.2
        twin._on_forward(Float64MultiArray(data=target.tolist()))
        in_force = []
        for _ in range(8):
            twin.step()
            in_force.append(twin.data.ctrl[twin._actuators].copy())
        assert [bool(np.allclose(c, HOME)) for c in in_force] == [True] * 5 + [False] * 3
        np.testing.assert_allclose(in_force[5], target)
        for _ in range(992):
            twin.step()
        assert 150 < twin.states_lost < 250 and len(sent) == 1000 - twin.states_lost
        error = np.stack(sent) - np.stack(truth)
        offset = error.mean(0)  # one offset per joint for the whole session
        np.testing.assert_allclose(offset, twin._sensors.bias, atol=3e-4)
        assert 0.003 < np.abs(offset).max() < 0.04
        assert 0.0008 < (error - offset).std() < 0.0012
    finally:
        twin.close()


def test_a_placed_object_rests_where_and_as_it_was_put():
    """place_object puts a free body at a position, turned as given (normalised) or as it was; a bad orientation is
    refused naming it. A person resetting the scene sets the cube down as the task starts it, not as it fell."""
    from robotrl.tasks.arm_task import ASSETS

    twin = SimTwin(
        SimTwinConfig(model=str(ASSETS / "panda_pick_cube.xml"), objects=["cube"], domain_id=153, report_interval=0)
    )
    try:
        address = twin.model.jnt_qposadr[twin._free_joint("cube")]
        turned = [math.cos(0.15), 0.0, 0.0, math.sin(0.15)]
        twin.place_object("cube", [0.5, 0.1, 0.02], [2 * q for q in turned])
        twin.step()
        np.testing.assert_allclose(twin.data.qpos[address : address + 3], [0.5, 0.1, 0.02], atol=1e-3)
        np.testing.assert_allclose(twin.data.qpos[address + 3 : address + 7], turned, atol=1e-3)
        twin.place_object("cube", [0.45, -0.1, 0.02])  # no orientation: kept
        twin.step()
        np.testing.assert_allclose(twin.data.qpos[address + 3 : address + 7], turned, atol=1e-3)
        for bad in ([0.0, 0.0, 0.0, 0.0], [1.0, float("nan"), 0.0, 0.0], [1.0, 0.0, 0.0]):
            with pytest.raises(ValueError, match=r"place_object: 'cube' needs a finite, non-zero \[w, x, y, z\]"):
                twin.place_object("cube", [0.5, 0.0, 0.02], bad)
    finally:
        twin.close()


def test_command_line_refuses_a_bad_setting_by_name():
    for override, complaint in (
        ("rate=5", "rate"),
        ("rate_hz=-1", "rate_hz must be a finite number > 0"),
        ("latency_ms=5000", "latency_ms must be within [0, 1000] (the twin's command buffer)"),
        ("state_drop_prob=1", "state_drop_prob must be in [0, 1)"),
    ):
        result = run_module("robotrl.hardware.sim_twin", override, "domain_id=176", check=False)
        assert result.returncode != 0 and complaint in result.stderr + result.stdout, result.stderr[-2000:]
