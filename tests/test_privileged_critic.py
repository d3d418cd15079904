"""An asymmetric critic (randomization.privileged=true): the env adds the drawn physics as an observation entry, SAC's
critic reads it and its actor never does, and a run's evaluation and export rebuild the policy without it."""

from __future__ import annotations

import json

import pytest
import torch
from robotrl.sim2real.randomization import RandomizationConfig, RandomizationTerm
from robotrl.tasks import TASK_CONFIGS, make_env

from robotrl.agents import SAC, DrQv2, DrQv2Config, SACConfig
from robotrl.core.spec import PRIVILEGED, TensorSpec
from robotrl.runtime.assembly import add_privileged, add_randomization, privileged_entry

TERMS = {
    "cube_mass": RandomizationTerm(param="body_mass", target="object", low=0.5, high=1.5),
    "stiffness": RandomizationTerm(param="actuator_gain", target="robot", low=0.8, high=1.2, shared=True),
}


def _env(tmp_path, num_envs: int = 3, episode_steps: int = 4):
    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", episode_steps=episode_steps)
    env = make_env(cfg, num_envs=num_envs)
    randomizer = add_randomization(env, RandomizationConfig(name="probe", terms=TERMS, privileged=True), seed=0)
    return add_privileged(env, randomizer, tmp_path), randomizer


def test_the_entry_is_the_drawn_physics_and_a_reset_starts_the_next_episodes(tmp_path):
    env, randomizer = _env(tmp_path)
    try:
        names = json.loads((tmp_path / "privileged.json").read_text())["names"]
        size = env.obs_spec[PRIVILEGED].shape[0]
        assert names[0] == "cube_mass.cube" and names[1].startswith("stiffness.") and len(names) == size
        assert privileged_entry(tmp_path) == {PRIVILEGED: TensorSpec((size,))}
        obs = env.reset(seed=1)
        mass = randomizer.values()["cube_mass"][:, 0]
        nominal = randomizer.terms[0].nominal[0]
        torch.testing.assert_close(obs[PRIVILEGED][:, 0], (mass / nominal - 1).float())
        assert (obs[PRIVILEGED][:, 0].abs() <= 0.5 + 1e-6).all() and obs[PRIVILEGED][:, 0].std() > 0
        stiffness = obs[PRIVILEGED][:, 1:]
        assert torch.allclose(stiffness, stiffness[:, :1].expand_as(stiffness))  # shared: one draw per env
        for _ in range(3):
            result = env.step(torch.zeros(3, env.action_dim))
            torch.testing.assert_close(result.obs[PRIVILEGED], obs[PRIVILEGED])  # held within the episode
        result = env.step(torch.zeros(3, env.action_dim))  # the 4th step ends every episode: a reset draws anew
        assert result.truncated.all()
        torch.testing.assert_close(result.next_obs[PRIVILEGED], obs[PRIVILEGED])  # the physics that step ran under
        assert not torch.allclose(result.obs[PRIVILEGED], obs[PRIVILEGED])  # the next episodes'
    finally:
        env.close()


def test_the_critic_reads_the_entry_and_the_actor_never_does(tmp_path):
    env, _ = _env(tmp_path, num_envs=2)
    try:
        obs = env.reset(seed=0)
        spec = env.obs_spec
    finally:
        env.close()
    agent = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32]), spec, 4)
    assert PRIVILEGED not in agent.obs_spec  # what `act`, export and a robot see
    actor_in = sum(s.shape[0] for k, s in spec.items() if k != PRIVILEGED)
    privileged = spec[PRIVILEGED].shape[0]
    assert agent.critic.hidden[0].in_dim == actor_in + privileged + 4  # features, the physics, the action
    without = {k: v for k, v in obs.items() if k != PRIVILEGED}
    other = {**obs, PRIVILEGED: torch.randn_like(obs[PRIVILEGED])}
    acts = [agent.act(o, deterministic=True) for o in (obs, without, other)]
    assert torch.equal(acts[0], acts[1]) and torch.equal(acts[0], acts[2])
    batch_obs = {k: v.repeat(8, 1) for k, v in obs.items()}
    from robotrl.data.replay import Batch

    batch = Batch(batch_obs, torch.zeros(16, 4), torch.ones(16, 1), torch.full((16, 1), 0.9), batch_obs)
    before = [p.clone() for p in agent.critic.parameters()]
    metrics = agent.update(batch)
    assert torch.isfinite(metrics["critic_loss"]) and any(
        not torch.equal(a, b) for a, b in zip(before, agent.critic.parameters(), strict=True)
    )


def test_agents_without_a_privileged_critic_and_presets_without_terms_are_refused():
    spec = {"state": TensorSpec((5,)), PRIVILEGED: TensorSpec((3,))}
    pixels = {"pixels_front": TensorSpec((9, 64, 64), torch.uint8), PRIVILEGED: TensorSpec((3,))}
    with pytest.raises(ValueError, match="agent=drqv2 has no privileged critic input"):
        DrQv2(DrQv2Config(), pixels, 3)
    with pytest.raises(ValueError, match=r"randomization.privileged=true gives the critic the drawn physics, and "):
        RandomizationConfig(name="none", privileged=True).validate()
    SAC(SACConfig(), spec, 2)  # SAC takes it


def test_a_run_trains_with_it_and_evaluates_and_exports_without_it(tmp_path):
    from hydra import compose, initialize_config_module

    from robotrl.config import EvalConfig, register_configs, to_train_config
    from robotrl.eval import run as evaluate_run
    from robotrl.runtime.loop import train
    from robotrl.runtime.policy_export import export_bundle
    from robotrl.runtime.run_config import save_run_config

    register_configs()
    overrides = [
        "task=panda_reach",
        "randomization=default",
        "randomization.privileged=true",
        "total_steps=300",
        "learning_starts=200",
        "eval_interval=300",
        "eval_episodes=1",
        "checkpoint_interval=300",
        "agent.batch_size=32",
        "agent.actor_hidden=[32,32]",
        "agent.critic_hidden=[32,32]",
        "video=false",
        "progress=false",
    ]
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        composed = compose(config_name="config", overrides=overrides)
    cfg = to_train_config(composed)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_run_config(composed, run_dir)  # as robotrl-train saves it
    summary = train(cfg, run_dir)
    assert summary["updates"] > 0 and (run_dir / "privileged.json").is_file()
    (tmp_path / "eval").mkdir()
    result = evaluate_run(EvalConfig(run=str(run_dir), episodes=1, video=False), tmp_path / "eval")
    assert "return" in result
    _, manifest = export_bundle(run_dir, tmp_path / "bundle", "onnx")
    assert [entry["name"] for entry in manifest["inputs"]] and PRIVILEGED not in json.dumps(manifest["inputs"])
