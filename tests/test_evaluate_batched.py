"""Batched evaluation (runtime/evaluate.py:evaluate_batched): every env runs one deterministic episode per round,
only each env's first episode counts, and a training run evaluates that way with eval_envs > 1."""

from __future__ import annotations

import pytest
import torch
from robotrl.tasks import TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import TaskVecEnv

from robotrl.agents.base import Agent
from robotrl.runtime.evaluate import evaluate, evaluate_batched


class ExpertAgent(Agent):
    """The task's scripted expert behind the agent contract: a policy whose success is known."""

    def __init__(self, env: TaskVecEnv):
        super().__init__()
        self.env, self.obs_spec, self.action_dim = env, env.obs_spec, env.action_dim
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # where `device` is read from
        self.acted: list[int] = []

    def act(self, obs, deterministic: bool = False) -> torch.Tensor:
        self.acted.append(len(next(iter(obs.values()))))
        return self.env.task.expert_action()

    def update(self, batch):
        raise NotImplementedError

    def optimizers(self):
        return {}


def _env(num_envs: int, **settings) -> TaskVecEnv:
    return TaskVecEnv(make_task(TASK_CONFIGS["panda_reach"](name="panda_reach", **settings), num_envs=num_envs))


def test_each_env_counts_its_first_episode_once():
    """With terminate_on_success every env ends at its own step; those that ended run on, uncounted, until the
    round's last one ends."""
    env = _env(4, terminate_on_success=True)
    try:
        agent = ExpertAgent(env)
        result = evaluate_batched(agent, env, episodes=8, seed=3)
        assert result["success"] == 1.0
        assert result["steps_to_success"] == result["length"] < env.task.episode_steps  # each ended at its success
        assert set(agent.acted) == {4}  # every step acts for all four envs at once
        single = _env(1, terminate_on_success=True)
        try:
            one = evaluate(ExpertAgent(single), single, episodes=8, seed=3)
        finally:
            single.close()
        assert one["success"] == 1.0 and abs(one["length"] - result["length"]) < 5  # the same expert, other goals
    finally:
        env.close()


def test_episodes_must_fill_whole_rounds():
    env = _env(4)
    try:
        with pytest.raises(ValueError, match=r"episodes \(6\) must be a positive multiple of the evaluation's 4 envs"):
            evaluate_batched(ExpertAgent(env), env, episodes=6, seed=0)
    finally:
        env.close()


def test_a_training_run_evaluates_its_envs_at_once(tmp_path):
    from hydra import compose, initialize_config_module

    from robotrl.config import register_configs, to_train_config
    from robotrl.runtime.loop import train
    from robotrl.runtime.metrics import read_metrics

    register_configs()
    overrides = [
        "task=panda_reach",
        "total_steps=300",
        "learning_starts=200",
        "eval_interval=300",
        "eval_envs=4",
        "eval_episodes=8",
        "checkpoint_interval=300",
        "agent.batch_size=32",
        "agent.actor_hidden=[32,32]",
        "agent.critic_hidden=[32,32]",
        "video=true",  # a batched evaluation films nothing, and must not try
        "progress=false",
    ]
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = to_train_config(compose(config_name="config", overrides=overrides))
        with pytest.raises(ValueError, match=r"eval_episodes \(6\) must be a multiple of eval_envs \(4\)"):
            to_train_config(compose(config_name="config", overrides=[*overrides, "eval_episodes=6"]))
    summary = train(cfg, tmp_path)
    assert "eval/success" in summary and "eval/length" in summary
    assert len(read_metrics(tmp_path / "metrics.csv")["eval/return"]) == 1
    assert not (tmp_path / "videos").exists()


def test_rounds_never_repeat_an_envs_seed():
    """Gymnasium envs seed env i with seed + i: round r resets with seed + r * num_envs, so no two episodes of the
    evaluation start from one seed (round 1 at seed + 1 replayed round 0's envs 1..E-1)."""
    env = _env(2, terminate_on_success=True)
    seeds = []
    reset = env.reset
    env.reset = lambda seed=None: (seeds.append(seed), reset(seed=seed))[1]
    try:
        evaluate_batched(ExpertAgent(env), env, episodes=6, seed=10)
    finally:
        env.close()
    assert seeds == [10, 12, 14]  # envs 10+i, 12+i, 14+i for i in 0, 1: six seeds, all distinct
