"""robotrl-deploy end to end: a run directory (config + checkpoint of a panda_reach policy) deployed through
the real entry point (Hydra, a process of its own) against the simulated twin over DDS on loopback, with the
session recorded to a rosbag2 MCAP bag that rosbags reads back; the e-stop as the robot env hears it, and a
task's relative_frame carried to the robot env; a push policy deployed with the puck tracked on the twin.
Domain ids 186-189, 208, 209, 212, 216; peg_insert's held peg tip by forward kinematics, inserting on the twin.
"""

import json
import re
import threading
import time

import numpy as np
import pytest
import torch
from helpers import run_module, untrained_run, wait_until

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
pytest.importorskip("rosbags", reason='needs the ros extra: pip install "robotrl[ros]"')

from robotrl.hardware.deploy import BagRecorder, DeployConfig, make_robot_env, run
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.ros2 import make_bridge
from robotrl.hardware.ros2.msgs import Bool
from robotrl.hardware.ros2.qos import DEFAULT, LATCHED
from robotrl.hardware.sim_twin import ASSETS, SimTwin, SimTwinConfig
from robotrl.tasks import deploy_spec_for

from robotrl.config import register_configs
from robotrl.core.robot_spec import load_robot_spec

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

register_configs()
RATE = 250.0
SPEC = load_robot_spec("panda")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """An untrained SAC policy for panda_reach from joint states and goals."""
    overrides = ["task=panda_reach", "agent.actor_hidden=[32,32]", "agent.critic_hidden=[32,32]"]
    return untrained_run(tmp_path_factory.mktemp("run"), overrides)


@pytest.fixture
def twin():
    twin = SimTwin(SimTwinConfig(rate_hz=RATE, domain_id=186, report_interval=0))
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    yield twin
    twin.stop()
    thread.join(timeout=5)
    twin.close()


def test_deploy_runs_the_policy_through_the_shield_and_records_an_mcap_bag(run_dir, twin, tmp_path):
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    operator = make_bridge("dds", domain_id=186)
    estop = operator.publisher("/estop", Bool, LATCHED)
    estop.publish(Bool(data=False))  # released, once, before deployment starts: transient-local delivers it late
    bag = tmp_path / "session"
    try:
        proc = run_module(
            "robotrl.hardware.deploy",
            f"run={run_dir}",
            "hardware=sim_twin",
            "hardware.domain_id=186",
            f"hardware.control_rate_hz={RATE}",
            "episodes=2",
            "episode_steps=15",
            "+goal.target=[0.5,0.1,0.3]",
            f"record={bag}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            timeout=120,
        )
    finally:
        operator.close()
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["deploy"]
    assert summary["episodes"] == 2 and summary["steps"] == 30 and summary["control"] == "ee_delta"
    assert summary["checkpoint"] == "step_000000100" and summary["policy_errors"] == 0
    assert summary["commands"] > 100 and summary.get("stale_observations", 0) == 0
    assert summary["observation_age_ms"]["p50"] < 50
    assert isinstance(summary["shield_corrections"], dict)
    watchdog = summary["watchdog"]
    assert watchdog["joint_state_period_ms"] < watchdog["hold_after_ms"] / 1.5  # the check at reset
    assert watchdog["oldest_state_tracked_ms"] <= watchdog["hold_after_ms"]
    assert twin.accepted["commands"] > 100 and sum(twin.rejected.values()) == 0

    messages = summary["record"]["messages"]
    mcap = list(bag.glob("*.mcap"))
    assert len(mcap) == 1 and (bag / "metadata.yaml").exists()
    counts: dict[str, int] = {}
    commands, names = [], set()
    with AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as reader:
        types = {c.topic: c.msgtype for c in reader.connections}
        assert {t: v for t, v in types.items() if not t.startswith("/robotrl/")} == {
            "/joint_states": "sensor_msgs/msg/JointState",
            "/forward_position_controller/commands": "std_msgs/msg/Float64MultiArray",
            "/gripper_controller/commands": "std_msgs/msg/Float64MultiArray",
            "/estop": "std_msgs/msg/Bool",
            "/estop_ack": "std_msgs/msg/Bool",  # recorded, though nobody acknowledged anything here
            "/scene/reset": "std_msgs/msg/Bool",  # recorded, though reach tracks no object to put back
        }
        for connection, _, raw in reader.messages():
            counts[connection.topic] = counts.get(connection.topic, 0) + 1
            msg = reader.deserialize(raw, connection.msgtype)
            if connection.topic == "/joint_states":
                names.add(tuple(msg.name))
                assert len(msg.position) == 9 and np.isfinite(msg.position).all()
            elif connection.topic == "/forward_position_controller/commands":
                commands.append(np.asarray(msg.data))
            elif connection.topic == "/estop":
                assert msg.data is False
    assert counts == {topic: n for topic, n in messages.items() if n}
    assert counts["/joint_states"] > 200 and counts["/estop"] >= 1
    assert names == {(*SPEC.joints, *SPEC.gripper.joints)}
    commands = np.stack(commands)
    assert len(commands) == summary["commands"] and commands.shape[1] == 7
    lower, upper = SPEC.position_lower.double().numpy(), SPEC.position_upper.double().numpy()
    assert np.isfinite(commands).all() and (commands >= lower).all() and (commands <= upper).all()


def test_deploy_refuses_a_policy_whose_observations_the_robot_cannot_give(run_dir):
    from robotrl.hardware.deploy import load_policy

    _, spec, _ = load_policy(run_dir)
    assert spec.control == "ee_delta" and set(spec.observations) >= {"arm_qpos", "target", "to_target"}
    cfg = DeployConfig(run=str(run_dir), hardware=RobotEnvConfig(domain_id=187))
    # reach's target is not measured: given (+goal.target) it is fixed, else drawn each episode as in training
    env = make_robot_env(cfg.hardware, spec, cfg.goal)
    try:
        assert env.drawn_goals == ["target"] and env.relative_goal == {"to_target": "target"}
    finally:
        env.close()
    env = make_robot_env(cfg.hardware, spec, {"target": [0.5, 0.0, 0.3]})
    try:
        assert env.drawn_goals == [] and env.goal["target"].tolist() == pytest.approx([0.5, 0.0, 0.3])
    finally:
        env.close()
    with pytest.raises(FileNotFoundError, match="not a robotrl run directory"):
        load_policy(run_dir / "nope")
    proc = run_module("robotrl.hardware.deploy", f"run={run_dir}", "hardware.on_stale=maybe", check=False, timeout=60)
    assert proc.returncode != 0 and "hardware.on_stale must be one of hold, raise" in proc.stderr


def test_deploy_runs_a_frame_stacked_pixel_policy_on_the_twins_camera(tmp_path):
    """DrQ-v2 from the front camera alone (3 stacked 64 px frames, no joint state): the robot env stacks the
    twin's camera frames as the simulated FrameStack does and observes nothing the policy does not read."""
    from robotrl.hardware.deploy import load_policy

    run = tmp_path / "pixels"
    run.mkdir()
    overrides = ["task=panda_reach", "task.obs=pixels", "task.cameras=[front]", "task.image_size=64"]
    untrained_run(run, [*overrides, "agent=drqv2_light"])
    _, spec, _ = load_policy(run)
    assert spec.frame_stack == 3 and set(spec.observations) == {"pixels_front"} and spec.cameras == ("front",)
    assert spec.observations["pixels_front"].shape == (9, 64, 64)
    config = SimTwinConfig(rate_hz=RATE, domain_id=197, report_interval=0, cameras=["front"], camera_rate_hz=20.0)
    twin = SimTwin(config)
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    try:
        proc = run_module(
            "robotrl.hardware.deploy",
            f"run={run}",
            "hardware=sim_twin",
            "hardware.cameras=[front]",
            "hardware.domain_id=197",
            f"hardware.control_rate_hz={RATE}",
            "hardware.max_image_age=0.5",
            "episodes=1",
            "episode_steps=20",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            timeout=120,
        )
    finally:
        twin.stop()
        thread.join(timeout=5)
        twin.close()
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["deploy"]
    assert summary["steps"] == 20 and summary["policy_errors"] == 0
    assert summary.get("stale_observations", 0) == 0 and summary["commands"] > 50


def test_the_bag_records_each_estop_message_once_from_latched_and_default_qos_publishers(tmp_path):
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with make_bridge("dds", domain_id=208) as operator, make_bridge("dds", domain_id=208) as bridge:
        latched = operator.publisher("/estop", Bool, LATCHED)
        latched.publish(Bool(data=True))  # before recording starts: the latched reader still hears it
        recorder = BagRecorder(bridge, tmp_path / "bag", {}, estop_topic="/estop")
        volatile = operator.publisher("/estop", Bool, DEFAULT)  # `ros2 topic pub /estop std_msgs/msg/Bool ...`
        assert wait_until(lambda: latched.subscription_count() == 2 and volatile.subscription_count() == 1)
        assert wait_until(lambda: recorder.counts["/estop"] == 1)
        for count, (publisher, value) in enumerate(
            ((latched, False), (volatile, True), (volatile, False), (latched, True)), start=2
        ):
            publisher.publish(Bool(data=value))
            assert wait_until(lambda count=count: recorder.counts["/estop"] >= count)  # in order across publishers
        time.sleep(0.3)  # a duplicate from the second reader would have arrived by now
        recorder.close()
    with AnyReader([tmp_path / "bag"], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as reader:
        values = [reader.deserialize(raw, c.msgtype).data for c, _, raw in reader.messages()]
    assert values == [True, False, True, False, True]


def test_a_relative_frame_task_deploys_with_relative_frame_actions():
    """A policy trained with task.relative_frame=true thinks in the tool's start frame: the robot env must too
    (at the Panda's home pose the frame is ~180 deg about x, so otherwise y and z would be mirrored)."""

    from robotrl.tasks import TASK_CONFIGS

    for relative_frame in (True, False):
        task = TASK_CONFIGS["panda_reach"](name="panda_reach", relative_frame=relative_frame)
        spec = deploy_spec_for(task)
        assert spec.relative_frame is relative_frame and spec.control == "ee_delta"
        env = make_robot_env(RobotEnvConfig(domain_id=209), spec, {"target": [0.5, 0.0, 0.3]})
        try:
            assert env.relative_frame is relative_frame
        finally:
            env.close()


def test_a_push_policy_deploys_with_the_puck_tracked(tmp_path):
    """panda_push observes the puck: deployment names the tracking to set up, then runs the policy on the twin
    (panda_push's scene, the puck's pose published as a motion-capture system would) and records the poses."""
    from robotrl.hardware.deploy import load_policy
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    (tmp_path / "run").mkdir()
    run_dir = untrained_run(tmp_path / "run", ["task=panda_push", "agent.actor_hidden=[32,32]"])
    _, spec, _ = load_policy(run_dir)
    # in this process beside the twin: the watchdog gets five periods, as tests/test_robot_env.py explains
    shield = {"hold_after": 5 / RATE, "workspace_min": [0.1, -0.6, 0.05], "workspace_max": [0.8, 0.6, 0.9]}
    hardware = RobotEnvConfig(domain_id=212, control_rate_hz=RATE, shield=shield)
    hint = (
        r"observes \['puck_pos', 'puck_to_goal', 'to_puck'\], which the robot does not measure: "
        r"track \['puck'\] with hardware\.objects=\[puck\] \(a geometry_msgs/PoseStamped each, in the arm's base "
        r"frame, on /objects/puck/pose\)$"
    )
    with pytest.raises(ValueError, match=hint):  # the goal is not asked for: it is drawn around the puck
        make_robot_env(hardware, spec)
    hardware.objects = ["puck"]
    env = make_robot_env(hardware, spec)
    try:  # each reset waits for the puck in push's start box and draws the goal around it, as simulation does
        assert env.drawn_goals == ["goal"] and list(env.start_regions) == ["puck"]
        box = [[0.40, -0.15, 0.005], [0.55, 0.15, 0.035]]  # resting on the table (centre 2 cm up, 1.5 cm either way)
        np.testing.assert_allclose(np.stack(env.start_regions["puck"]), box, atol=1e-6)
    finally:
        env.close()

    twin_cfg = SimTwinConfig(
        rate_hz=RATE, domain_id=212, report_interval=0, model=str(ASSETS / "panda_push.xml"), objects=["puck"]
    )
    twin = SimTwin(twin_cfg)
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    bag = tmp_path / "session"
    try:
        cfg = DeployConfig(
            run=str(run_dir),
            hardware=hardware,
            episodes=1,
            episode_steps=20,
            goal={"goal": [0.6, 0.1]},
            record=str(bag),
        )
        summary = run(cfg)
        fingers = twin.data.qpos[twin._qpos[len(twin.joint_names) :]].copy()
        # the puck left beyond push's start box and nobody puts it back: the session ends with its summary
        twin.place_object("puck", [0.70, 0.0, 0.02])
        hardware.scene_timeout = 0.5
        ended = run(DeployConfig(run=str(run_dir), hardware=hardware, episodes=1))
        assert ended["episodes"] == ended["steps"] == 0
        assert re.search(r"scene_timeout 0\.5 s: puck at \[0\.7\d*, .*not in its start region", ended["ended"])
        # asked on /scene/reset, the twin puts the puck back itself (as a lab's reset routine would): two
        # episodes, the second starting from the scene the first left, each goal drawn around the puck
        hardware.scene_timeout, hardware.scene_reset_topic = 5.0, "/scene/reset"
        twin.place_object("puck", [0.70, 0.0, 0.02])
        again = run(DeployConfig(run=str(run_dir), hardware=hardware, episodes=2, episode_steps=10))
        assert again["episodes"] == 2 and again["steps"] == 20 and "ended" not in again
        assert twin.scene_resets >= 1
    finally:
        twin.stop()
        thread.join(timeout=5)
        twin.close()
    assert summary["steps"] == 20 and summary["policy_errors"] == 0
    # push never commands its gripper: the fingers stay shut as in simulation (the reset used to open them)
    assert spec.gripper_hold == SPEC.gripper.closed and (fingers < 0.005).all(), fingers
    assert summary.get("stale_observations", 0) == 0 and summary.get("bad_object_pose", 0) == 0
    poses = []
    with AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as reader:
        for connection, _, raw in reader.messages():
            if connection.topic == "/objects/puck/pose":
                assert connection.msgtype == "geometry_msgs/msg/PoseStamped"
                poses.append(reader.deserialize(raw, connection.msgtype).pose.position)
    assert len(poses) == summary["record"]["messages"]["/objects/puck/pose"] > 20
    assert abs(poses[0].x - 0.5) < 0.01 and abs(poses[0].z - 0.02) < 0.005  # the scene's puck, where it starts


def test_a_held_peg_tip_follows_the_tool_by_kinematics_and_the_peg_goes_in_on_the_twin():
    """panda_peg_insert observes the tip of the peg in the hand, which no sensor reports: the robot env puts it
    where the scene holds it (6 cm along the tool axis, measured in simulation) by forward kinematics. On the
    twin running peg_insert's scene (peg welded to the hand, as in training) it matches the physics' tip, and
    the task's scripted expert, fed the robot's observation alone, puts the peg into the hole."""

    import mujoco
    from robotrl.tasks.configs import ArmTaskConfig
    from robotrl.tasks.panda_peg_insert import HOLE_HALF_WIDTH, INSERT_DEPTH, PegExpert

    peg = ArmTaskConfig(name="panda_peg_insert")
    spec = deploy_spec_for(peg)  # the peg tip's offset measured in peg_insert's scene
    np.testing.assert_allclose(spec.held["peg_tip"], [0.0, 0.0, 0.06], atol=1e-4)
    shield = {"hold_after": 5 / RATE, "workspace_min": [0.1, -0.6, 0.0], "workspace_max": [0.8, 0.6, 0.9]}
    hardware = RobotEnvConfig(domain_id=216, control_rate_hz=RATE, shield=shield)
    with pytest.raises(ValueError, match=r"observes \['hole', 'tip_to_hole'\].*give \+goal\.hole=\[x,y,z\]$"):
        make_robot_env(hardware, spec)
    twin = SimTwin(
        SimTwinConfig(rate_hz=RATE, domain_id=216, report_interval=0, model=str(ASSETS / "panda_peg_insert.xml"))
    )
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    hole = [0.5, 0.0, 0.04]  # the scene's hole: its rim's centre
    env = make_robot_env(hardware, spec, {"hole": hole})
    try:
        env.reset()
        tip_site = mujoco.mj_name2id(twin.model, mujoco.mjtObj.mjOBJ_SITE, "peg_tip")
        time.sleep(0.3)  # at rest at home
        obs, info = env._observe()
        assert info["stale_observation"] == 0
        np.testing.assert_allclose(obs["peg_tip"], twin.data.site_xpos[tip_site], atol=2e-3)
        np.testing.assert_allclose(obs["tip_to_hole"], np.array(hole) - obs["peg_tip"], atol=1e-6)
        expert = PegExpert(peg.max_ee_step, 1)
        for _ in range(100):
            state = {key: torch.as_tensor(obs[key]).unsqueeze(0) for key in PegExpert.reads}
            obs, _, _, _, info = env.step(expert.motion(state)[0].numpy())
            tip = twin.data.site_xpos[tip_site]
            if hole[2] - tip[2] >= INSERT_DEPTH and np.linalg.norm(tip[:2] - hole[:2]) < HOLE_HALF_WIDTH:
                break
        assert hole[2] - tip[2] >= INSERT_DEPTH, f"the peg's tip stopped at {tip.tolist()}"
        assert np.linalg.norm(tip[:2] - np.array(hole[:2])) < HOLE_HALF_WIDTH
    finally:
        env.close()
        twin.stop()
        thread.join(timeout=5)
        twin.close()
