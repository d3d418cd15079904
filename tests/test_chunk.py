"""Action-chunk critic: sequence sampling, the h-step target, chunk execution, config errors, the CLI."""

import json
import math

import pytest
import torch
from helpers import TINY, run_module
from torch import nn

from robotrl.agents import ChunkConfig, ChunkCritic, make_agent
from robotrl.agents.config import EncoderConfig
from robotrl.data import Batch, ReplayBuffer, TensorSpec
from robotrl.data.replay import SequenceBatch
from robotrl.nn import TanhNormal
from robotrl.nn.chunk_execution import ChunkExecution, ensemble_weights
from robotrl.nn.distributions import TimeCorrelatedTanhNormal

SPEC = {"state": TensorSpec((2,))}


def _add(buf, t, terminated=False, truncated=False):
    """One step whose obs, action and reward encode the step index t (env e: t + 100 e)."""
    value = t + 100.0 * torch.arange(buf.num_envs, dtype=torch.float32)
    n = buf.num_envs
    buf.add(
        {"state": torch.stack([value, torch.zeros(n)], 1)},
        value.unsqueeze(1),
        value,
        {"state": torch.stack([value + 0.5, torch.zeros(n)], 1)},
        torch.full((n,), terminated),
        torch.full((n,), truncated),
    )


def _at(buf, rows, length, env=0):
    rows = torch.tensor(rows)
    return buf.sequences_at(rows, torch.full_like(rows, env), length)


# ---- sequence sampling --------------------------------------------------------------------------------


def test_sequences_stop_at_episode_ends_pad_the_actions_and_mask_the_rewards():
    g = 0.5
    buf = ReplayBuffer(SPEC, 1, capacity=100, gamma=g)
    # episode A: steps 0, 1, 2 (terminated at 2); B: 3, 4 (truncated at 4); C: 5, 6, 7 (still running)
    for t in range(8):
        _add(buf, t, terminated=t == 2, truncated=t == 4)
    s = _at(buf, [0, 1, 2, 3, 4, 5, 6, 7], 3)
    assert s.actions.shape == (8, 3, 1) and s.valid.shape == (8, 3)
    assert s.valid.tolist() == [
        [True, True, True],
        [True, True, False],  # ends with the termination at step 2
        [True, False, False],
        [True, True, False],  # ends with the truncation at step 4
        [True, False, False],
        [True, True, True],
        [True, True, False],  # the newest stored step is 7: nothing after it
        [True, False, False],
    ]
    assert s.actions[:, :, 0].tolist() == [
        [0, 1, 2],
        [1, 2, 2],
        [2, 2, 2],
        [3, 4, 4],
        [4, 4, 4],
        [5, 6, 7],
        [6, 7, 7],
        [7, 7, 7],
    ]
    assert s.rewards.tolist() == [
        [0, 1, 2],
        [1, 2, 0],
        [2, 0, 0],
        [3, 4, 0],
        [4, 0, 0],
        [5, 6, 7],
        [6, 7, 0],
        [7, 0, 0],
    ]
    expected_reward = [0 + g * 1 + g**2 * 2, 1 + g * 2, 2, 3 + g * 4, 4, 5 + g * 6 + g**2 * 7, 6 + g * 7, 7]
    torch.testing.assert_close(s.reward[:, 0], torch.tensor(expected_reward))
    expected_discount = [0, 0, 0, g**2, g, g**3, g**2, g]  # termination: none; truncation: bootstrap
    torch.testing.assert_close(s.discount[:, 0], torch.tensor(expected_discount))
    assert s.next_obs["state"][:, 0].tolist() == [2.5, 2.5, 2.5, 4.5, 4.5, 7.5, 7.5, 7.5]
    assert s.obs["state"][:, 0].tolist() == list(range(8)) and torch.equal(s.action, s.actions[:, 0])
    # short of 3 steps without a termination: cut by the time limit (3, 4) or the newest stored step (6, 7)
    assert s.cut.tolist() == [False, False, False, True, True, False, True, True]


def test_sequences_across_the_ring_wrap_never_reach_overwritten_rows():
    g = 0.9
    buf = ReplayBuffer(SPEC, 1, capacity=4, gamma=g)
    for t in range(6):  # rows now hold steps 4, 5, 2, 3
        _add(buf, t)
    s = _at(buf, [2, 3, 0, 1], 3)  # steps 2, 3, 4, 5
    assert s.actions[:, :, 0].tolist() == [[2, 3, 4], [3, 4, 5], [4, 5, 5], [5, 5, 5]]
    assert s.valid.sum(1).tolist() == [3, 3, 2, 1]
    torch.testing.assert_close(s.discount[:, 0], torch.tensor([g**3, g**3, g**2, g]))
    assert s.next_obs["state"][:, 0].tolist() == [4.5, 5.5, 5.5, 5.5]
    assert s.cut.tolist() == [False, False, True, True]
    # longer than the ring: still only the stored steps of the episode
    long = _at(buf, [2], 7)
    assert long.valid.sum().item() == 4 and long.actions[0, :, 0].tolist() == [2, 3, 4, 5, 5, 5, 5]


def test_sampled_sequences_follow_each_env_and_match_the_n_step_batch():
    buf = ReplayBuffer(SPEC, 1, capacity=40, num_envs=2, n_step=3, gamma=0.9)
    for t in range(10):
        _add(buf, t, terminated=t == 4)
    s = buf.sample_sequences(500, 3)
    start = s.obs["state"][:, 0]
    # every kept step is the start's own successor in its own env: start + k
    kept = torch.where(s.valid, s.actions[:, :, 0], start.unsqueeze(1) + torch.arange(3))
    assert torch.equal(kept, start.unsqueeze(1) + torch.arange(3))
    torch.manual_seed(0)
    nstep = buf.sample(64)
    torch.manual_seed(0)
    seq = buf.sample_sequences(64, 3)
    assert isinstance(nstep, SequenceBatch)
    for name in ("action", "reward", "discount", "actions", "valid"):
        assert torch.equal(getattr(nstep, name), getattr(seq, name)), name
    with pytest.raises(ValueError, match="sequence length"):
        buf.sample_sequences(4, 0)


# ---- the h-step target --------------------------------------------------------------------------------


class _ValueOfFirstFeature(nn.Module):
    """A stand-in target critic: Q(s, chunk) = 10 * s[0] for every member, whatever the chunk."""

    def forward(self, x, frozen=False):
        return (10.0 * x[:, :1]).expand(2, -1, -1)


class _Unused(nn.Module):
    def forward(self, x, frozen=False):
        raise AssertionError("this critic must not be asked")


@pytest.mark.parametrize("policy_chunk_len", [None, 1])
def test_target_of_a_hand_built_trajectory(policy_chunk_len):
    """The h-step target bootstraps from the critic that scores the actor's plans: the chunk critic's target,
    or with decoupled chunks the partial critic's target (Q_k(s', pi_k(s')))."""
    g = 0.5
    buf = ReplayBuffer(SPEC, 1, capacity=100, n_step=3, gamma=g)
    # rewards 1, 2, 3 then termination; then 4, 5 truncated; then 6, 7, 8, 9
    rewards = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    for t, r in enumerate(rewards):
        obs = {"state": torch.tensor([[float(t), 0.0]])}
        nxt = {"state": torch.tensor([[t + 1.0, 0.0]])}
        buf.add(obs, torch.zeros(1, 1), torch.tensor([float(r)]), nxt, torch.tensor([t == 2]), torch.tensor([t == 4]))
    agent = ChunkCritic(ChunkConfig(chunk_len=3, gamma=g, policy_chunk_len=policy_chunk_len), SPEC, 1)
    if policy_chunk_len is None:
        agent.target_critic = _ValueOfFirstFeature()
    else:
        agent.target_critic, agent.target_partial_critic = _Unused(), _ValueOfFirstFeature()
    batch = _at(buf, [0, 1, 3, 4, 5, 6, 8], 3)
    target = agent.td_target(batch, alpha=torch.tensor(0.0))[:, 0]
    v = lambda s: 10.0 * s  # noqa: E731  (the stand-in critic's value of the state after the sequence)
    expected = [
        1 + g * 2 + g**2 * 3,  # terminated after 3 steps: no bootstrap
        2 + g * 3,
        4 + g * 5 + g**2 * v(5),  # truncated after 2 steps: bootstrap from the final observation
        5 + g * v(5),
        6 + g * 7 + g**2 * 8 + g**3 * v(8),  # a full chunk
        7 + g * 8 + g**2 * 9 + g**3 * v(9),
        9 + g * v(9),  # the newest step
    ]
    torch.testing.assert_close(target, torch.tensor(expected))
    # with a temperature, the bootstrapped value is the soft one: its entropy bonus enters with the discount
    soft = agent.td_target(batch, alpha=torch.tensor(1.0))[:, 0]
    assert torch.equal(soft[:2], target[:2]) and (soft[2:] != target[2:]).all()


@pytest.mark.parametrize("policy_chunk_len", [None, 2])
def test_critics_do_not_fit_sequences_cut_short_without_a_termination(policy_chunk_len):
    """A chunk cut by a time limit scores padding that never ran, so neither the chunk critic's TD loss nor
    the partial critic's distillation fits it: whatever its actions and rewards, the losses stay the same."""
    cfg = ChunkConfig(chunk_len=3, policy_chunk_len=policy_chunk_len, actor_hidden=[16], critic_hidden=[16])
    agent = ChunkCritic(cfg, SPEC, 2)
    if policy_chunk_len is None:
        agent.target_critic = _ValueOfFirstFeature()
    else:
        agent.target_partial_critic = _ValueOfFirstFeature()
    n = 8
    obs, next_obs = {"state": torch.randn(n, 2)}, {"state": torch.randn(n, 2)}
    valid = torch.ones(n, 3, dtype=torch.bool)
    valid[4:, 2] = False
    cut = torch.zeros(n, dtype=torch.bool)
    cut[4:] = True  # rows 4-7 lost their last step to a time limit

    def loss(actions, reward):
        batch = SequenceBatch(
            obs, actions[:, 0], reward, torch.ones(n, 1), next_obs, actions, reward.expand(n, 3), valid, cut
        )
        features = agent.encoder(obs)
        return agent._critic_loss(features, batch, torch.tensor(0.0), agent.encoder(next_obs))[0]

    actions, reward = torch.rand(n, 3, 2) * 2 - 1, torch.randn(n, 1)
    other_actions, other_reward = actions.clone(), reward.clone()
    other_actions[4:] = torch.rand(4, 3, 2) * 2 - 1
    other_reward[4:] = 1e6
    base = loss(actions, reward)
    torch.testing.assert_close(loss(other_actions, other_reward), base)
    other_reward[0] = 1e6  # a whole row's target does count
    assert loss(actions, other_reward) > 1e6 * base
    cut[:] = True  # nothing left to fit: no loss, and no NaN
    assert loss(actions, reward).item() == 0.0


def test_update_scores_whole_chunks_and_refuses_single_actions():
    agent = ChunkCritic(ChunkConfig(chunk_len=3, critic_lr=3e-3, batch_size=8), SPEC, 2)
    assert agent.critic.hidden[0].in_dim == 2 + 3 * 2 and agent.target_entropy == -6
    n = 64
    obs = {"state": torch.randn(n, 2)}
    actions = torch.rand(n, 3, 2) * 2 - 1
    reward = actions[:, :, 0].sum(1, keepdim=True)  # depends on the later actions of the chunk too
    valid = torch.ones(n, 3, dtype=torch.bool)
    cut = torch.zeros(n, dtype=torch.bool)
    batch = SequenceBatch(obs, actions[:, 0], reward, torch.zeros(n, 1), obs, actions, reward.expand(n, 3), valid, cut)
    for _ in range(300):
        metrics = agent.update(batch)
    assert all(v.dim() == 0 for v in metrics.values())
    q = agent.critic(torch.cat([obs["state"], actions.flatten(1)], -1))
    assert (q - reward).abs().mean() < 0.1
    single = Batch(obs, actions[:, 0], reward, torch.zeros(n, 1), obs)
    with pytest.raises(ValueError, match=r"agent\.chunk_len=3"):
        agent.update(single)
    with pytest.raises(ValueError, match=r"agent\.chunk_len=3"):
        agent.update(SequenceBatch(obs, actions[:, 0], reward, reward, obs, actions[:, :2], reward, valid[:, :2], cut))


class _SumOfChunk(nn.Module):
    """A stand-in critic: Q(s, chunk) = sign * the sum of the chunk's entries; member 1 a little lower."""

    def __init__(self, sign: float, obs_dim: int):
        super().__init__()
        self.sign, self.obs_dim = sign, obs_dim

    def forward(self, x, frozen=False):
        q = self.sign * x[:, self.obs_dim :].sum(-1, keepdim=True)
        return torch.stack([q, q - 1.0])


def test_best_of_n_takes_the_chunk_the_critics_rate_highest_in_acting_and_in_the_target():
    cfg = ChunkConfig(chunk_len=3, num_samples=16, actor_hidden=[16], critic_hidden=[16])
    agent = ChunkCritic(cfg, SPEC, 2)
    agent.critic, agent.target_critic = _SumOfChunk(1.0, 2), _SumOfChunk(-1.0, 2)
    features = torch.randn(512, 2)
    dist = agent.actor(features)
    torch.manual_seed(0)
    chunk, log_prob = agent._best_of_samples(agent.critic, features, dist)
    torch.manual_seed(0)  # the same 16 draws, scored by hand
    draws, draw_log_probs = TanhNormal(
        dist.mean.expand(16, -1, -1), dist.log_std.expand(16, -1, -1)
    ).rsample_with_log_prob()
    best = draws.sum(-1).argmax(0)
    rows = torch.arange(512)
    torch.testing.assert_close(chunk, draws[best, rows])
    torch.testing.assert_close(log_prob, draw_log_probs[best, rows])
    single = dist.rsample_with_log_prob()[0]
    assert chunk.sum(-1).mean() > single.sum(-1).mean() + 1.0  # far above one draw's typical sum
    # exploring plans with the critic; the TD target's next chunk comes from the target critic (here the
    # lowest sum); evaluation keeps the mode
    planned = agent.chunks({"state": features[:64]}).flatten(1)
    target_next, _ = agent.target_action(features)
    assert planned.sum(-1).mean() > 1.0 and target_next.sum(-1).mean() < -1.0
    mode = agent.chunks({"state": features[:4]}, deterministic=True).flatten(1)
    torch.testing.assert_close(mode, dist.mode[:4])
    with pytest.raises(ValueError, match=r"agent\.num_samples must be an integer >= 1, got 0"):
        ChunkConfig(num_samples=0).validate()


# ---- exploration noise correlated over a chunk ----------------------------------------------------------


def _ar1_covariance(std: torch.Tensor, steps: int, rho: float) -> torch.Tensor:
    """[B, h*A, h*A] covariance of the pre-tanh chunk: std_i std_j rho^|k - l| within an action entry."""
    action_dim = std.shape[-1] // steps
    k = torch.arange(steps)
    time = rho ** (k[:, None] - k[None, :]).abs().double()
    corr = torch.kron(time, torch.eye(action_dim, dtype=torch.float64))  # step-major, as a flattened chunk
    return std.double()[:, :, None] * corr * std.double()[:, None, :]


def test_time_correlated_log_prob_is_the_exact_density_of_the_squashed_ar1_gaussian():
    steps, action_dim, rho = 4, 3, 0.7
    mean, log_std = torch.randn(32, steps * action_dim), torch.randn(32, steps * action_dim) * 0.3 - 0.5
    dist = TimeCorrelatedTanhNormal(mean, log_std, steps, rho)
    action, log_prob = dist.rsample_with_log_prob()
    gaussian = torch.distributions.MultivariateNormal(mean.double(), _ar1_covariance(dist.std, steps, rho))
    pre_tanh = torch.atanh(action.double().clamp(-1 + 1e-12, 1 - 1e-12))
    squash = torch.log1p(-action.double().pow(2)).sum(-1)
    expected = gaussian.log_prob(pre_tanh) - squash
    torch.testing.assert_close(log_prob.squeeze(-1).double(), expected, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(
        dist.log_prob_pre_tanh(pre_tanh.float()).squeeze(-1).double(), expected, rtol=1e-3, atol=1e-3
    )
    independent = TimeCorrelatedTanhNormal(mean, log_std, steps, 0.0)
    torch.testing.assert_close(
        independent.log_prob_pre_tanh(pre_tanh.float()), TanhNormal(mean, log_std).log_prob_pre_tanh(pre_tanh.float())
    )
    # the offset is the Gaussian entropy the correlation removes
    gap = gaussian.entropy() - torch.distributions.Normal(mean.double(), dist.std.double()).entropy().sum(-1)
    offset = TimeCorrelatedTanhNormal.entropy_offset(steps, action_dim, rho)
    torch.testing.assert_close(gap, torch.full_like(gap, offset))


def test_time_correlated_noise_keeps_each_entry_std_and_correlates_consecutive_steps():
    steps, action_dim, rho = 5, 2, 0.8
    n = 200_000
    dist = TimeCorrelatedTanhNormal(
        torch.zeros(n, steps * action_dim), torch.full((n, steps * action_dim), -3.0), steps, rho
    )
    noise = torch.atanh(dist.rsample_with_log_prob()[0]).unflatten(-1, (steps, action_dim)) / math.exp(-3.0)
    assert noise.std(0).sub(1).abs().max() < 0.02  # every entry's marginal std is the distribution's std
    lag1 = (noise[:, 1:] * noise[:, :-1]).mean(0)
    lag2 = (noise[:, 2:] * noise[:, :-2]).mean(0)
    assert lag1.sub(rho).abs().max() < 0.02 and lag2.sub(rho**2).abs().max() < 0.02
    across = (noise[..., 0] * noise[..., 1]).mean(0)
    assert across.abs().max() < 0.02  # action entries stay independent
    many = dist.expand(3)
    assert isinstance(many, TimeCorrelatedTanhNormal) and many.mean.shape == (3, n, steps * action_dim)
    with pytest.raises(ValueError, match=r"in \[0, 1\), got 1.0"):
        TimeCorrelatedTanhNormal(torch.zeros(1, 4), torch.zeros(1, 4), 2, 1.0)
    with pytest.raises(ValueError, match="3 steps does not divide 4"):
        TimeCorrelatedTanhNormal(torch.zeros(1, 4), torch.zeros(1, 4), 3, 0.5)


def test_chunk_critic_explores_with_correlated_noise_and_keeps_the_per_entry_target():
    cfg = ChunkConfig(chunk_len=4, noise_correlation=0.9, target_entropy=-24.0, actor_hidden=[16], critic_hidden=[16])
    agent = ChunkCritic(cfg, SPEC, 3)
    assert isinstance(agent.actor(torch.randn(2, 2)), TimeCorrelatedTanhNormal)
    assert agent.target_entropy == pytest.approx(-24.0 + 0.5 * 3 * 3 * math.log(1 - 0.81))
    n, obs = 16, {"state": torch.randn(16, 2)}
    actions, valid = torch.rand(n, 4, 3) * 2 - 1, torch.ones(n, 4, dtype=torch.bool)
    reward = torch.randn(n, 1)
    metrics = agent.update(
        SequenceBatch(
            obs, actions[:, 0], reward, torch.ones(n, 1), obs, actions, reward.expand(n, 4), valid, ~valid.all(1)
        )
    )
    assert all(torch.isfinite(v).all() for v in metrics.values())
    plain = ChunkCritic(ChunkConfig(chunk_len=4, target_entropy=-24.0), SPEC, 3)
    assert type(plain.actor(torch.randn(2, 2))) is TanhNormal and plain.target_entropy == -24.0
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"agent\.noise_correlation must be in \[0, 1\)"):
            ChunkConfig(noise_correlation=bad).validate()


# ---- decoupled chunks (agent.policy_chunk_len) ---------------------------------------------------------


def test_decoupled_actor_plans_and_executes_k_actions_while_the_critic_scores_h():
    cfg = ChunkConfig(chunk_len=4, policy_chunk_len=2, actor_hidden=[16], critic_hidden=[16])
    agent = ChunkCritic(cfg, SPEC, 3)
    assert agent.replay_n_step == 4 and agent.target_entropy == -6  # -1 an entry the actor samples
    assert agent.critic.hidden[0].in_dim == 2 + 4 * 3 and agent.partial_critic.hidden[0].in_dim == 2 + 2 * 3
    assert agent.actor.net.head.out_features == 2 * 2 * 3  # mean and log-std of a 2-step plan
    assert agent.chunks({"state": torch.randn(5, 2)}).shape == (5, 2, 3)
    plans = []
    agent.actor.register_forward_hook(lambda *_: plans.append(1))
    agent.reset_exploration(1)
    for _ in range(6):
        agent.act({"state": torch.randn(1, 2)})
        agent.advance_exploration(torch.zeros(1, dtype=torch.bool))
    assert len(plans) == 3  # a new plan every k = 2 steps
    assert ChunkCritic(ChunkConfig(chunk_len=4, policy_chunk_len=4), SPEC, 3).partial_critic is None
    correlated = ChunkCritic(ChunkConfig(chunk_len=4, policy_chunk_len=2, noise_correlation=0.5), SPEC, 3)
    assert correlated.actor(torch.randn(1, 2)).steps == 2


def test_partial_critic_learns_the_upper_expectile_of_the_chunk_critic_over_completions():
    """One state and first action, two recorded completions the chunk critic rates 1.5 and -2.5: the partial
    critic settles at their 0.9-expectile, 0.9 * 1.5 + 0.1 * -2.5 = 1.1 (the mean would be -0.5)."""
    torch.manual_seed(0)
    cfg = ChunkConfig(chunk_len=3, policy_chunk_len=1, distill_expectile=0.9, actor_hidden=[16], critic_hidden=[32])
    agent = ChunkCritic(cfg, SPEC, 1)
    agent.critic = _SumOfChunk(1.0, 2)  # Q = the chunk's sum; the members' minimum is 1 lower
    n = 64
    obs = {"state": torch.tensor([[0.3, -0.2]]).expand(n, 2)}
    tails = torch.tensor([[1.0, 1.0], [-1.0, -1.0]]).repeat(n // 2, 1)
    actions = torch.cat([torch.full((n, 1), 0.5), tails], 1).unsqueeze(-1)  # [n, 3, 1]
    valid = torch.ones(n, 3, dtype=torch.bool)
    batch = SequenceBatch(
        obs, actions[:, 0], torch.zeros(n, 1), torch.ones(n, 1), obs, actions, torch.zeros(n, 3), valid, ~valid.all(1)
    )
    optimizer = torch.optim.Adam(agent.partial_critic.parameters(), lr=3e-3)
    features = agent.encoder(obs)
    chunk_q = agent._q(agent.critic, features, agent.batch_action(batch)).min(dim=0).values
    for _ in range(1500):
        loss = agent._distillation_loss(features, batch, chunk_q)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    q = agent.partial_critic(torch.cat([features[:1], actions[:1, 0]], -1))
    torch.testing.assert_close(q.flatten(), torch.full((2,), 1.1), atol=0.05, rtol=0)


def test_decoupled_update_trains_both_critics_and_clones_only_the_planned_actions():
    cfg = ChunkConfig(chunk_len=3, policy_chunk_len=2, bc_weight=1.0, actor_hidden=[16], critic_hidden=[16])
    agent = ChunkCritic(cfg, SPEC, 2)
    n = 16
    obs = {"state": torch.randn(n, 2)}
    actions = torch.rand(n, 3, 2) * 2 - 1
    valid = torch.ones(n, 3, dtype=torch.bool)
    valid[0, 1:] = False  # row 0's episode ended after its first step: its second action is padding
    reward = torch.randn(n, 1)
    batch = SequenceBatch(
        obs,
        actions[:, 0],
        reward,
        torch.ones(n, 1),
        obs,
        actions,
        reward.expand(n, 3),
        valid,
        ~valid.all(1),
        demo=torch.ones(n, dtype=torch.bool),
    )
    assert torch.equal(agent.policy_action(batch), actions[:, :2].flatten(1))
    entries = agent.recorded_entries(batch, batch.demo)
    assert entries.shape == (n, 4) and not entries[0, 2:].any() and entries[0, :2].all() and entries[1:].all()
    before = {name: [p.clone() for p in getattr(agent, name).parameters()] for name in ("critic", "partial_critic")}
    target_before = [p.clone() for p in agent.target_partial_critic.parameters()]
    metrics = agent.update(batch)
    assert all(torch.isfinite(v) for v in metrics.values()) and "bc_loss" in metrics
    for name, old in before.items():
        assert any(not torch.equal(a, b) for a, b in zip(old, getattr(agent, name).parameters(), strict=True)), name
    assert any(
        not torch.equal(a, b) for a, b in zip(target_before, agent.target_partial_critic.parameters(), strict=True)
    )


# ---- chunk execution ----------------------------------------------------------------------------------


def _constant_plans(envs=1, h=3):
    """A planner whose chunk planned at call i holds the value i at every step (counts its calls)."""
    calls = []

    def plan():
        calls.append(1)
        return torch.full((envs, h, 1), float(len(calls) - 1))

    return plan, calls


def test_ensemble_weights_follow_chunk_age():
    valid = torch.tensor([[True, True, True], [True, False, True]])
    w = ensemble_weights(valid, 0.5)
    full = torch.exp(-0.5 * torch.arange(3.0))
    torch.testing.assert_close(w[0], full / full.sum())
    torch.testing.assert_close(w[1], torch.tensor([1.0, 0.0, math.exp(-1.0)]) / (1 + math.exp(-1.0)))
    torch.testing.assert_close(ensemble_weights(valid[:1], 0.0)[0], torch.full((3,), 1 / 3))


def test_ensemble_weights_stay_finite_for_a_strong_preference_of_new_plans():
    w = ensemble_weights(torch.ones(1, 10, dtype=torch.bool), -10.0)  # exp(90) overflows float32
    assert torch.isfinite(w).all() and w.sum().item() == pytest.approx(1.0) and w[0, -1] > 0.99


def test_temporal_ensembling_averages_overlapping_constant_chunks():
    m = 0.5
    ex = ChunkExecution(1, 3, 1, "ensemble", m, torch.device("cpu"))
    plan, calls = _constant_plans()
    w = [math.exp(-m * k) for k in range(3)]
    actions = []
    for _ in range(5):
        actions.append(ex.act(plan).item())
        ex.advance(torch.tensor([False]))
    assert len(calls) == 5  # a new plan every step
    expected = [
        0.0,
        (1 * w[0] + 0 * w[1]) / (w[0] + w[1]),
        (2 * w[0] + 1 * w[1] + 0 * w[2]) / sum(w),
        (3 * w[0] + 2 * w[1] + 1 * w[2]) / sum(w),  # the first plan has run out after 3 steps
        (4 * w[0] + 3 * w[1] + 2 * w[2]) / sum(w),
    ]
    assert actions == pytest.approx(expected)
    ex.advance(torch.tensor([True]))  # skipped an act (warm-up) and the next action starts an episode
    assert ex.act(plan).item() == 5.0  # only the new episode's plan


def _counting_plans(envs, h):
    """A planner whose chunk planned at call i holds 10 i + k at step k (counts its calls)."""
    calls = []

    def plan():
        calls.append(1)
        base = 10.0 * (len(calls) - 1)
        return (base + torch.arange(h, dtype=torch.float32)).expand(envs, h).unsqueeze(-1)

    return plan, calls


def test_open_loop_replans_every_h_steps_and_at_each_env_episode_start():
    h = 3
    ex = ChunkExecution(2, h, 1, "open_loop", 0.0, torch.device("cpu"))
    plan, calls = _counting_plans(2, h)

    seen = []
    for t in range(7):
        a = ex.act(plan)
        assert torch.equal(ex.act(plan), a)  # acting twice within a step commits to the same action
        seen.append(a[:, 0].tolist())
        ex.advance(torch.tensor([False, t == 3]))  # env 1's next action (step 4) starts an episode
    assert seen == [[0, 0], [1, 1], [2, 2], [10, 10], [11, 20], [12, 21], [30, 22]]
    assert len(calls) == 4
    with pytest.raises(ValueError, match="episode_start"):
        ex.advance(torch.tensor([False]))


def test_receding_horizon_replans_every_step_and_acts_with_the_first_entry():
    h = 3
    ex = ChunkExecution(2, h, 1, "receding", 0.0, torch.device("cpu"))
    plan, calls = _counting_plans(2, h)

    seen = []
    for t in range(4):
        seen.append(ex.act(plan)[:, 0].tolist())
        ex.advance(torch.tensor([False, t == 1]))
    assert seen == [[0, 0], [10, 10], [20, 20], [30, 30]] and len(calls) == 4  # never entry 1 or 2
    with pytest.raises(ValueError, match=r"plans of shape \[1, 3, 1\]"):
        ex.act(lambda: torch.zeros(1, h, 1))


def test_evaluation_may_execute_chunks_otherwise_than_exploration():
    cfg = ChunkConfig(
        chunk_len=4, execution="open_loop", eval_execution="receding", actor_hidden=[16], critic_hidden=[16]
    )
    agent = ChunkCritic(cfg, SPEC, 2)
    obs = {"state": torch.randn(3, 2)}
    agent.act(obs)
    agent.act(obs, deterministic=True)
    assert agent.exploring.mode == "open_loop" and agent.evaluating.mode == "receding"
    for _ in range(3):  # the deterministic policy replans each step: its action is the mode's first entry
        agent.advance_evaluation(torch.zeros(3, dtype=torch.bool))
        obs = {"state": torch.randn(3, 2)}
        det = agent.act(obs, deterministic=True)
        assert torch.equal(det, agent.chunks(obs, deterministic=True)[:, 0])
    unset = ChunkCritic(ChunkConfig(execution="ensemble", actor_hidden=[16], critic_hidden=[16]), SPEC, 2)
    unset.reset_evaluation(1)
    assert unset.evaluating.mode == "ensemble"  # null: as exploration


def test_agent_keeps_exploring_and_evaluating_chunks_apart():
    agent = ChunkCritic(ChunkConfig(chunk_len=4, actor_hidden=[16], critic_hidden=[16]), SPEC, 2)
    agent.reset_exploration(3)
    obs = {"state": torch.randn(3, 2)}
    first = agent.act(obs)
    agent.advance_exploration(torch.zeros(3, dtype=torch.bool))
    assert torch.equal(agent.act(obs), agent.exploring.chunk[:, 1])  # open loop: the chunk's next entry
    agent.reset_evaluation(1)  # an evaluation in the middle of training, on one env
    det = agent.act({"state": obs["state"][:1]}, deterministic=True)
    assert torch.equal(det, agent.chunks({"state": obs["state"][:1]}, deterministic=True)[:, 0])
    agent.advance_evaluation(torch.tensor([True]))
    assert agent.exploring.steps_taken.tolist() == [1, 1, 1] and first.shape == (3, 2)
    assert first.abs().max() < 1 and agent.act(obs).shape == (3, 2)
    with pytest.raises(ValueError, match=r"reset_exploration\(2\)"):
        agent.act({"state": torch.randn(2, 2)})  # mid-chunk: nothing to plan, still refused
    with pytest.raises(ValueError, match=r"reset_evaluation\(3\)"):
        agent.act(obs, deterministic=True)


# ---- configuration and the entry point -----------------------------------------------------------------


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"agent\.chunk_len must be an integer >= 1, got 0"):
        ChunkCritic(ChunkConfig(chunk_len=0), SPEC, 1)
    with pytest.raises(ValueError, match=r"agent\.execution.*open_loop, ensemble, receding.*'closed'"):
        ChunkConfig(execution="closed").validate()
    with pytest.raises(ValueError, match=r"agent\.eval_execution.*'mpc'"):
        ChunkConfig(eval_execution="mpc").validate()
    with pytest.raises(ValueError, match=r"agent\.ensemble_decay"):
        ChunkConfig(ensemble_decay=float("nan")).validate()
    with pytest.raises(ValueError, match=r"agent\.tau"):
        ChunkConfig(tau=0.0).validate()
    with pytest.raises(ValueError, match="4 conv layers leave nothing of a 8x8 image"):
        ChunkCritic(ChunkConfig(), {"pixels": TensorSpec((3, 8, 8), torch.uint8)}, 2)
    with pytest.raises(ValueError, match=r"agent\.n_step does not apply"):
        ChunkConfig(n_step=3).validate()
    with pytest.raises(ValueError, match=r"agent\.exploration must be gaussian"):
        ChunkConfig(exploration="gsde").validate()
    for bad in (0, 6, True, 2.5):
        with pytest.raises(
            ValueError, match=r"agent\.policy_chunk_len must be null or an integer in \[1, agent\.chunk_len=5\]"
        ):
            ChunkConfig(chunk_len=5, policy_chunk_len=bad).validate()
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"agent\.distill_expectile must be in \(0, 1\)"):
            ChunkConfig(distill_expectile=bad).validate()
    agent = make_agent(ChunkConfig(chunk_len=5), SPEC, 2)
    assert isinstance(agent, ChunkCritic) and agent.replay_n_step == 5  # the loop's replay sums 5 steps


def test_train_resume_and_eval_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in TINY if not a.startswith(("total_steps", "eval_interval"))]
    args += ["agent=chunk", "agent.chunk_len=3", "agent.execution=ensemble", "agent.eval_execution=receding"]
    args += ["agent.noise_correlation=0.5", "agent.policy_chunk_len=2", "total_steps=600", "eval_interval=600"]
    run_module("robotrl.train", *args, "video=false", f"hydra.run.dir={run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 600 and summary["updates"] == 400 and math.isfinite(summary["eval/return"])
    run_module("robotrl.train", f"resume={run_dir}", "total_steps=700", "progress=false")
    assert json.loads((run_dir / "summary.json").read_text())["updates"] == 500
    proc = run_module("robotrl.train", *args, "agent.chunk_len=0", f"hydra.run.dir={tmp_path / 'bad'}", check=False)
    assert proc.returncode != 0 and "agent.chunk_len must be an integer >= 1" in proc.stderr


def test_pixel_chunk_critic_learns_its_encoder_through_the_critic_from_frame_sequences(tmp_path):
    from robotrl.data.frame_replay import FrameReplay

    spec = {"pixels_front": TensorSpec((9, 64, 64), torch.uint8), "arm_qpos": TensorSpec((7,))}
    cfg = ChunkConfig(
        chunk_len=3, actor_hidden=[32], critic_hidden=[32], batch_size=8, encoder=EncoderConfig(conv_layers=2)
    )
    agent = ChunkCritic(cfg, spec, 4)
    obs = {"pixels_front": torch.randint(0, 256, (2, 9, 64, 64), dtype=torch.uint8), "arm_qpos": torch.randn(2, 7)}
    agent.reset_exploration(2)
    assert agent.act(obs).shape == (2, 4)
    replay = FrameReplay(spec, 4, 100, frame_stack=3, n_step=agent.replay_n_step)
    one = {k: v[:1] for k, v in obs.items()}
    for t in range(20):
        end = torch.tensor([t % 8 == 7])
        replay.add(one, torch.rand(1, 4) * 2 - 1, torch.ones(1), one, end, torch.zeros(1, dtype=torch.bool))
    batch = replay.sample(8)
    assert batch.actions.shape == (8, 3, 4) and batch.next_obs["pixels_front"].shape == (8, 9, 64, 64)
    before = [p.clone() for p in agent.encoder.parameters()]
    metrics = agent.update(batch)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.encoder.parameters(), strict=True))
    run_module(
        "robotrl.train",
        "agent=chunk",
        "task=panda_reach",
        "task.obs=pixels",
        "task.image_size=64",
        "agent.encoder.conv_layers=2",
        "agent.actor_hidden=[32]",
        "agent.critic_hidden=[32]",
        "agent.batch_size=16",
        "total_steps=150",
        "learning_starts=100",
        "eval_interval=150",
        "eval_episodes=1",
        "checkpoint_interval=150",
        "video=false",
        "progress=false",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 150
