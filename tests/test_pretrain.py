"""hil.pretrain_updates: updates on the demonstrations alone before the first env step (offline-to-online),
after which the policy acts from the first step; real MuJoCo demos from the scripted expert."""

import json
import math

import pytest
import torch
from hydra import compose, initialize_config_module
from robotrl.tasks import TASK_CONFIGS, make_env

from robotrl.agents import make_agent
from robotrl.agents.base import behaviour_cloning_loss
from robotrl.config import register_configs, to_train_config
from robotrl.data import ReplayBuffer
from robotrl.data.mixer import sample_offline
from robotrl.hil.config import HILConfig
from robotrl.hil.setup import load_demos
from robotrl.record import RecordConfig, record
from robotrl.runtime.loop import pretrain_on_demos, train
from robotrl.runtime.metrics import UpdateMetrics, read_metrics

SMALL = ["agent.batch_size=32", "agent.actor_hidden=[64,64]", "agent.critic_hidden=[64,64]"]


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "reach"
    task = TASK_CONFIGS["panda_reach"](name="panda_reach", reward="sparse")
    record(RecordConfig(task=task, teleop="scripted", episodes=4, seed=3, keep="success"), out)
    return out


def _cfg(*overrides):
    register_configs()
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=list(overrides)))


def test_bad_pretrain_settings_are_named():
    with pytest.raises(ValueError, match=r"hil\.pretrain_updates must be >= 0, got -1"):
        HILConfig(pretrain_updates=-1).validate()
    with pytest.raises(ValueError, match=r"hil\.pretrain_updates=5 pretrains on demonstrations, but hil\.demos is"):
        HILConfig(pretrain_updates=5).validate()
    HILConfig(pretrain_updates=5, demos=["somewhere"]).validate()


@pytest.mark.parametrize("agent_name", ["sac", "chunk"])
def test_pretraining_clones_the_demonstrations_with_the_entropy_term(reach_demos, agent_name):
    cfg = _cfg("task=panda_reach", "task.reward=sparse", f"agent={agent_name}", "agent.bc_weight=10.0", *SMALL)
    env = make_env(cfg.task, num_envs=1)
    agent = make_agent(cfg.agent, env.obs_spec, env.action_dim, torch.device("cpu"))
    offline = ReplayBuffer(env.obs_spec, env.action_dim, 1000, 1, n_step=agent.replay_n_step, gamma=cfg.agent.gamma)
    load_demos([str(reach_demos)], offline, env.obs_spec, env.action_dim, task="panda_reach", reward="sparse")
    env.close()
    probe = sample_offline(offline, 256)
    every_row = torch.ones(256, dtype=torch.bool)

    def imitation_error() -> float:
        with torch.no_grad():
            mode = agent.actor(agent.encoder(probe.obs)).mode
            recorded = agent.policy_action(probe)
            return float(behaviour_cloning_loss(mode, recorded, agent.recorded_entries(probe, every_row)))

    before, log_alpha = imitation_error(), agent.log_alpha.detach().clone()
    one = agent.pretrain_update(sample_offline(offline, 32))  # the actor's loss: BC and the entropy term, no Q
    expected = 10.0 * one["bc_loss"] - one["alpha"] * one["entropy"]  # agent.bc_weight=10
    assert math.isclose(one["actor_loss"], expected, rel_tol=1e-5, abs_tol=1e-6)
    metrics = UpdateMetrics()
    pretrain_on_demos(agent, offline, 299, 32, metrics)
    assert agent.num_updates == 300 and {"bc_loss", "critic_loss", "q_mean", "alpha_loss"} <= set(metrics.flush(0))
    assert imitation_error() < 0.3 * before
    assert not torch.equal(agent.log_alpha, log_alpha)  # the temperature learns during pretraining
    with pytest.raises(ValueError, match=r"hil\.pretrain_updates=1: the demonstrations hold \d+ transitions, fewer"):
        pretrain_on_demos(agent, offline, 1, len(offline) + 1, metrics)


def test_a_pretrained_run_acts_with_its_policy_from_the_first_step(tmp_path, reach_demos):
    common = [
        "task=panda_reach",
        "task.reward=sparse",
        f"hil.demos=[{reach_demos}]",
        "agent.bc_weight=10.0",
        *SMALL,
        "total_steps=200",
        "learning_starts=150",
        "log_interval=100",
        "eval_interval=100000",
        "eval_episodes=1",
        "checkpoint_interval=100000",
        "checkpoint_replay=false",
        "video=false",
        "progress=false",
    ]
    runs = {}
    for pretrain in (0, 40):
        run_dir = tmp_path / f"pretrain_{pretrain}"
        train(_cfg(*common, f"hil.pretrain_updates={pretrain}"), run_dir)
        runs[pretrain] = (read_metrics(run_dir / "metrics.csv"), json.loads((run_dir / "summary.json").read_text()))
    (plain, plain_summary), (pretrained, pretrained_summary) = runs[0], runs[40]
    online_updates = plain_summary["updates"]
    assert online_updates > 0 and pretrained_summary["updates"] == online_updates + 40
    assert pretrained["critic_loss"][0][0] == 0  # the pretraining's losses, logged at step 0
    assert "critic_loss" not in plain or plain["critic_loss"][0][0] > 0
    # the policy's own exploration actions before learning_starts: only in the pretrained run
    assert pretrained["train/action_sq_diff"][0][0] == 100
    assert all(step > 100 for step, _ in plain.get("train/action_sq_diff", []))
