"""hardware.command=cartesian_pose: the robot env sends an ee_delta policy's equilibrium poses (PoseStamped, at the
policy rate, through the pose shield) to the twin's Cartesian impedance controller, over real DDS on loopback; no
joint command goes out. Peg insertion runs through it. Domain ids 160-164."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from helpers import TwinThread

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from robotrl.hardware.deploy import make_robot_env
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.ros2.bridge import make_bridge
from robotrl.hardware.ros2.msgs import Float64MultiArray, PoseStamped
from robotrl.hardware.sim_twin import ASSETS
from robotrl.tasks import deploy_spec_for
from robotrl.tasks.configs import ArmTaskConfig
from robotrl.tasks.panda_peg_insert import HOLE_HALF_WIDTH, INSERT_DEPTH, PegExpert

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

RATE = 250.0
POSE_TOPIC = "/cartesian_impedance_controller/equilibrium_pose"
BOX = {"workspace_min": [0.1, -0.6, 0.0], "workspace_max": [0.8, 0.6, 0.9]}


def impedance_hardware(domain_id: int) -> RobotEnvConfig:
    cfg = RobotEnvConfig(domain_id=domain_id, control_rate_hz=RATE, command="cartesian_pose", reset_timeout=15.0)
    cfg.shield = dict(BOX)
    return cfg


class Listener:
    """What a robot driver would hear: the poses and any joint command."""

    def __init__(self, domain_id: int):
        self.bridge = make_bridge("dds", domain_id=domain_id)
        self.poses = self.bridge.subscription(POSE_TOPIC, PoseStamped, "default")
        self.joint_commands = self.bridge.subscription("/forward_position_controller/commands", Float64MultiArray)

    def close(self) -> None:
        self.bridge.close()


def test_reach_moves_the_tool_through_equilibrium_poses_and_never_a_joint_command():
    """panda_reach's ee_delta actions become equilibria one step ahead of the measured tool: +x actions move the
    twin's tool along +x, the equilibrium leading it by at most the pose shield's lead (a compliant arm follows its
    spring: 6-7 mm per 40 ms step at the twin's 2000 N/m and the 3 cm lead, 2026-11-29); every pose heard lies in
    the box and steps no further than the shield's bound, and no joint command is ever published; a NaN action
    sends nothing."""
    spec = deploy_spec_for(ArmTaskConfig(name="panda_reach"))
    listener = Listener(160)
    with TwinThread(160):
        env = make_robot_env(impedance_hardware(160), spec, {"target": [0.5, 0.0, 0.3]})
        try:
            assert "pose" in env.topics and "commands" not in env.topics
            obs, _ = env.reset()
            start = obs["ee_pos"].copy()
            lead = env.cfg.pose_limits().max_lead
            for _ in range(5):
                obs, _, _, _, info = env.step(np.array([1.0, 0.0, 0.0]))
                assert info["stale_observation"] == 0 and info["pose/lead"] == 1  # a full step is further ahead
                assert np.linalg.norm(env.pose_shield.last[0].numpy() - obs["ee_pos"]) < lead + 0.01
            moved = obs["ee_pos"] - start
            assert moved[0] > 0.02 and abs(moved[1]) < 0.005 and abs(moved[2]) < 0.005, moved
            sent = env.stats["poses"]
            _, _, _, _, info = env.step(np.array([np.nan, 0.0, 0.0]))
            assert env.stats["poses"] == sent and info.get("pose/nan") == 1  # nothing sent: the controller holds
        finally:
            env.close()
    time.sleep(0.2)
    poses = [m.msg.pose for m in listener.poses.take()]
    listener_joint = listener.joint_commands.take()
    listener.close()
    assert len(poses) >= 5 and not listener_joint  # the steps' poses (one more at most, homing from home)
    limits = impedance_hardware(160).pose_limits()
    positions = np.array([[p.position.x, p.position.y, p.position.z] for p in poses])
    assert (positions >= np.array(limits.workspace_min) - 1e-9).all()
    assert (positions <= np.array(limits.workspace_max) + 1e-9).all()
    assert np.linalg.norm(np.diff(positions, axis=0), axis=1).max() <= limits.max_step + 1e-9
    quats = np.array([[p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z] for p in poses])
    np.testing.assert_allclose(np.linalg.norm(quats, axis=1), 1.0, atol=1e-9)


def test_peg_insertion_runs_on_the_twin_through_the_impedance_interface(tmp_path):
    """panda_peg_insert's expert, fed the robot env's observation (the held tip by kinematics), commands the twin's
    impedance controller through the pose shield: the peg goes into the hole (1 mm clearance), compliant where it
    touches the rim."""
    peg = ArmTaskConfig(name="panda_peg_insert")
    spec = deploy_spec_for(peg)
    hole = [0.5, 0.0, 0.04]
    with TwinThread(161, model=str(ASSETS / "panda_peg_insert.xml")) as twin:
        env = make_robot_env(impedance_hardware(161), spec, {"hole": hole})
        try:
            import mujoco

            tip_site = mujoco.mj_name2id(twin.model, mujoco.mjtObj.mjOBJ_SITE, "peg_tip")
            obs, _ = env.reset()
            expert = PegExpert(peg.max_ee_step, 1)
            for _ in range(100):
                state = {key: torch.as_tensor(obs[key]).unsqueeze(0) for key in PegExpert.reads}
                obs, *_ = env.step(expert.motion(state)[0].numpy())
                tip = twin.data.site_xpos[tip_site].copy()
                if hole[2] - tip[2] >= INSERT_DEPTH and np.linalg.norm(tip[:2] - hole[:2]) < HOLE_HALF_WIDTH:
                    break
            assert hole[2] - tip[2] >= INSERT_DEPTH, f"the peg's tip stopped at {tip.tolist()}"
            assert env.stats["poses"] > 0 and env.stats.get("commands", 0) == 0
        finally:
            env.close()


def test_an_estop_holds_the_tool_where_it_is_and_no_pose_goes_out_while_latched():
    spec = deploy_spec_for(ArmTaskConfig(name="panda_reach"))
    with TwinThread(162):
        env = make_robot_env(impedance_hardware(162), spec, {"target": [0.5, 0.0, 0.3]})
        try:
            env.reset()
            for _ in range(3):
                env.step(np.array([0.0, 1.0, 0.0]))
            sent = env.stats["poses"]
            env.estop(True)
            time.sleep(0.05)
            assert env.stats["poses"] == sent + 1  # the hold pose, once
            for _ in range(3):
                env.step(np.array([0.0, 1.0, 0.0]))
            assert env.stats["poses"] == sent + 1 and env.stats["poses_withheld"] == 3
        finally:
            env.close()


def test_impedance_settings_are_checked_by_name():
    spec = deploy_spec_for(ArmTaskConfig(name="panda_reach", control="joint_delta"))
    with pytest.raises(ValueError, match=r"cartesian_pose sends tool poses: it runs ee_delta policies"):
        make_robot_env(impedance_hardware(163), spec, {"target": [0.5, 0.0, 0.3]})
    with pytest.raises(ValueError, match=r"hardware\.command must be one of joint_position, cartesian_pose"):
        RobotEnvConfig(command="torque").validate()
    with pytest.raises(ValueError, match=r"give hardware\.shield\.workspace_min and workspace_max"):
        RobotEnvConfig(command="cartesian_pose").validate()
    with pytest.raises(ValueError, match=r"hardware\.pose_topic"):
        RobotEnvConfig(command="cartesian_pose", shield=dict(BOX), pose_topic="no spaces").validate()
