"""Fine-tuning on a robot: robotrl-actor with hardware=sim_twin acts on the simulated twin (real MuJoCo in a
thread, real DDS on loopback) through the robot env and the shield, and streams to a robotrl-learner process
over real gRPC. The robot's episodes are scored as the simulated task scores them where the robot env knows
everything the reward needs (panda_reach; panda_push with the puck tracked), and refused by name where it does
not. Domain ids 193-195, 214, 215, 217."""

import math
import threading

import numpy as np
import pytest
import torch
from helpers import LearnerProcess, TwinThread, free_port, join_actor, quick_link, small_learner_args, start_actor

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from hydra import compose, initialize_config_module
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.robot_vec_env import ActorRobotConfig, make_robot_vec_env
from robotrl.hardware.sim_twin import ASSETS
from robotrl.tasks.configs import ArmTaskConfig
from robotrl.tasks.panda_reach import TARGET_HIGH, TARGET_LOW

from robotrl.actor import ActorConfig, to_actor_config
from robotrl.agents.sac import SACConfig

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

RATE = 250.0
REACH = ArmTaskConfig(name="panda_reach")
SMALL_SAC = SACConfig(batch_size=32, actor_hidden=[32, 32], critic_hidden=[32, 32])


def hardware(domain_id: int) -> RobotEnvConfig:
    cfg = RobotEnvConfig(domain_id=domain_id, control_rate_hz=RATE, connect_timeout=10.0, reset_timeout=15.0)
    cfg.shield = {"workspace_min": [0.1, -0.6, 0.05], "workspace_max": [0.8, 0.6, 0.9]}
    return cfg


def test_reach_on_the_twin_is_scored_as_the_simulated_task_scores_it():
    with TwinThread(193):
        env = make_robot_vec_env(REACH, 1, hardware(193), ActorRobotConfig(), classifier=False)
        try:
            assert env.num_envs == 1 and env.has_success and env.action_dim == 3
            assert set(env.obs_spec) == {"arm_qpos", "arm_qvel", "ee_pos", "target", "to_target"}
            targets = []
            for seed in (1, 2):
                obs = env.reset(seed=seed)
                target = obs["target"][0]
                targets.append(target)
                assert ((target >= TARGET_LOW - 1e-6) & (target <= TARGET_HIGH + 1e-6)).all()
                torch.testing.assert_close(obs["to_target"][0], target - obs["ee_pos"][0])
            assert not torch.equal(targets[0], targets[1])  # a new goal each episode
            # the reach expert's action, through the robot env and shield: success as the task defines it
            successes = []
            for _ in range(40):
                action = (obs["to_target"] / REACH.max_ee_step).clamp(-1.0, 1.0)
                result = env.step(action)
                distance = float(result.next_obs["to_target"].norm())
                assert math.isclose(float(result.reward), -distance, rel_tol=1e-5, abs_tol=1e-6)
                assert bool(result.success) == (distance < REACH.success_threshold)
                successes.append(bool(result.success))
                obs = result.obs
                if result.truncated.any() or result.terminated.any():
                    break
            assert any(successes), "the scripted reach never got within the success threshold on the twin"
            assert env.stale_episodes == 0
            with pytest.raises(ValueError, match=r"action must have shape \[1, 3\]"):
                env.step(torch.zeros(1, 7))
            with pytest.raises(ValueError, match="non-finite action"):
                env.step(torch.full((1, 3), float("nan")))
        finally:
            env.close()


def test_tasks_a_robot_cannot_score_need_the_reward_classifier_by_name():
    pick = ArmTaskConfig(name="panda_pick_cube")
    with pytest.raises(
        ValueError,
        match=r"'panda_pick_cube' cannot be scored on a robot .*needs state no observation holds.*reward_classifier",
    ):
        make_robot_vec_env(pick, 1, hardware(195), ActorRobotConfig(), classifier=False)
    pixel_push = ArmTaskConfig(name="panda_push", obs="pixels")  # its own reward reads the puck: not from pixels
    with pytest.raises(
        ValueError,
        match=r"'panda_push' cannot .*reads \['puck_pos', 'ee_pos', 'goal'\], which this policy does not all",
    ):
        make_robot_vec_env(pixel_push, 1, hardware(195), ActorRobotConfig(), classifier=False)
    older_name = make_robot_vec_env(REACH, 1, hardware(195), ActorRobotConfig(reward="goal_distance"), False)
    assert older_name.reward_cfg.kind == "task" and older_name.score is not None  # reach's rule: the task's score
    older_name.close()
    with pytest.raises(ValueError, match=r"robot\.reward=classifier needs hil\.reward_classifier"):
        make_robot_vec_env(REACH, 1, hardware(195), ActorRobotConfig(reward="classifier"), classifier=False)
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        with pytest.raises(ValueError, match=r"num_envs must be 1 .*hardware=panda"):
            to_actor_config(compose("actor", ["hardware=sim_twin", "num_envs=4"]))
        with pytest.raises(ValueError, match=r"hil\.operator=scripted needs the simulator's expert"):
            to_actor_config(compose("actor", ["hardware=sim_twin", "hil.operator=scripted"]))
        with pytest.raises(ValueError, match=r"robot\.reward must be one of auto, goal_distance, task, classifier"):
            to_actor_config(compose("actor", ["hardware=sim_twin", "robot.reward=vibes"]))
        cfg = to_actor_config(compose("actor", ["hardware=panda", "+robot.goal.target=[0.5,0.0,0.3]"]))
    assert cfg.hardware.loopback is False and cfg.robot.goal == {"target": [0.5, 0.0, 0.3]}


def test_push_on_the_twin_is_scored_by_the_tasks_own_reward_from_the_tracked_puck():
    push = ArmTaskConfig(name="panda_push")
    with TwinThread(214, model=str(ASSETS / "panda_push.xml"), objects=["puck"]) as twin:
        with pytest.raises(
            ValueError, match=r"observes \['puck_pos', 'puck_to_goal', 'to_puck'\].*hardware\.objects=\[puck\]"
        ):
            make_robot_vec_env(push, 1, hardware(214), ActorRobotConfig(goal={"goal": [0.6, 0.0]}), False)
        tracked = hardware(214)
        tracked.objects = ["puck"]
        puck_xy = [float(v) for v in twin.data.xpos[twin._object_bodies["puck"]][:2]]
        # no goal given: each episode's is drawn around the measured puck, as simulation draws it
        env = make_robot_vec_env(push, 1, tracked, ActorRobotConfig(), classifier=False)
        try:
            goals = [env.reset(seed=seed)["goal"][0] for seed in (1, 1, 2)]
            torch.testing.assert_close(goals[0], goals[1])  # a seed repeats its goal
            assert not torch.allclose(goals[0], goals[2])
            for goal in goals:
                distance = float((goal - torch.tensor(puck_xy)).norm())
                assert 0.1 - 2e-3 <= distance <= 0.2 + 2e-3, (goal, puck_xy)
        finally:
            env.close()
        for goal, succeeds in (([puck_xy[0] + 0.12, puck_xy[1]], False), (puck_xy, True)):
            env = make_robot_vec_env(push, 1, tracked, ActorRobotConfig(goal={"goal": goal}), False)
            try:
                assert env.reward_cfg.kind == "task" and env.has_success
                env.reset(seed=1)
                result = env.step(torch.zeros(1, env.action_dim))
                obs = result.next_obs
                assert env.stale_episodes == 0
                puck, ee = obs["puck_pos"][0].double(), obs["ee_pos"][0].double()
                distance = float((torch.tensor(goal, dtype=torch.float64) - puck[:2]).norm())
                assert (distance < push.success_threshold) == succeeds == bool(result.success)
                # panda_push's dense reward (tasks/panda_push.py: outcome), from the measured puck
                reach, to_goal = 1 - math.tanh(10 * float((puck - ee).norm())), 1 - math.tanh(5 * distance)
                expected = (0.2 * reach + to_goal + float(succeeds)) / 2.2
                assert math.isclose(float(result.reward), expected, rel_tol=1e-4, abs_tol=1e-5)
                if succeeds:  # the tracker's poses now count as old: the episode is cut, not won on the last pose
                    env.env.cfg.max_object_age = 1e-6
                    env.env.cfg.scene_timeout = 0.0  # the cut episode's reset: no scene check on a "lost" puck
                    result = env.step(torch.zeros(1, env.action_dim))
                    assert bool(result.truncated) and not bool(result.success) and not bool(result.terminated)
                    torch.testing.assert_close(result.next_obs["puck_pos"][0], obs["puck_pos"][0], atol=2e-3, rtol=0)
            finally:
                env.close()


def test_an_actors_reset_keeps_waiting_for_the_scene_until_the_actor_stops(caplog):
    """On a robot an actor waits for its person: a scene not reset within scene_timeout is logged and waited
    for again (deployment ends its session instead); the actor's stop ends the wait with EnvCancelled."""
    from robotrl.hardware.robot_env import SceneResetError

    from robotrl.core.env import EnvCancelled

    push = ArmTaskConfig(name="panda_push")
    with TwinThread(219, model=str(ASSETS / "panda_push.xml"), objects=["puck"]) as twin:
        tracked = hardware(219)
        tracked.objects, tracked.scene_timeout, tracked.scene_settle = ["puck"], 0.3, 0.1
        stop = threading.Event()
        env = make_robot_vec_env(push, 1, tracked, ActorRobotConfig(), False, stop)
        try:
            twin.place_object("puck", [0.70, 0.0, 0.02])
            threading.Timer(1.5, stop.set).start()
            with caplog.at_level("WARNING", logger="robotrl.hardware.robot_vec_env"):
                with pytest.raises(EnvCancelled, match="puck at"):
                    env.reset(seed=0)
            waits = [r for r in caplog.records if "scene_timeout 0.3 s: puck at" in r.getMessage()]
            assert len(waits) >= 2, [r.getMessage() for r in caplog.records]  # timed out, logged, waited again
            env.stop = None  # nothing could end the wait: the first timeout is the caller's
            with pytest.raises(SceneResetError, match="puck at"):
                env.reset(seed=0)
            # the stop cancels the automatic reset after an episode's last step: that step is still returned
            twin.place_object("puck", [0.50, 0.0, 0.02])
            env.stop = threading.Event()
            env.reset(seed=0)
            env.env.episode_steps = 1
            twin.place_object("puck", [0.70, 0.0, 0.02])
            threading.Timer(1.0, env.stop.set).start()
            result = env.step(torch.zeros(1, env.action_dim))
            assert bool(result.truncated) and result.obs is result.next_obs
        finally:
            env.close()


def test_the_push_expert_pushes_the_tracked_puck_to_its_goal_on_the_twin():
    """panda_push's scripted expert, fed only the robot's observation (the puck as its tracker reports it),
    through the robot env and the shield with the fingers held shut: the twin's puck reaches the goal, and
    the task's own reward says so. Closes the loop over tracked objects, gripper hold and the task's reward."""
    from robotrl.tasks.panda_push import PushExpert

    push = ArmTaskConfig(name="panda_push")
    with TwinThread(215, model=str(ASSETS / "panda_push.xml"), objects=["puck"]):
        tracked = hardware(215)
        tracked.objects = ["puck"]
        tracked.shield = {**tracked.shield, "workspace_min": [0.1, -0.6, 0.0]}  # push works at the table
        goal = [0.62, 0.05]  # 13 cm from the scene's puck, at an angle
        env = make_robot_vec_env(push, 1, tracked, ActorRobotConfig(goal={"goal": goal}), False)
        try:
            obs = env.reset(seed=0)
            start = obs["puck_pos"][0].clone()
            expert = PushExpert(push.max_ee_step, 1)
            for _ in range(push.episode_steps or 100):
                result = env.step(env.world_to_action(expert.motion(obs)))
                if result.success.any() or result.truncated.any():
                    break
                obs = result.obs
            assert bool(result.success), f"puck at {result.next_obs['puck_pos'][0].tolist()}, goal {goal}"
            assert float((result.next_obs["puck_pos"][0, :2] - start[:2]).norm()) > 0.08  # it was pushed there
            assert env.stale_episodes == 0
        finally:
            env.close()


def test_peg_insertion_on_the_twin_is_scored_by_the_tasks_own_reward_from_the_held_peg(tmp_path):
    """peg_insert on a robot: the peg's tip by kinematics (its offset from the learner's deploy spec, measured in
    simulation when the run started; without one the actor is refused by name), the hole given, the task's own
    score; its scripted expert, fed the robot's observation, inserts the peg on the twin and the score calls it
    a success."""
    from robotrl.tasks import deploy_spec_for
    from robotrl.tasks.panda_peg_insert import PegExpert

    from robotrl.core.deploy_spec import write_deploy_spec

    peg = ArmTaskConfig(name="panda_peg_insert")
    hole = [0.5, 0.0, 0.04]  # the scene's hole
    with pytest.raises(ValueError, match=r"\['peg_tip'\].*give robot\.deploy_spec=<the learner's run directory>"):
        make_robot_vec_env(peg, 1, hardware(217), ActorRobotConfig(goal={"hole": hole}), classifier=False)
    write_deploy_spec(deploy_spec_for(peg), tmp_path)  # as robotrl-learner writes it into its run directory
    with TwinThread(217, model=str(ASSETS / "panda_peg_insert.xml")):
        cfg = hardware(217)
        cfg.shield = {**cfg.shield, "workspace_min": [0.1, -0.6, 0.0]}
        robot = ActorRobotConfig(goal={"hole": hole}, deploy_spec=str(tmp_path))
        env = make_robot_vec_env(peg, 1, cfg, robot, classifier=False)
        try:
            assert env.reward_cfg.kind == "task" and env.reward_cfg.reads == ["peg_tip", "hole"]
            obs = env.reset(seed=0)
            expert = PegExpert(peg.max_ee_step, 1)
            rewards = []
            for _ in range(100):
                result = env.step(env.world_to_action(expert.motion(obs)))
                rewards.append(float(result.reward))
                if result.success.any() or result.truncated.any():
                    break
                obs = result.obs
            assert bool(result.success) and env.stale_episodes == 0
            assert rewards[-1] > 0.8 > rewards[0]  # dense: approach, insertion and success terms
        finally:
            env.close()


def test_the_pick_expert_lifts_the_tracked_cube_on_the_twin():
    """panda_pick_cube on a robot: the cube tracked, its start box checked at reset, the gripper commanded
    through the robot env and the shield; pick's scripted expert, fed only the robot's observation (its phase
    kept as in simulation), grasps the twin's cube and lifts it the task's 10 cm. Pick is scored on a robot by
    a learned classifier (its reward needs contacts), so the physics says whether it worked."""
    from robotrl.hardware.deploy import make_robot_env
    from robotrl.tasks import deploy_spec_for
    from robotrl.tasks.panda_pick_cube import CUBE_HALF, LIFT_HEIGHT, PickExpert

    pick = ArmTaskConfig(name="panda_pick_cube")
    spec = deploy_spec_for(pick)
    with TwinThread(220, model=str(ASSETS / "panda_pick_cube.xml"), objects=["cube"]) as twin:
        cfg = hardware(220)
        cfg.objects, cfg.scene_timeout, cfg.scene_settle = ["cube"], 5.0, 0.2
        cfg.shield = {**cfg.shield, "workspace_min": [0.1, -0.6, 0.0]}  # the fingers reach down to the cube
        env = make_robot_env(cfg, spec)
        try:
            assert env.gripper_action and list(env.start_regions) == ["cube"]
            obs, _ = env.reset(seed=0)
            state = {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}
            expert = PickExpert(pick.max_ee_step, 1)  # the real cube's size: nominal
            body = twin._object_bodies["cube"]
            start = float(twin.data.xpos[body][2])
            for _ in range(pick.episode_steps or 100):
                action = expert.motion(state)[0].numpy()
                obs, _, _, truncated, info = env.step(action)
                assert info["stale_observation"] == 0, info.get("stale_reason")
                state = {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}
                if float(twin.data.xpos[body][2]) - CUBE_HALF >= LIFT_HEIGHT or truncated:
                    break
            height = float(twin.data.xpos[body][2]) - CUBE_HALF
            assert start - CUBE_HALF < 0.005 and height >= LIFT_HEIGHT, (start, height, int(expert.phase))
            assert float(obs["gripper"][0]) < 0.9  # the fingers closed on it (fully open reads 1)
            # the cube was still rising when that observation was taken: hold it still, then the tracked pose
            # and the twin's physics must agree (compared mid-lift they differed by the motion in between)
            hold = action.copy()
            hold[:3] = 0.0
            for _ in range(10):
                obs, *_ = env.step(hold)
            np.testing.assert_allclose(obs["cube_pos"], twin.data.xpos[body], atol=5e-3)
        finally:
            env.close()


def test_an_actor_on_the_twin_streams_scored_transitions_to_a_learner_and_takes_its_weights(tmp_path):
    port = free_port()
    learner = LearnerProcess(
        tmp_path / "learner",
        port,
        base=small_learner_args("panda_reach"),
    )
    try:
        with TwinThread(194):
            link = quick_link(port)
            cfg = ActorConfig(
                task=REACH,
                learner=link,
                actor_id="arm",
                total_steps=90,
                batch_steps=10,
                connect_timeout_s=60.0,
                hardware=hardware(194),
                robot=ActorRobotConfig(goal_range={"target": [[0.4, -0.1, 0.2], [0.5, 0.1, 0.3]]}),
            )
            _, _, thread, result = start_actor(cfg, run_dir=tmp_path / "actor")
            summary = join_actor(thread, result, timeout=120)
        assert summary["env_steps"] == summary["acked_env_steps"] == 90 and summary["dropped_env_steps"] == 0
        assert summary["episodes"] >= 1  # reach episodes are 50 steps: at least one ended (and the arm went home)
        assert summary["weights_loaded"] >= 1  # the policy acting on the robot came from the learner
        status = learner.status()
        assert status["streams"]["arm"]["transitions"] == 90 and status["updates"] > 0
    finally:
        assert learner.stop() == 0, learner.output()


def test_robot_goal_ranges_are_checked_against_the_goals_the_robot_env_has():
    # no twin: the checks run when the env is built, before it waits for a joint state
    # low > high; no high corner at all; a corner that is not numbers; a NaN corner
    bad_boxes = (
        [[0.6, 0.0, 0.3], [0.4, 0.0, 0.3]],
        [[0.4, 0.0, 0.3]],
        [["a", 0.0, 0.3], [0.5, 0.0, 0.3]],
        [[float("nan"), 0.0, 0.3], [0.5, 0.0, 0.3]],
    )
    for box in bad_boxes:
        with pytest.raises(ValueError, match=r"goal_range\.target must be \[\[low\.\.\.\], \[high\.\.\.\]\]"):
            make_robot_vec_env(REACH, 1, hardware(195), ActorRobotConfig(goal_range={"target": box}), False)
    flat = ActorRobotConfig(goal_range={"target": [[0.4, 0.0], [0.5, 0.0]]})  # two values for an xyz goal
    with pytest.raises(
        ValueError, match=r"robot\.goal_range\.target has corners of 2 values, the task observes 'target' as \(3,\)"
    ):
        make_robot_vec_env(REACH, 1, hardware(195), flat, classifier=False)
    unknown = ActorRobotConfig(goal_range={"hole": [[0.4, 0.0, 0.1], [0.5, 0.0, 0.1]]})
    with pytest.raises(ValueError, match=r"robot\.goal_range\.hole: task 'panda_reach' observes no 'hole'"):
        make_robot_vec_env(REACH, 1, hardware(195), unknown, classifier=False)
