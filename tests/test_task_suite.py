"""Contracts every built-in arm task keeps, and what is particular to push and peg insertion."""

import importlib
import math

import gymnasium as gym
import mujoco
import pytest
import torch
from robotrl.tasks import ARM_TASKS, SIM_TASKS, TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import ASSETS, TaskVecEnv
from robotrl.tasks.gym_api import GYM_IDS

from robotrl.core.robot_spec import load_robot_spec
from robotrl.core.rotations import quat_angle

ARM_TASK_NAMES = sorted(ARM_TASKS)
SIM_TASK_NAMES = sorted(SIM_TASKS)


def _env(name, num_envs=1, **kw):
    return TaskVecEnv(make_task(TASK_CONFIGS[name](name=name, **kw), num_envs))


@pytest.mark.parametrize(("robot", "xml"), [("panda", "panda.xml"), ("hand4", "hand4.xml")])
def test_robot_spec_agrees_with_the_mjcf(robot, xml):
    spec = load_robot_spec(robot)
    model = mujoco.MjModel.from_xml_path(str(ASSETS / xml))
    for i, joint in enumerate(spec.joints):
        lo, hi = model.jnt_range[model.joint(joint).id]
        assert (lo, hi) == pytest.approx((spec.position_lower[i].item(), spec.position_upper[i].item()), abs=1e-6)
        actuator = model.actuator(f"act{i + 1}")
        assert actuator.trnid[0] == model.joint(joint).id
        assert actuator.forcerange[1] == pytest.approx(spec.effort_limit[i].item())


@pytest.mark.parametrize("name", SIM_TASK_NAMES)
def test_reset_step_contract_and_determinism(name):
    env = _env(name, num_envs=2)
    obs = env.reset(seed=0)
    assert set(obs) == set(env.obs_spec)
    for key, spec in env.obs_spec.items():
        assert obs[key].shape == (2, *spec.shape) and obs[key].dtype == spec.dtype
    action = torch.full((2, env.action_dim), 0.2)
    result = env.step(action)
    assert result.reward.shape == (2,) and torch.isfinite(result.reward).all()
    assert result.success.dtype == torch.bool and not result.truncated.any()
    twin = _env(name, num_envs=2)
    twin_obs = twin.reset(seed=0)
    twin_result = twin.step(action)
    for key in obs:
        assert torch.equal(obs[key], twin_obs[key]) and torch.equal(result.next_obs[key], twin_result.next_obs[key])
    other = _env(name, num_envs=2).reset(seed=1)
    assert any(not torch.equal(other[key], obs[key]) for key in obs)
    assert gym.make(GYM_IDS[name]).action_space.shape == (env.action_dim,)


def _has_expert(name: str) -> bool:
    module, cls = ARM_TASKS[name].split(":")  # registered lazily, as "module:Class"
    return getattr(importlib.import_module(module), cls).expert_class is not None


EXPERT_TASK_NAMES = [name for name in ARM_TASK_NAMES if _has_expert(name)]


def test_every_panda_task_has_a_scripted_expert():
    assert EXPERT_TASK_NAMES == ARM_TASK_NAMES  # the tool-frame test below runs on each of them


@pytest.mark.parametrize("name", EXPERT_TASK_NAMES)
def test_scripted_expert_succeeds_in_the_tool_frame_too(name):
    """Experts think in world axes; under relative_frame (the tool's start frame, ~180 deg about x at home)
    their motions must be turned into that frame, or they drive the arm away from the goal."""
    env = _env(name, relative_frame=True)
    task = env.task
    for episode in range(3):
        env.reset(seed=episode)
        won = False
        for _ in range(task.episode_steps):
            won |= bool(env.step(task.expert_action()).success[0])
        assert won, f"{name}: the expert failed episode {episode} under relative_frame"
    env.close()


@pytest.mark.parametrize("name", ARM_TASK_NAMES)
def test_scripted_expert_succeeds_and_random_actions_rarely_do(name):
    episodes = 10
    env = _env(name)
    task = env.task
    generator = torch.Generator().manual_seed(0)
    expert_wins = random_wins = 0
    for episode in range(episodes):
        env.reset(seed=episode)
        won = False
        for _ in range(task.episode_steps):
            won |= bool(env.step(task.expert_action()).success[0])
        expert_wins += won
        env.reset(seed=1000 + episode)
        won = False
        for _ in range(task.episode_steps):
            won |= bool(env.step(torch.rand(1, env.action_dim, generator=generator) * 2 - 1).success[0])
        random_wins += won
    assert expert_wins >= 0.95 * episodes
    assert random_wins <= 0.2 * episodes


@pytest.mark.parametrize("name", SIM_TASK_NAMES)
def test_sparse_reward_is_success_minus_one(name):
    env = _env(name, reward="sparse")
    env.reset(seed=0)
    reward, success, terminated = env.task.evaluate()
    assert reward.item() == success.float().item() - 1.0 and not terminated.any()


def test_terminate_on_success_ends_the_episode_at_the_first_success():
    env = _env("panda_reach", terminate_on_success=True)
    env.reset(seed=0)
    steps_taken = 0
    while steps_taken < env.task.episode_steps:
        result = env.step(env.task.expert_action())
        steps_taken += 1
        if result.success.any():
            break
    assert result.terminated.item() and not result.truncated.item()
    assert steps_taken < env.task.episode_steps
    assert not env.step(torch.zeros(1, env.action_dim)).success.any()  # a fresh episode started


def test_push_goals_start_away_from_the_puck_and_success_means_on_the_goal():
    env = _env("panda_push", num_envs=64)
    env.reset(seed=0)
    task = env.task
    distance = (task.goal - task.puck_pos()[:, :2]).norm(dim=-1)
    assert distance.min() >= 0.1 - 1e-4 and distance.max() <= 0.2 + 1e-4
    _, success, _ = task.evaluate()
    assert not success.any()
    ids = torch.arange(64)
    on_goal = torch.cat([task.goal, torch.full((64, 1), 0.02)], -1)
    task.backend.set_free_body_pose(ids, "puck", on_goal, torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(64, 4))
    task.backend.forward()
    assert task.evaluate()[1].all()


def _peg_run(offset: float) -> tuple[float, bool]:
    """Drive the expert at a hole that is `offset` metres off in x; return the lowest tip height and success."""
    env = _env("panda_peg_insert")
    task = env.task
    env.reset(seed=3)
    lowest, won = 1.0, False
    for _ in range(task.episode_steps - 1):
        true_hole = task.hole.clone()
        task.hole[:, 0] += offset
        action = task.expert_action()
        task.hole[:] = true_hole
        won |= bool(env.step(action).success[0])
        lowest = min(lowest, task.peg_tip()[0, 2].item())
    return lowest, won


def _push_state(task, env_id: int) -> tuple:
    joints = task.robot.joints
    backend = task.backend
    pos, quat = backend.body_pose("puck")
    return (
        backend.joint_pos(joints)[env_id],
        backend.joint_vel(joints)[env_id],
        pos[env_id],
        quat[env_id],
        task.goal[env_id].clone(),
    )


def _set_push_state(task, env_id: int, state: tuple) -> None:
    qpos, qvel, puck_pos, puck_quat, goal = state
    ids = torch.tensor([env_id])
    task.backend.set_joint_state(ids, task.robot.joints, qpos[None], qvel[None])
    task.backend.set_free_body_pose(ids, "puck", puck_pos[None], puck_quat[None])
    task.goal[env_id] = goal
    task.backend.forward(ids)


def test_push_expert_acts_on_the_state_alone():
    """Put in env 0's state, env 1 (holding still since its reset) gets env 0's expert action, at every
    step of env 0's episode. An expert that remembers a phase (lowering, or climbing back up to its hover point)
    shows a policy cloned from it two actions in one state, and the policy stalls there (ba43126, 2026-11-26)."""
    env = _env("panda_push", num_envs=2)
    task = env.task
    env.reset(seed=0)
    for step in range(60):
        task.backend.forward()  # poses from the state itself (after a step they lag the integration)
        own = _push_state(task, 1)
        _set_push_state(task, 1, _push_state(task, 0))
        probe = task.expert_motion()
        assert torch.allclose(probe[0], probe[1], atol=1e-5), f"step {step}: {probe.tolist()}"
        _set_push_state(task, 1, own)
        env.step(task.expert_action() * torch.tensor([[1.0], [0.0]]))  # env 1 holds still: another history


def test_peg_goes_in_only_when_aligned_with_the_hole():
    lowest, won = _peg_run(0.0)
    assert won and lowest < 0.01
    lowest, won = _peg_run(0.004)  # 4 mm off: the rim stops the peg (1 mm clearance)
    assert not won and lowest > 0.035


def test_peg_stays_in_the_hand_and_the_tool_points_down():
    env = _env("panda_peg_insert")
    task = env.task
    env.reset(seed=0)
    for _ in range(20):
        env.step(torch.tensor([[0.5, -0.5, -1.0]]))
    hand, _ = task.backend.body_pose("hand")
    peg, _ = task.backend.body_pose("peg")
    assert (peg - hand).norm().item() == pytest.approx(0.1234, abs=2e-3)
    _, quat = task.backend.site_pose(task.robot.end_effector_site)
    assert torch.abs(quat[0] @ torch.tensor([0.0, 1.0, 0.0, 0.0])) > 0.999


def test_hand_goals_turn_the_cube_and_success_means_at_the_goal_orientation():
    env = _env("hand_reorient", num_envs=32)
    assert env.action_dim == 16
    env.reset(seed=0)
    task = env.task
    ids = torch.arange(32)
    pos, quat = task.backend.body_pose("cube")
    angle = quat_angle(quat, task.goal)
    assert angle.min() >= math.pi / 4 - 1e-3 and not task.evaluate()[1].any()
    task.backend.set_free_body_pose(ids, "cube", pos, task.goal)  # turn every cube onto its goal
    task.backend.forward()
    reward, success, terminated = task.evaluate()
    assert success.all() and not terminated.any() and (reward > 1.5).all()
    any_axis = _env("hand_reorient", num_envs=32, goal_rotation="any")
    any_axis.reset(seed=0)
    _, quat = any_axis.task.backend.body_pose("cube")
    assert quat_angle(quat, any_axis.task.goal).min() >= math.pi / 4 - 1e-3


def test_dropping_the_cube_ends_the_episode():
    env = _env("hand_reorient")
    env.reset(seed=0)
    task = env.task
    ids = torch.tensor([0])
    task.backend.set_free_body_pose(ids, "cube", torch.tensor([[0.5, 0.3, 0.05]]), torch.tensor([[1.0, 0, 0, 0]]))
    result = env.step(torch.zeros(1, 16))
    assert result.terminated.all() and not result.truncated.any() and result.reward.item() < -1.5
    assert (result.obs["cube_pos"][0] - result.next_obs["cube_pos"][0]).norm() > 0.1  # auto-reset put it back


def test_hand_joint_delta_holds_and_tracks_targets():
    env = _env("hand_reorient")
    env.reset(seed=0)
    task = env.task
    start = task.backend.joint_pos(task.robot.joints)
    for _ in range(10):
        env.step(torch.zeros(1, 16))  # zero deltas hold the pose: no sag under gravity or contact
    assert (task.backend.joint_pos(task.robot.joints) - start).abs().max() < 0.02
    goal = task.robot.home + 0.3 * torch.tensor([0.0, 1.0, 1.0, 1.0] * 4)
    for _ in range(15):
        env.step(((goal - task.controller.last_target) / task.cfg.max_joint_step).clamp(-1, 1))
    assert (task.backend.joint_pos(task.robot.joints) - goal).abs().max() < 0.02


def test_hand_settings_are_validated():
    with pytest.raises(ValueError, match=r"task\.control=ee_delta needs a tool point; robot 'hand4'"):
        _env("hand_reorient", control="ee_delta")
    with pytest.raises(ValueError, match=r"task\.goal_rotation must be one of z, any, got 'xy'"):
        _env("hand_reorient", goal_rotation="xy")
    with pytest.raises(ValueError, match=r"task\.rotation_threshold"):
        _env("hand_reorient", rotation_threshold=0.0)


@pytest.mark.parametrize("name", EXPERT_TASK_NAMES)
def test_the_fewest_substeps_keep_the_expert_succeeding_and_contacts_shallow(name):
    """At its `fewest_substeps` (bench/substeps.py), each 40 ms / n long, a task's scripted expert succeeds as at the
    default 20 and contacts sink at most 1 mm deeper on average; the policy's rate is the same."""
    from robotrl.tasks import deploy_spec_for, task_class
    from robotrl.tasks.expert_rollout import roll_out_expert

    fewest = task_class(name).fewest_substeps
    assert fewest < 20, f"{name}: measured, so below the default"
    reference = roll_out_expert(TASK_CONFIGS[name](name=name), episodes=16)
    fast_cfg = TASK_CONFIGS[name](name=name, control_substeps=fewest, physics_dt=0.04 / fewest)
    assert deploy_spec_for(fast_cfg).policy_rate_hz == pytest.approx(25.0)
    fast = roll_out_expert(fast_cfg, episodes=16)
    assert not fast.diverged
    assert fast.success_rate >= reference.success_rate - 1 / 16, (fast, reference)  # one episode of 16 at most
    assert fast.mean_penetration_m <= reference.mean_penetration_m + 0.001, (fast, reference)


def test_a_bad_physics_step_is_refused_by_name():
    for bad in (0.0, -0.002, float("nan"), 0.05):
        with pytest.raises(ValueError, match=r"task.physics_dt must be a number in \(0, 0.02\] seconds or null"):
            make_task(TASK_CONFIGS["panda_reach"](name="panda_reach", physics_dt=bad))
