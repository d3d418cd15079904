"""Contracts every built-in arm task keeps, and what is particular to push and peg insertion."""

import gymnasium as gym
import pytest
import torch
from robotrl.tasks import ARM_TASKS, make_task
from robotrl.tasks.arm_task import TaskVecEnv
from robotrl.tasks.configs import ArmTaskConfig
from robotrl.tasks.gym_api import GYM_IDS

ARM_TASK_NAMES = sorted(ARM_TASKS)


def _env(name, num_envs=1, **kw):
    return TaskVecEnv(make_task(ArmTaskConfig(name=name, **kw), num_envs))


@pytest.mark.parametrize("name", ARM_TASK_NAMES)
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


@pytest.mark.parametrize("name", ARM_TASK_NAMES)
def test_sparse_reward_is_success_minus_one(name):
    env = _env(name, reward="sparse")
    env.reset(seed=0)
    reward, success, terminated = env.task.evaluate()
    assert reward.item() == success.float().item() - 1.0 and not terminated.any()


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
