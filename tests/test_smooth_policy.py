"""agent.smoothness_weight: the actor's temporal smoothness term (CAPS), its value, its effect, its settings."""

import math

import pytest
import torch
from helpers import TINY, run_module

from robotrl.agents import SAC, ChunkConfig, ChunkCritic, SACConfig
from robotrl.data import Batch, TensorSpec

SPEC = {"state": TensorSpec((6,))}


def _batch(n: int = 64, generator: torch.Generator | None = None) -> Batch:
    obs = torch.randn(n, 6, generator=generator)
    next_obs = obs + 0.5 * torch.randn(n, 6, generator=generator)  # a step on: close, not equal
    action = torch.rand(n, 2, generator=generator) * 2 - 1
    reward = torch.randn(n, 1, generator=generator)
    return Batch({"state": obs}, action, reward, torch.full((n, 1), 0.99), {"state": next_obs})


def _mode_change(agent: SAC, batch: Batch) -> float:
    with torch.no_grad():
        now = agent.actor(agent.encoder(batch.obs)).mode
        after = agent.actor(agent.encoder(batch.next_obs)).mode
    return (now - after).pow(2).mean().item()


@pytest.mark.parametrize("exploration", ["gaussian", "gsde"])
def test_the_logged_term_is_the_mean_squared_change_of_the_deterministic_action(exploration):
    torch.manual_seed(0)
    agent = SAC(
        SACConfig(actor_hidden=[32], critic_hidden=[32], smoothness_weight=2.0, exploration=exploration), SPEC, 2
    )
    batch = _batch()
    expected = _mode_change(agent, batch)  # the update measures before its optimizer step
    metrics = agent.update(batch)
    assert expected > 0
    assert metrics["smoothness_loss"].item() == pytest.approx(expected, rel=1e-5)


def test_without_a_weight_nothing_is_computed_or_logged():
    agent = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32]), SPEC, 2)
    assert "smoothness_loss" not in agent.update(_batch())


def test_the_term_makes_the_policy_smoother_than_the_same_run_without_it():
    changes = {}
    for weight in (0.0, 10.0):
        torch.manual_seed(0)
        agent = SAC(SACConfig(actor_hidden=[64, 64], critic_hidden=[64, 64], smoothness_weight=weight), SPEC, 2)
        data = torch.Generator().manual_seed(1)
        for _ in range(150):
            agent.update(_batch(generator=data))
        changes[weight] = _mode_change(agent, _batch(1024, torch.Generator().manual_seed(2)))
    assert changes[10.0] < 0.2 * changes[0.0], changes


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_a_bad_weight_is_named(bad):
    with pytest.raises(ValueError, match=r"agent\.smoothness_weight must be a finite number >= 0"):
        SAC(SACConfig(smoothness_weight=bad), SPEC, 2)


def test_the_chunk_critic_refuses_it_by_name():
    with pytest.raises(ValueError, match=r"agent=chunk: agent\.smoothness_weight"):
        ChunkCritic(ChunkConfig(smoothness_weight=1.0), SPEC, 2)


def test_a_training_run_logs_the_term(tmp_path):
    run_dir = tmp_path / "run"
    run_module("robotrl.train", *TINY, "agent.smoothness_weight=1.0", f"hydra.run.dir={run_dir}")
    lines = [line for line in (run_dir / "metrics.csv").read_text().splitlines() if ",smoothness_loss," in line]
    assert lines and all(math.isfinite(float(line.split(",")[2])) for line in lines)
