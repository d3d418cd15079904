"""A 16-joint hand on a robot: the twin runs hand_reorient's scene (the hand4 model, its cube tracked) over real DDS
on loopback, as a ros2_control hand (an Allegro or LEAP hand) exposes its joints; the robot env gives
hand_reorient's observation from joint states, the hand's forward kinematics (palm, fingertips) and the tracked cube,
equal to what the simulated task observes in the same state; the shield covers the 16 joints; an untrained
hand_reorient policy deploys on the twin; a lost cube cuts the episode; an actor fine-tunes on it against a learner.
Domain ids 180-183."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from helpers import (
    REPO,
    LearnerProcess,
    TwinThread,
    free_port,
    join_actor,
    quick_link,
    small_learner_args,
    start_actor,
    untrained_run,
)
from robotrl.hardware.deploy import DeployConfig, make_robot_env
from robotrl.hardware.deploy import run as deploy_run
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.robot_vec_env import ActorRobotConfig, make_robot_vec_env
from robotrl.hardware.sim_twin import ASSETS, SimTwin
from robotrl.tasks import deploy_spec_for, make_env
from robotrl.tasks.configs import HandTaskConfig

from robotrl.actor import ActorConfig

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

RATE = 250.0
HAND = HandTaskConfig(name="hand_reorient")
GOAL = [0.7071068, 0.0, 0.0, 0.7071068]  # a quarter turn about the vertical (w, x, y, z)
HAND_TWIN = {"robot": "hand4", "model": str(ASSETS / "hand_reorient.xml"), "objects": ["cube"]}


def hand_hardware(domain_id: int) -> RobotEnvConfig:
    cfg = RobotEnvConfig(
        robot="hand4",
        domain_id=domain_id,
        control_rate_hz=RATE,
        gripper_controller="",
        objects=["cube"],
        scene_reset_topic="/scene/reset",
        reset_timeout=15.0,
    )
    cfg.shield = {"position_margin": 0.02}
    return cfg


def simulated_observation(twin: SimTwin) -> dict[str, np.ndarray]:
    """hand_reorient's own observation with the hand and the cube where the twin has them (goal GOAL)."""
    env = make_env(HAND, num_envs=1)
    try:
        env.reset(seed=0)
        task, model, data = env.task, twin.model, twin.data
        q = torch.tensor(np.array([data.qpos[model.jnt_qposadr[model.joint(j).id]] for j in task.robot.joints]))
        task.backend.set_joint_state(torch.tensor([0]), task.robot.joints, q.float().unsqueeze(0))
        body = twin._object_bodies["cube"]
        pos, quat = torch.tensor(data.xpos[body]).float(), torch.tensor(data.xquat[body]).float()
        task.backend.set_free_body_pose(torch.tensor([0]), "cube", pos.unsqueeze(0), quat.unsqueeze(0))
        task.goal[0] = torch.tensor(GOAL)
        task.backend.forward()
        return {key: value[0].numpy() for key, value in task.observe().items()}
    finally:
        env.close()


def test_the_robot_env_observes_the_hand_as_the_simulated_task_does():
    """Same keys, shapes and values: the robot env's observation of the twin (joint states, fingertips by forward
    kinematics from the palm, the tracked cube from the palm, the turn still to make) equals hand_reorient's own
    observation of the same state, to the precision of what travels over DDS."""
    spec = deploy_spec_for(HAND)
    with TwinThread(180, **HAND_TWIN) as twin:
        env = make_robot_env(hand_hardware(180), spec, {"goal_quat": GOAL})
        try:
            assert dict(env.observation_space.spaces.items()).keys() == spec.observations.keys()
            assert env.action_dim == 16 and env.shield.limits.lower.shape == (16,)
            env.reset()
            time.sleep(0.3)  # at rest at home
            obs, info = env._observe()
            assert info["stale_observation"] == 0, info.get("stale_reason")
            simulated = simulated_observation(twin)
        finally:
            env.close()
    for key, value in simulated.items():
        assert obs[key].shape == value.shape, key
        np.testing.assert_allclose(obs[key], value, atol=2e-3, err_msg=key)


def test_a_hand_policy_deploys_on_the_hand_twin_through_the_shield(tmp_path):
    """robotrl-deploy of an untrained hand_reorient policy (16 joint deltas) on the hand twin with
    configs/hardware/hand_twin.yaml: an episode runs at the policy rate through the shield, the cube tracked, no
    observation stale."""
    from robotrl.config import register_configs

    register_configs()  # the task schemas the run's config composes against
    run = untrained_run(
        tmp_path / "run", ["task=hand_reorient", "agent.actor_hidden=[32,32]", "agent.critic_hidden=[32,32]"]
    )
    from omegaconf import OmegaConf

    from robotrl.config import strict_object

    # configs/hardware/hand_twin.yaml as a user gets it (hardware=hand_twin), on this test's domain and rate
    hardware = strict_object(RobotEnvConfig, OmegaConf.load(REPO / "configs" / "hardware" / "hand_twin.yaml"))
    hardware.domain_id, hardware.control_rate_hz = 181, RATE
    with TwinThread(181, **HAND_TWIN):
        cfg = DeployConfig(run=str(run), hardware=hardware, episodes=1, episode_steps=20, goal={"goal_quat": GOAL})
        summary = deploy_run(cfg)
    assert summary["steps"] == 20 and summary["policy_errors"] == 0 and summary["commands"] > 0, summary
    assert "stale_observations" not in summary and "late_actions" not in summary, summary  # counted when they occur


def test_a_lost_cube_cuts_the_episode_and_the_task_scores_the_hand_on_a_robot():
    """hand_reorient scores itself on a robot from what it observes (the cube from the palm, its orientation, the
    goal); when the tracker stops reporting the cube the observation goes stale, no command is sent and the episode
    ends truncated."""
    with TwinThread(182, **HAND_TWIN) as twin:
        env = make_robot_vec_env(HAND, 1, hand_hardware(182), ActorRobotConfig(goal={"goal_quat": GOAL}), False)
        try:
            assert env.reward_cfg.kind == "task" and env.has_success
            env.reset(seed=0)
            result = env.step(torch.zeros(1, 16))
            assert not result.truncated.any() and torch.isfinite(result.reward).all()
            twin._object_bodies.clear()  # the tracker loses the cube: no more poses on its topic
            time.sleep(0.3)  # older than max_object_age
            result = env.step(torch.zeros(1, 16))
            assert bool(result.truncated) and env.stale_episodes == 1
        finally:
            env.close()


def test_an_actor_fine_tunes_on_the_hand_twin_with_the_tasks_own_reward(tmp_path):
    """robotrl-actor on the hand twin streams hand_reorient's transitions, scored by the task's own reward from the
    robot's observation, to a robotrl-learner process over gRPC, and acts with the weights it sends back."""
    port = free_port()
    learner = LearnerProcess(
        tmp_path / "learner",
        port,
        base=small_learner_args("hand_reorient", learning_starts=20),
    )
    try:
        with TwinThread(183, **HAND_TWIN):
            link = quick_link(port)
            cfg = ActorConfig(
                task=HAND,
                learner=link,
                actor_id="hand",
                total_steps=60,
                batch_steps=10,
                connect_timeout_s=60.0,
                hardware=hand_hardware(183),
                robot=ActorRobotConfig(goal={"goal_quat": GOAL}),
            )
            _, _, thread, result = start_actor(cfg, run_dir=tmp_path / "actor")
            summary = join_actor(thread, result, timeout=120)
        assert summary["env_steps"] == summary["acked_env_steps"] == 60 and summary["dropped_env_steps"] == 0
        assert summary["weights_loaded"] >= 1  # the policy acting on the hand came from the learner
        status = learner.status()
        assert status["streams"]["hand"]["transitions"] == 60 and status["updates"] > 0
    finally:
        assert learner.stop() == 0, learner.output()
