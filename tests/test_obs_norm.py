"""Observation normalisation (`agent.obs_norm`): the running statistics, the agents that use them, and that
checkpoints, published weights and a real training run carry them."""

import json

import pytest
import torch
from helpers import TINY, run_module
from safetensors.torch import load_file

from robotrl.agents import BC, SAC, BCConfig, ChunkConfig, ChunkCritic, DrQv2, DrQv2Config, SACConfig
from robotrl.agents.config import EncoderConfig
from robotrl.data import Batch, TensorSpec
from robotrl.data.replay import SequenceBatch
from robotrl.nn import RunningNormalizer, StateEncoder
from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from robotrl.runtime.transport.weights import load_policy_state, policy_state

# A gripper position in metres beside a joint velocity in rad/s and a force in newtons: scales 1e-2 .. 1e2.
SCALES = torch.tensor([0.01, 0.01, 0.01, 3.0, 3.0, 200.0])
OFFSETS = torch.tensor([0.5, 0.0, 0.2, 0.0, 1.0, -50.0])
SPEC = {"ee": TensorSpec((3,)), "rest": TensorSpec((3,))}


def _obs(n: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    x = OFFSETS + SCALES * torch.randn(n, 6, generator=generator)
    return {"ee": x[:, :3], "rest": x[:, 3:]}


def _batch(n: int = 64) -> Batch:
    return Batch(_obs(n), torch.rand(n, 2) * 2 - 1, torch.randn(n, 1), torch.full((n, 1), 0.99), _obs(n))


def test_merged_statistics_equal_those_of_all_rows_at_once():
    norm = RunningNormalizer(4)
    parts = [torch.randn(n, 4) * torch.tensor([1e-3, 1.0, 10.0, 1e3]) + 7.0 for n in (1, 5, 256, 33)]
    for part in parts:
        norm.observe(part)
    rows = torch.cat(parts)
    assert norm.count.item() == rows.shape[0]
    torch.testing.assert_close(norm.mean, rows.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var, rows.var(0, unbiased=False), rtol=1e-4, atol=1e-9)


def test_identity_until_observed_then_standardised_and_clipped():
    norm = RunningNormalizer(2, clip=5.0)
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    assert torch.equal(norm(x), x)
    data = torch.randn(4096, 2) * torch.tensor([0.01, 100.0]) + torch.tensor([1.0, -5.0])
    norm.observe(data)
    out = norm(data)
    torch.testing.assert_close(out.mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.std(0), torch.ones(2), atol=1e-3, rtol=0)
    far = norm(torch.tensor([[1e6, -1e6]]))
    assert torch.equal(far, torch.tensor([[5.0, -5.0]]))


def test_non_finite_rows_are_left_out_and_a_batch_of_only_those_changes_nothing():
    norm, clean = RunningNormalizer(3), RunningNormalizer(3)
    good = torch.randn(10, 3)
    bad = torch.tensor([[float("nan"), 0.0, 0.0], [0.0, float("inf"), 0.0]])
    norm.observe(torch.cat([good[:4], bad, good[4:]]))
    clean.observe(good)
    assert norm.count.item() == 10
    torch.testing.assert_close(norm.mean, clean.mean)
    torch.testing.assert_close(norm.var, clean.var)
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    norm.observe(bad)
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())
    fresh = RunningNormalizer(3)
    fresh.observe(bad)  # nothing finite ever seen: still the identity
    assert torch.equal(fresh(good), good)


def test_bad_normalizer_settings_are_named():
    with pytest.raises(ValueError, match="dim=0"):
        RunningNormalizer(0)
    with pytest.raises(ValueError, match="clip must be > 0, got 0"):
        RunningNormalizer(3, clip=0.0)
    with pytest.raises(ValueError, match="eps must be > 0"):
        RunningNormalizer(3, eps=0.0)
    with pytest.raises(ValueError, match=r"takes \[N, 3\] features, got \[4, 2\]"):
        RunningNormalizer(3).observe(torch.zeros(4, 2))


def test_without_obs_norm_an_encoder_has_no_statistics_so_earlier_checkpoints_still_load():
    assert not any("normalizer" in k for k in SAC(SACConfig(), SPEC, 2).state_dict())
    encoder = StateEncoder(SPEC)
    obs = _obs(5)
    encoder.observe(obs)
    assert torch.equal(encoder(obs), torch.cat([obs["ee"], obs["rest"]], -1))


def test_sac_update_folds_its_batch_in_and_feeds_the_networks_standardised_features():
    agent = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32], obs_norm=True), SPEC, 2)
    for _ in range(20):
        agent.update(_batch())
    normalizer = agent.encoder.normalizer
    assert normalizer.count.item() == 20 * 64
    features = agent.encoder(_obs(4096))
    assert features.std(0).sub(1).abs().max() < 0.15, features.std(0)
    assert features.mean(0).abs().max() < 0.15, features.mean(0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChunkCritic(ChunkConfig(actor_hidden=[16], critic_hidden=[16], chunk_len=3, obs_norm=True), SPEC, 2),
        lambda: BC(BCConfig(hidden=[16], obs_norm=True), SPEC, 2),
    ],
    ids=["chunk", "bc"],
)
def test_chunk_critic_and_bc_fold_their_batches_in(make):
    agent = make()
    if isinstance(agent, ChunkCritic):
        n = 16
        batch = SequenceBatch(
            _obs(n),
            torch.zeros(n, 2),
            torch.zeros(n, 1),
            torch.full((n, 1), 0.9),
            _obs(n),
            actions=torch.zeros(n, 3, 2),
            rewards=torch.zeros(n, 3),
            valid=torch.ones(n, 3, dtype=torch.bool),
            cut=torch.zeros(n, dtype=torch.bool),
        )
    else:
        batch = _batch(16)
    agent.update(batch)
    assert agent.encoder.normalizer.count.item() == 16
    assert agent.act(_obs(3), deterministic=True).shape == (3, 2)


def test_drqv2_normalises_the_state_entries_beside_its_pixels():
    spec = {"pixels": TensorSpec((9, 32, 32), torch.uint8), "ee": TensorSpec((3,))}
    cfg = DrQv2Config(
        hidden=[16], obs_norm=True, batch_size=8, encoder=EncoderConfig(conv_channels=4, conv_layers=2, feature_dim=8)
    )
    agent = DrQv2(cfg, spec, 2)

    def obs(n):
        return {"pixels": torch.randint(0, 255, (n, 9, 32, 32), dtype=torch.uint8), "ee": 0.01 * torch.randn(n, 3)}

    agent.update(Batch(obs(8), torch.zeros(8, 2), torch.zeros(8, 1), torch.full((8, 1), 0.99), obs(8)))
    assert agent.encoder.state.normalizer.count.item() == 8


def _trained_agent() -> SAC:
    torch.manual_seed(0)
    agent = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32], obs_norm=True), SPEC, 2)
    for _ in range(5):
        agent.update(_batch())
    return agent


def test_checkpoints_and_published_weights_carry_the_statistics(tmp_path):
    agent = _trained_agent()
    probe = _obs(8, torch.Generator().manual_seed(1))
    expected = agent.act(probe, deterministic=True)

    save_checkpoint(tmp_path, 5, agent, None, {"env_step": 5})
    restored = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32], obs_norm=True), SPEC, 2)
    load_checkpoint(latest_checkpoint(tmp_path), restored)
    assert restored.encoder.normalizer.count.item() == 5 * 64
    torch.testing.assert_close(restored.act(probe, deterministic=True), expected)

    actor_side = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32], obs_norm=True), SPEC, 2)
    load_policy_state(actor_side, policy_state(agent))
    torch.testing.assert_close(actor_side.encoder.normalizer.mean, agent.encoder.normalizer.mean)
    torch.testing.assert_close(actor_side.act(probe, deterministic=True), expected)


def test_a_training_run_with_obs_norm_saves_statistics_that_evaluation_uses(tmp_path):
    run_dir = tmp_path / "run"
    run_module("robotrl.train", *TINY, "agent.obs_norm=true", f"hydra.run.dir={run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 400
    tensors = load_file(str(latest_checkpoint(run_dir / "checkpoints") / "agent.safetensors"))
    assert tensors["encoder.normalizer.count"].item() == 400 * 32  # every training batch, nothing else
    assert (tensors["encoder.normalizer.var"] > 0).all()
    proc = run_module("robotrl.eval", f"run={run_dir}", "episodes=1", "video=false")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["episodes"] == 1
