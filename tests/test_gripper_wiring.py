"""The gripper's ROS 2 action interfaces wired into the robot env and the twin: the robot env with
`hardware.gripper_interface=franka_action` and `gripper_command` closes and opens the twin's fingers (measured in
its MuJoCo data) through actions served by the twin (`gripper_actions=true`); a NaN or out-of-range gripper
command never reaches the action client (the shield drops or clamps it); an e-stop during a closing goal cancels
it, the fingers stop short, and nothing is sent until the shield restarts; without a gripper server the client
reports the deadline and holds while the arm keeps moving. Real Cyclone DDS on loopback, the real twin on a
thread; each test has its own ROS 2 domain id (179, 180, 213, 230), which no other test uses."""

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import mujoco
import numpy as np
import pytest
import yaml
from helpers import REPO, wait_until

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from robotrl.hardware.gripper_actions import GripperActionSettings
from robotrl.hardware.robot_env import RobotEnv, RobotEnvConfig
from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

RATE = 250.0  # twin and shield, as tests/test_robot_env.py runs them on a busy 2-core machine
HOLD_AFTER = 5 / RATE  # the in-process twin's states can come 5-6 ms apart under load (test_robot_env.py)
WORKSPACE = {"workspace_min": [0.1, -0.6, 0.05], "workspace_max": [0.8, 0.6, 0.9]}
OPEN, CLOSE = -1.0, 1.0  # the policy's gripper action: -1 open (0.04 m per finger), +1 closed (0.0)
HARDWARE_CONFIGS = sorted((REPO / "configs" / "hardware").glob("*.yaml"))


@contextmanager
def twin_running(domain_id: int, gripper_actions: bool = True):
    cfg = SimTwinConfig(rate_hz=RATE, domain_id=domain_id, report_interval=0, gripper_actions=gripper_actions)
    twin = SimTwin(cfg)
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    try:
        yield twin
    finally:
        twin.stop()
        thread.join(timeout=5)
        twin.close()


def _env(domain_id: int, interface: str, **settings) -> RobotEnv:
    cfg = RobotEnvConfig(
        domain_id=domain_id,
        control_rate_hz=RATE,
        connect_timeout=5.0,
        reset_timeout=10.0,
        gripper_interface=interface,
        gripper_actions=GripperActionSettings(**settings),
    )
    cfg.shield = {**WORKSPACE, "hold_after": HOLD_AFTER}
    return RobotEnv(cfg, control="joint_delta", gripper_action=True)


def _fingers(twin: SimTwin) -> float:
    """The opening of the twin's first finger in its MuJoCo data, metres."""
    joint = mujoco.mj_name2id(twin.model, mujoco.mjtObj.mjOBJ_JOINT, "finger_joint1")
    return float(twin.data.qpos[twin.model.jnt_qposadr[joint]])


def _action(gripper: float, arm: float = 0.0) -> np.ndarray:
    return np.array([arm, 0, 0, 0, 0, 0, 0, gripper], np.float32)


def _step_until(env: RobotEnv, action: np.ndarray, condition, timeout: float = 4.0) -> list[dict]:
    infos, deadline = [], time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, (env.link.gripper_stats, infos[-3:])
        infos.append(env.step(action)[4])
    return infos


def _record_setpoints(env: RobotEnv) -> list[float]:
    """Every setpoint the link gives the gripper's action client."""
    client, given = env.link.gripper_actions, []
    send = client.send

    def recording(setpoint):
        given.append(float(setpoint))
        send(setpoint)

    client.send = recording
    return given


@pytest.mark.dds
@pytest.mark.parametrize(("interface", "domain_id"), [("franka_action", 213), ("gripper_command", 230)])
def test_the_robot_env_closes_and_opens_the_twins_fingers_through_actions(interface, domain_id):
    with twin_running(domain_id) as twin:
        env = _env(domain_id, interface)
        try:
            given = _record_setpoints(env)
            env.reset()
            assert "gripper" not in env.topics  # no gripper topic: the action client instead
            _step_until(env, _action(CLOSE), lambda: _fingers(twin) < 0.003)
            _step_until(env, _action(OPEN), lambda: _fingers(twin) > 0.037)
            assert wait_until(lambda: env.link.gripper_stats["state"] == "idle", timeout=3.0)
            stats = env.link.gripper_stats
            # reset opens the fingers through the action too, then the policy closes and opens them
            assert (stats["goals_sent"], stats["succeeded"], stats["failed"], stats["holds"]) == (3, 3, 0, 0), stats
            assert given == [0.04, 0.0, 0.04]
            twin_stats = twin.stats()
            assert twin_stats["accepted"]["gripper_action"] >= 3 and "gripper" not in twin_stats["accepted"]
            assert env.stats["gripper_goals_sent"] == 3 and env.stats["gripper_succeeded"] == 3

            # a NaN gripper command never reaches the client: the shield drops it, the fingers stay open
            infos = [env.step(_action(math.nan))[4] for _ in range(5)]
            assert sum(info.get("safety/gripper_nan", 0) for info in infos) > 0
            # one beyond the gripper's range (a policy's command past the env's clip) is clamped by the shield
            env.link.post(env.link.setpoint, gripper=-0.5)
            assert wait_until(lambda: len(given) == 4, timeout=2.0)
            assert given[-1] == 0.0 and all(0.0 <= g <= 0.04 for g in given), given
            assert sum(env.link.take_info().get(key, 0) for key in ("safety/gripper_limit",)) > 0
            assert wait_until(lambda: _fingers(twin) < 0.003, timeout=3.0)
            assert wait_until(lambda: env.link.gripper_stats["succeeded"] == 4, timeout=3.0)
            assert env.stats["gripper_errors"] == 0 and env.link.gripper_stats["failed"] == 0
        finally:
            env.close()
        assert env.link.gripper_stats["state"] == "closed"  # closed with the link, before its bridge


@pytest.mark.dds
def test_an_estop_cancels_a_closing_goal_and_nothing_is_sent_until_restart():
    with twin_running(180) as twin:
        env = _env(180, "franka_action")
        try:
            env.reset()  # which opens the fingers through the action (they start open): one goal, done
            assert wait_until(lambda: env.link.gripper_stats["succeeded"] == 1, timeout=3.0)
            assert _fingers(twin) > 0.037
            # closing (the first step after the wait comes late and is not sent): the moment the twin's server
            # starts the grasp, the e-stop is pressed
            _step_until(env, _action(CLOSE), lambda: twin.stats()["accepted"].get("gripper_action", 0) >= 2)
            env.estop(True)
            assert wait_until(lambda: env.link.gripper_stats["canceled"] == 1, timeout=3.0), env.link.gripper_stats
            time.sleep(0.2)  # the cancel took effect: the fingers rest where they stopped
            stopped = _fingers(twin)
            assert stopped > 0.004  # short of closed (a whole close takes ~0.4 s)
            for gripper in (OPEN, CLOSE, OPEN, CLOSE):  # commands during the e-stop: nothing goes out
                info = env.step(_action(gripper))[4]
                assert info["shield_latched"] == 1
            time.sleep(0.3)  # longer than the rest of the close would have taken
            assert abs(_fingers(twin) - stopped) < 0.001
            stats = env.link.gripper_stats
            assert (stats["goals_sent"], stats["cancels"], stats["canceled"], stats["failed"]) == (2, 1, 1, 0), stats
            assert env.stats["gripper_cancels"] == 1 and env.stats["gripper_canceled"] == 1

            env.estop(False)  # released, acknowledged, reset: the shield restarts and goals go out again
            env.acknowledge_estop()
            env.reset()
            _step_until(env, _action(OPEN), lambda: _fingers(twin) > 0.037)
            assert env.link.gripper_stats["goals_sent"] >= 3
        finally:
            env.close()


@pytest.mark.dds
def test_without_a_gripper_server_the_client_reports_the_deadline_and_holds_while_the_arm_moves():
    with twin_running(179, gripper_actions=False) as twin:
        env = _env(179, "franka_action", accept_timeout=0.3, probe_interval=0.3)
        try:
            obs, reset_info = env.reset()
            start = float(obs["arm_qpos"][0])
            infos = [
                reset_info,
                *_step_until(env, _action(CLOSE, arm=0.5), lambda: env.link.gripper_stats["state"] == "holding"),
            ]
            for gripper in (OPEN, CLOSE) * 10:  # new setpoints while held are not sent
                obs, _, _, _, info = env.step(_action(gripper, arm=0.5))
                infos.append(info)
            stats = env.link.gripper_stats
            assert stats["state"] == "holding" and "deadline of 0.3 s" in stats["last_error"], stats
            assert (stats["goals_sent"], stats["accept_timeouts"], stats["holds"]) == (1, 1, 1), stats
            # reported once, in the step during which it passed (or in the reset: its goal opens the fingers)
            assert sum(info.get("gripper/accept_timeouts", 0) for info in infos) == 1
            assert env.stats["gripper_holds"] == 1 and env.stats["gripper_accept_timeouts"] == 1
            assert float(obs["arm_qpos"][0]) > start + 0.3  # the arm kept working meanwhile
            assert _fingers(twin) > 0.037  # nothing moved the fingers
        finally:
            env.close()


def test_gripper_settings_are_checked_by_key_and_every_hardware_config_lists_them():
    with pytest.raises(ValueError, match=r"hardware.gripper_interface must be one of topic, franka_action, "):
        RobotEnvConfig(gripper_interface="franka").validate()
    with pytest.raises(ValueError, match=r"hardware.gripper_interface=franka_action .* hardware.backend is 'rclpy'"):
        RobotEnvConfig(gripper_interface="franka_action", backend="rclpy").validate()
    with pytest.raises(ValueError, match=r"hardware.gripper_actions.accept_timeout must be > 0, got -1"):
        RobotEnvConfig(gripper_actions=GripperActionSettings(accept_timeout=-1)).validate()
    with pytest.raises(ValueError, match=r"hardware.gripper_actions.action_namespace: .*'bad ns'"):
        RobotEnvConfig(gripper_actions=GripperActionSettings(action_namespace="bad ns")).validate()
    with pytest.raises(ValueError, match=r"hardware.gripper_controller is empty"):
        RobotEnvConfig(gripper_interface="gripper_command", gripper_controller="").validate()
    cfg = RobotEnvConfig(gripper_interface="gripper_command", gripper_actions=GripperActionSettings(max_effort=5.0))
    cfg.validate()
    action_config = cfg.gripper_action_config()
    assert (action_config.interface, action_config.max_effort) == ("gripper_command", 5.0)
    with pytest.raises(ValueError, match=r"gripper_actions=true .* backend is 'rclpy'"):
        SimTwinConfig(gripper_actions=True, backend="rclpy").validate()
    with pytest.raises(ValueError, match="robot 'hand4' has no gripper"):
        SimTwin(SimTwinConfig(robot="hand4", gripper_actions=True))

    keys = {f.name for f in fields(RobotEnvConfig)}
    settings = {f.name for f in fields(GripperActionSettings)}
    assert [Path(p).name for p in HARDWARE_CONFIGS] == ["hand_twin.yaml", "panda.yaml", "sim_twin.yaml"]
    for path in HARDWARE_CONFIGS:
        values = yaml.safe_load(path.read_text())
        assert set(values) == keys, (path.name, sorted(set(values) ^ keys))
        assert set(values["gripper_actions"]) == settings, (
            path.name,
            sorted(set(values["gripper_actions"]) ^ settings),
        )
        assert values["gripper_interface"] == "topic"  # the robot's own driver unchanged until a lab switches it
