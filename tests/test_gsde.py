"""gSDE: the distribution against its analytic form, the actor's noise clock, and SAC exploring with it."""

import json
import math

import pytest
import torch
from helpers import TINY, run_module
from robotrl.tasks.configs import GymTaskConfig

from robotrl.agents import SAC, SACConfig
from robotrl.config import TrainConfig
from robotrl.data import Batch, TensorSpec
from robotrl.nn import GSDE, GSDENoise
from robotrl.nn.gsde import expln
from robotrl.runtime.loop import train
from robotrl.runtime.metrics import read_metrics
from robotrl.runtime.smoothness import mean_squared_difference

SPEC = {"state": TensorSpec((5,))}
LATENT, ACT = 6, 3


def _gsde(full_std=True, use_expln=True, learn_features=False):
    gsde = GSDE(LATENT, ACT, full_std=full_std, use_expln=use_expln, learn_features=learn_features)
    with torch.no_grad():  # spread both sides of 0, where expln switches branch
        gsde.log_std.copy_(0.7 * torch.randn_like(gsde.log_std) - 0.5)
    return gsde


def _std_and_its_derivative(log_std, use_expln):
    if not use_expln:
        return log_std.exp(), log_std.exp()
    std = torch.where(log_std <= 0, log_std.exp(), torch.log1p(log_std.clamp(min=0)) + 1)
    dstd = torch.where(log_std <= 0, log_std.exp(), 1 / (1 + log_std.clamp(min=0)))
    return std, dstd


def _agent(num_envs=1, **cfg):
    cfg = {"exploration": "gsde", "actor_hidden": [16, 16], "critic_hidden": [16, 16], **cfg}
    agent = SAC(SACConfig(**cfg), SPEC, ACT)
    agent.reset_exploration(num_envs)
    return agent


def _batch(n=32):
    obs, nxt = {"state": torch.randn(n, 5)}, {"state": torch.randn(n, 5)}
    return Batch(obs, torch.rand(n, ACT) * 2 - 1, torch.randn(n, 1), torch.full((n, 1), 0.99), nxt)


# --- the distribution ------------------------------------------------------------------------------


@pytest.mark.parametrize("full_std", [True, False])
@pytest.mark.parametrize("use_expln", [True, False])
def test_log_prob_matches_the_analytic_density(full_std, use_expln):
    gsde = _gsde(full_std, use_expln)
    latent, mean = 0.3 * torch.randn(64, LATENT).relu(), 0.5 * torch.randn(64, ACT)
    dist = gsde.distribution(mean, latent)
    action, log_prob = dist.rsample_with_log_prob()

    std, _ = _std_and_its_derivative(gsde.log_std.detach(), use_expln)
    variance = latent.pow(2) @ std.expand(LATENT, ACT).pow(2) + 1e-6
    reference = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, variance.sqrt()), [torch.distributions.TanhTransform(cache_size=1)]
    )
    torch.testing.assert_close(log_prob.squeeze(-1), reference.log_prob(action).sum(-1), rtol=1e-4, atol=1e-4)
    # by hand, in float64, at pre-tanh values far into tanh's saturation too
    u = mean.double() + 3 * variance.double().sqrt() * torch.randn(64, ACT, dtype=torch.float64)
    by_hand = (
        -0.5 * (u - mean.double()).pow(2) / variance.double()
        - 0.5 * torch.log(2 * math.pi * variance.double())
        - torch.log(1 - torch.tanh(u).pow(2))
    ).sum(-1)
    torch.testing.assert_close(dist.log_prob_pre_tanh(u.float()).squeeze(-1).double(), by_hand, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("full_std", [True, False])
@pytest.mark.parametrize("use_expln", [True, False])
def test_log_prob_gradient_matches_the_analytic_derivative(full_std, use_expln):
    """d log pi / d mean and d log pi / d log_std at actions explored with held noise matrices (as the
    replay buffer stores them), against the chain rule written out (cf. Rueckstiess et al. 2008)."""
    gsde = _gsde(full_std, use_expln)
    latent = torch.rand(128, LATENT)
    mean = (0.3 * torch.randn(128, ACT)).requires_grad_()
    pre_tanh = (mean + GSDE.noise(latent, gsde.sample_matrices(128))).detach()
    gsde.distribution(mean, latent).log_prob_pre_tanh(pre_tanh).mean().backward()

    log_std = gsde.log_std.detach()
    std, dstd = _std_and_its_derivative(log_std, use_expln)
    std, dstd = std.expand(LATENT, ACT), dstd.expand(LATENT, ACT)
    variance = latent.pow(2) @ std.pow(2) + 1e-6  # [B, A]
    residual = pre_tanh - mean.detach()
    dlogp_dvariance = (residual.pow(2) - variance) / (2 * variance.pow(2))  # [B, A]
    # variance[b, j] = sum_i latent[b, i]^2 std[i, j]^2  =>  d/d std[i, j] = 2 latent[b, i]^2 std[i, j]
    grad_std = 2 * std * (latent.pow(2).T @ dlogp_dvariance) / latent.shape[0]  # [L, A]
    grad_log_std = grad_std * dstd
    if not full_std:
        grad_log_std = grad_log_std.sum(-1, keepdim=True)
    torch.testing.assert_close(gsde.log_std.grad, grad_log_std, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(mean.grad, residual / variance / latent.shape[0], rtol=1e-4, atol=1e-6)


def test_noise_matrices_have_the_variance_the_log_prob_assumes():
    gsde = _gsde()
    latent = torch.rand(1, LATENT).expand(20_000, -1)
    noise = GSDE.noise(latent, gsde.sample_matrices(20_000))
    torch.testing.assert_close(noise.var(0), gsde.variance(latent[:1])[0] - 1e-6, rtol=0.05, atol=1e-6)
    assert noise.mean(0).abs().max() < 0.05 * noise.std(0).max()


def test_features_are_detached_unless_learned():
    for learn in (False, True):
        gsde = _gsde(learn_features=learn)
        latent = torch.rand(8, LATENT, requires_grad=True)
        gsde.distribution(torch.zeros(8, ACT), latent).rsample_with_log_prob()[1].sum().backward()
        assert (latent.grad is not None) == learn


def test_expln_is_exp_below_zero_and_logarithmic_above():
    x = torch.tensor([-3.0, -0.5, 0.0, 0.5, 1000.0])
    expected = [math.exp(-3), math.exp(-0.5), 1.0, math.log(1.5) + 1, math.log(1001) + 1]
    torch.testing.assert_close(expln(x), torch.tensor(expected))
    x = torch.linspace(-2, 2, 41, requires_grad=True)
    expln(x).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad > 0).all()


def test_gsde_rejects_bad_shapes_and_sizes():
    gsde = _gsde()
    with pytest.raises(ValueError, match=r"latent features must have shape \[B, 6\]"):
        gsde.variance(torch.rand(4, 5))
    with pytest.raises(ValueError, match=r"mean must have shape \[4, 3\]"):
        gsde.distribution(torch.zeros(4, 2), torch.rand(4, LATENT))
    with pytest.raises(ValueError, match="latent_dim"):
        GSDE(0, 2)
    with pytest.raises(ValueError, match="sde_sample_freq"):
        GSDENoise(gsde, 2, 0, seed=0)


# --- the actor's clock -----------------------------------------------------------------------------


def test_noise_is_held_between_resamples_and_changes_after():
    agent = _agent(num_envs=1, sde_sample_freq=4)
    obs = {"state": torch.randn(1, 5)}
    actions = []
    for _ in range(12):
        actions.append(agent.act(obs))
        agent.advance_exploration(torch.tensor([False]))
    runs = [actions[0:4], actions[4:8], actions[8:12]]
    assert all(torch.equal(a, run[0]) for run in runs for a in run)  # 4 actions on one matrix...
    assert not torch.equal(runs[0][0], runs[1][0]) and not torch.equal(runs[1][0], runs[2][0])  # ...then a new one


def test_learner_updates_never_resample():
    agent = _agent(num_envs=2, sde_sample_freq=3)
    held = agent.exploration.matrices.clone()
    for _ in range(5):
        agent.update(_batch())
    assert torch.equal(agent.exploration.matrices, held)
    assert agent.exploration.steps_on_matrix.tolist() == [0, 0]


def test_clock_resamples_every_sample_freq_steps_and_at_episode_start_only():
    agent = _agent(num_envs=3, sde_sample_freq=5)
    obs = {"state": torch.randn(1, 5).expand(3, -1)}
    first = agent.act(obs)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])  # one matrix per env

    def step(*starts):
        before = agent.exploration.matrices.clone()
        agent.advance_exploration(torch.tensor(starts))
        return [not torch.equal(before[e], agent.exploration.matrices[e]) for e in range(3)]

    assert step(False, True, False) == [False, True, False]  # env 1's episode starts: only it resamples
    assert step(False, False, False) == [False, False, False]
    assert step(False, False, False) == [False, False, False]
    assert step(False, False, False) == [False, False, False]
    assert step(False, False, False) == [True, False, True]  # envs 0 and 2 acted 5 times on theirs
    assert step(False, False, False) == [False, True, False]  # env 1, 5 steps after its episode start
    held = agent.act(obs)
    assert torch.equal(held, agent.act(obs))  # acting alone never advances the clock


def test_explicit_resample_for_deployment():
    agent = _agent(num_envs=3)
    before = agent.exploration.matrices.clone()
    agent.exploration.resample([2])
    changed = [not torch.equal(before[e], agent.exploration.matrices[e]) for e in range(3)]
    assert changed == [False, False, True]
    agent.exploration.resample()
    assert not torch.equal(before[0], agent.exploration.matrices[0])
    with pytest.raises(ValueError, match=r"env_ids must be in \[0, 3\)"):
        agent.exploration.resample([3])
    with pytest.raises(ValueError, match=r"episode_start must be a bool tensor of shape \[3\]"):
        agent.advance_exploration(torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"reset_exploration\(num_envs\)"):
        agent.act({"state": torch.randn(2, 5)})


def test_actions_are_tanh_of_mean_plus_latent_times_the_held_matrix():
    agent = _agent(num_envs=2)
    obs = {"state": torch.randn(2, 5)}
    latent, mean = agent.actor.latent_and_mean(agent.encoder(obs))
    noise = torch.einsum("el,ela->ea", latent, agent.exploration.matrices)
    torch.testing.assert_close(agent.act(obs), torch.tanh(mean + noise))


def test_evaluation_is_deterministic_and_leaves_the_noise_alone():
    agent = _agent(num_envs=2)
    obs = {"state": torch.randn(2, 5)}
    held = agent.exploration.matrices.clone()
    a, b = agent.act(obs, deterministic=True), agent.act(obs, deterministic=True)
    assert torch.equal(a, b) and torch.equal(a, torch.tanh(agent.actor.latent_and_mean(agent.encoder(obs))[1]))
    assert torch.equal(agent.exploration.matrices, held)


def test_seeded_exploration_is_reproducible():
    def run():
        torch.manual_seed(5)
        agent = _agent(num_envs=2, sde_sample_freq=2)
        obs = {"state": torch.randn(2, 5)}
        out = []
        for _ in range(5):
            out.append(agent.act(obs))
            agent.advance_exploration(torch.tensor([False, False]))
        return torch.stack(out)

    assert torch.equal(run(), run())


def test_held_noise_is_smoother_than_noise_resampled_every_step():
    # Same marginal noise; only the clock differs. Observations drift smoothly, as a robot's do.
    path = torch.linspace(0, 1, 64)[:, None] * torch.randn(1, 5) + torch.randn(1, 5)
    starts = torch.zeros(64, 1, dtype=torch.bool)
    diffs = {}
    for freq in (1, 64):
        torch.manual_seed(0)
        agent = _agent(num_envs=1, sde_sample_freq=freq, log_std_init=-1.0)
        actions = []
        for t in range(64):
            actions.append(agent.act({"state": path[t : t + 1]}))
            agent.advance_exploration(torch.tensor([False]))
        diffs[freq] = float(mean_squared_difference(torch.stack(actions), starts))
    assert diffs[64] < 0.05 * diffs[1], diffs


# --- SAC learning with gSDE ------------------------------------------------------------------------


@pytest.mark.parametrize("use_expln", [True, False])
def test_std_stays_finite_under_long_training_with_large_gradients(use_expln):
    # A huge fixed temperature and learning rate push the entropy (so the std) up as hard as they can.
    agent = _agent(num_envs=4, use_expln=use_expln, learn_alpha=False, init_alpha=1e4, actor_lr=0.5, batch_size=16)
    batch, obs = _batch(16), {"state": torch.randn(4, 5)}
    for t in range(300):
        agent.update(batch)
        if t % 50 == 0:
            agent.advance_exploration(torch.ones(4, dtype=torch.bool))
    # tanh's saturation stops the entropy gradient early; a parameter that drifted anyway must not
    # overflow either: exp(60)^2 is inf in float32
    with torch.no_grad():
        agent.actor.gsde.log_std.add_(60.0)
    metrics = agent.update(batch)
    gsde = agent.actor.gsde
    assert torch.isfinite(gsde.std()).all() and torch.isfinite(gsde.variance(torch.rand(4, 16) * 10)).all()
    assert all(torch.isfinite(v) for v in metrics.values()), metrics
    assert all(torch.isfinite(p).all() for p in agent.parameters())
    agent.exploration.resample()
    action = agent.act(obs)
    assert torch.isfinite(action).all() and action.abs().max() <= 1


def test_bf16_gsde_keeps_fp32_weights_and_finite_outputs():
    agent = _agent(num_envs=2, precision="bf16")
    metrics = agent.update(_batch())
    assert all(p.dtype == torch.float32 for p in agent.parameters())
    assert all(torch.isfinite(v) for v in metrics.values())
    assert agent.act({"state": torch.randn(2, 5)}).dtype == torch.float32


def test_gaussian_agents_have_no_exploration_state():
    agent = SAC(SACConfig(), SPEC, ACT)
    agent.reset_exploration(3)
    agent.advance_exploration(torch.ones(3, dtype=torch.bool))
    assert agent.exploration is None


def test_bad_exploration_settings_are_named():
    with pytest.raises(ValueError, match=r"agent\.sde_sample_freq must be >= 1, got 0"):
        SAC(SACConfig(exploration="gsde", sde_sample_freq=0), SPEC, ACT)
    with pytest.raises(ValueError, match=r"agent\.exploration must be one of gaussian, gsde, got 'ou'"):
        SAC(SACConfig(exploration="ou"), SPEC, ACT)
    with pytest.raises(ValueError, match=r"agent\.log_std_init must be finite"):
        SAC(SACConfig(exploration="gsde", log_std_init=math.inf), SPEC, ACT)
    with pytest.raises(ValueError, match=r"agent\.clip_mean must be a finite number >= 0.0, got -1"):
        SAC(SACConfig(exploration="gsde", clip_mean=-1.0), SPEC, ACT)


def test_clip_mean_holds_the_pre_tanh_mean_so_noise_still_moves_the_action():
    agent = _agent(num_envs=4, clip_mean=0.5)
    with torch.no_grad():  # a mean head driven far into tanh's tails
        agent.actor.net.head.bias.fill_(50.0)
    obs = {"state": torch.randn(4, 5)}
    features = agent.encoder(obs)
    _, mean = agent.actor.latent_and_mean(features)
    assert torch.equal(mean, torch.full_like(mean, 0.5))
    assert torch.allclose(agent.act(obs, deterministic=True), torch.tanh(torch.tensor(0.5)).expand(4, ACT))
    explored = agent.act(obs)
    assert (explored - math.tanh(0.5)).abs().max() > 1e-3  # unclipped, tanh(50 + noise) is 1.0 everywhere
    unclipped = _agent(num_envs=4)
    with torch.no_grad():
        unclipped.actor.net.head.bias.fill_(50.0)
    assert torch.equal(unclipped.act(obs), torch.ones(4, ACT))


def test_train_with_gsde_logs_smoothness_and_bad_frequency_fails_at_start(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [a for a in TINY if not a.startswith("total_steps")]
    run_module(
        "robotrl.train",
        *overrides,
        "total_steps=400",
        "agent.exploration=gsde",
        "agent.sde_sample_freq=8",
        "video=false",
        f"hydra.run.dir={run_dir}",
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 400 and math.isfinite(summary["eval/return"])
    series = read_metrics(run_dir / "metrics.csv")
    assert {"train/action_sq_diff", "train/action_high_freq_share", "eval/action_sq_diff", "actor_loss"} <= set(series)
    assert min(s for s, _ in series["train/action_sq_diff"]) > 200  # only the policy's actions, not warm-up

    proc = run_module("robotrl.train", *TINY, "agent.exploration=gsde", "agent.sde_sample_freq=0", check=False)
    assert proc.returncode != 0 and "agent.sde_sample_freq must be >= 1" in proc.stderr + proc.stdout


def test_a_gsde_run_drives_the_clock_and_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    # Noise matrices are not checkpointed: the resumed actor draws fresh ones as its envs restart.
    advances = []
    advance = GSDENoise.advance
    monkeypatch.setattr(GSDENoise, "advance", lambda self, starts: advances.append(starts) or advance(self, starts))
    cfg = TrainConfig(
        agent=SACConfig(exploration="gsde", actor_hidden=[16, 16], critic_hidden=[16, 16], batch_size=16),
        task=GymTaskConfig(max_episode_steps=50),
        total_steps=200,
        learning_starts=100,
        num_envs=2,
        log_interval=100,
        eval_interval=10**9,
        eval_episodes=1,
        checkpoint_interval=10**9,
        replay_capacity=1000,
        video=False,
        progress=False,
    )
    train(cfg, tmp_path)
    assert len(advances) == 100 and all(s.shape == (2,) for s in advances)  # once per env step, never per update
    assert sum(int(s.sum()) for s in advances) == 4  # 100 steps per env: each env ends 2 episodes of 50
    cfg.total_steps = 300
    summary = train(cfg, tmp_path, resume=True)
    assert summary["env_steps"] == 300 and summary["updates"] == 200
    assert [s for s, _ in read_metrics(tmp_path / "metrics.csv")["train/action_sq_diff"]] == [200, 300]
