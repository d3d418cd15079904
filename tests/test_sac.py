import math

import pytest
import torch

from robotrl.agents import SAC, SACConfig, make_agent
from robotrl.agents.config import EncoderConfig
from robotrl.data import Batch, TensorSpec
from robotrl.nn import EnsembleMLP, TanhNormal
from robotrl.nn.mlp import EnsembleLinear

SPEC = {"state": TensorSpec((5,)), "goal": TensorSpec((3,))}


def _batch(n=32, act=2):
    obs = {"state": torch.randn(n, 5), "goal": torch.randn(n, 3)}
    nxt = {"state": torch.randn(n, 5), "goal": torch.randn(n, 3)}
    return Batch(obs, torch.rand(n, act) * 2 - 1, torch.randn(n, 1), torch.full((n, 1), 0.99), nxt)


def test_act_shapes_bounds_and_determinism():
    agent = SAC(SACConfig(), SPEC, 2)
    obs = {"state": torch.randn(7, 5), "goal": torch.randn(7, 3)}
    a = agent.act(obs)
    assert a.shape == (7, 2) and a.abs().max() < 1
    assert torch.equal(agent.act(obs, deterministic=True), agent.act(obs, deterministic=True))
    assert not torch.equal(agent.act(obs), agent.act(obs))


def test_act_rejects_an_observation_of_the_wrong_shape():
    agent = SAC(SACConfig(), SPEC, 2)
    with pytest.raises(ValueError, match=r"observation\['goal'\].*\[3\]"):
        agent.act({"state": torch.randn(1, 5), "goal": torch.randn(1, 4)})


def test_ensemble_equals_independent_linear_stacks():
    ens = EnsembleMLP(3, 4, [8, 8], 1)
    x = torch.randn(10, 4)
    out = ens(x)
    assert out.shape == (3, 10, 1)
    for m in range(3):
        h = x
        layers = [ens.hidden[0], ens.hidden[2], ens.head]
        for i, layer in enumerate(layers):
            h = h @ layer.weight[m] + layer.bias[m, 0]
            if i < 2:
                h = h.relu()
        torch.testing.assert_close(out[m], h)


@pytest.mark.parametrize("shared_input", [True, False])
@pytest.mark.parametrize("frozen", [False, True])
def test_scalar_ensemble_head_has_the_gradients_of_a_batched_matmul(shared_input, frozen):
    """The CPU's multiply-and-sum path for a one-output layer must match baddbmm in value and gradients."""
    layer = EnsembleLinear(3, 8, 1)
    x = torch.randn(10, 8) if shared_input else torch.randn(3, 10, 8)
    x.requires_grad_(True)
    out = layer(x, frozen=frozen)
    expected_x = x.detach().clone().requires_grad_(True)
    weight, bias = layer.weight.detach().clone().requires_grad_(), layer.bias.detach().clone().requires_grad_()
    expected = torch.baddbmm(bias, expected_x.expand(3, 10, 8), weight)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(3, 10, 1)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    torch.testing.assert_close(x.grad, expected_x.grad)
    if frozen:
        assert layer.weight.grad is None and layer.bias.grad is None
    else:
        torch.testing.assert_close(layer.weight.grad, weight.grad)
        torch.testing.assert_close(layer.bias.grad, bias.grad)


def test_tanh_normal_log_prob_matches_torch_transformed_distribution():
    mean, log_std = torch.randn(64, 3), torch.randn(64, 3) * 0.5
    dist = TanhNormal(mean, log_std)
    action, log_prob = dist.rsample_with_log_prob()
    ref = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform(cache_size=1)]
    )
    torch.testing.assert_close(log_prob.squeeze(-1), ref.log_prob(action).sum(-1), rtol=1e-4, atol=1e-4)


def test_update_changes_critic_and_polyak_moves_target_by_tau():
    cfg = SACConfig(tau=0.1)
    agent = SAC(cfg, SPEC, 2)
    target_before = [p.clone() for p in agent.target_critic.parameters()]
    metrics = agent.update(_batch())
    assert {"critic_loss", "actor_loss", "alpha", "entropy", "q_mean"} <= set(metrics)
    assert all(v.dim() == 0 for v in metrics.values())
    for before, target, online in zip(
        target_before, agent.target_critic.parameters(), agent.critic.parameters(), strict=True
    ):
        torch.testing.assert_close(target, before + 0.1 * (online - before))
    assert not any(p.requires_grad for p in agent.target_critic.parameters())
    assert all(p.requires_grad for p in agent.critic.parameters())


def test_actor_loss_produces_no_critic_weight_gradients():
    agent = SAC(SACConfig(), SPEC, 2)
    batch = _batch()
    features = agent.encoder(batch.obs)
    actor_loss, _, _ = agent._actor_loss(features, agent.log_alpha.detach().exp(), batch, agent.encoder(batch.next_obs))
    actor_loss.backward()
    assert all(p.grad is None for p in agent.critic.parameters())
    assert all(p.grad is not None for p in agent.actor.parameters())


def _actor_gradients(agent: SAC, batch: Batch) -> list[torch.Tensor]:
    agent.actor.zero_grad()
    torch.manual_seed(0)  # the same reparameterised samples every call
    features = agent.encoder(batch.obs)
    loss, _, _ = agent._actor_loss(features, agent.log_alpha.detach().exp(), batch, agent.encoder(batch.next_obs))
    loss.backward()
    return [p.grad.clone() for p in agent.actor.parameters()]


@pytest.mark.parametrize("q_normalize", [0.0, 2.5])
def test_q_normalize_makes_the_actor_step_independent_of_the_critics_scale(q_normalize):
    """TD3+BC's normalisation: a critic whose values are 10x larger (a longer horizon, another reward scale)
    gives the actor the same gradient; without it the critic's term grows tenfold against the others."""
    torch.manual_seed(1)
    agent = SAC(SACConfig(q_normalize=q_normalize), SPEC, 2)
    batch = _batch()
    before = _actor_gradients(agent, batch)
    with torch.no_grad():
        agent.critic.head.weight.mul_(10.0)
        agent.critic.head.bias.mul_(10.0)
    after = _actor_gradients(agent, batch)
    same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(before, after, strict=True))
    assert same == (q_normalize > 0)


def test_critic_loss_produces_no_actor_gradients():
    agent = SAC(SACConfig(), SPEC, 2)
    batch = _batch()
    critic_loss, _ = agent._critic_loss(
        agent.encoder(batch.obs), batch, agent.log_alpha.detach().exp(), agent.encoder(batch.next_obs)
    )
    critic_loss.backward()
    assert all(p.grad is None for p in agent.actor.parameters())
    assert all(p.grad is not None for p in agent.critic.parameters())


def test_entropy_temperature_moves_towards_target():
    # A target entropy far above what the policy has: alpha must grow; far below: alpha must shrink.
    for target, grows in ((100.0, True), (-100.0, False)):
        agent = SAC(SACConfig(target_entropy=target, alpha_lr=1e-2), SPEC, 2)
        for _ in range(20):
            agent.update(_batch())
        alpha = agent.log_alpha.exp().item()
        assert (alpha > agent.cfg.init_alpha) == grows, (target, alpha)


def test_fixed_alpha_is_not_learned():
    agent = SAC(SACConfig(learn_alpha=False, init_alpha=0.2), SPEC, 2)
    agent.update(_batch())
    assert agent.log_alpha.exp().item() == pytest.approx(0.2)
    assert all(p is not agent.log_alpha for g in agent.optimizer.param_groups for p in g["params"])


def test_critic_count_layer_norm_and_actor_interval():
    agent = SAC(SACConfig(num_critics=5, critic_layer_norm=True, actor_update_interval=2), SPEC, 2)
    assert agent.critic(torch.randn(4, 10)).shape == (5, 4, 1)
    assert any(isinstance(m, torch.nn.LayerNorm) for m in agent.critic.modules())
    actor_before = [p.clone() for p in agent.actor.parameters()]
    agent.update(_batch())
    assert all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters(), strict=True))
    agent.update(_batch())
    assert not all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters(), strict=True))


def test_critic_regresses_towards_a_fixed_target():
    # reward 1 and discount 0: Q must approach 1 for the sampled actions.
    agent = SAC(SACConfig(critic_lr=3e-3), {"state": TensorSpec((3,))}, 1)
    obs = {"state": torch.randn(64, 3)}
    batch = Batch(obs, torch.rand(64, 1) * 2 - 1, torch.ones(64, 1), torch.zeros(64, 1), obs)
    for _ in range(300):
        agent.update(batch)
    q = agent.critic(torch.cat([obs["state"], batch.action], -1))
    assert (q - 1).abs().mean() < 0.05


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"agent\.num_critics"):
        SAC(SACConfig(num_critics=0), SPEC, 2)
    with pytest.raises(ValueError, match=r"agent\.tau"):
        SAC(SACConfig(tau=0.0), SPEC, 2)
    with pytest.raises(ValueError, match="available agents: bc, chunk, drqv2, sac"):
        make_agent(type("Cfg", (), {"name": "ppo"})(), SPEC, 2)
    with pytest.raises(ValueError, match="4 conv layers leave nothing of a 8x8 image"):
        SAC(SACConfig(), {"pixels": TensorSpec((3, 8, 8), torch.uint8)}, 2)
    with pytest.raises(ValueError, match=r"agent\.encoder\.shift_pad must be >= 0, got -1"):
        SAC(SACConfig(encoder=EncoderConfig(shift_pad=-1)), SPEC, 2)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"agent\.q_normalize must be a finite number >= 0.0, got {bad}"):
            SAC(SACConfig(q_normalize=bad), SPEC, 2)


def test_sac_from_pixels_learns_its_encoder_only_through_the_critic():
    torch.manual_seed(0)
    spec = {"pixels_front": TensorSpec((6, 64, 64), torch.uint8), "arm_qpos": TensorSpec((7,))}
    agent = SAC(SACConfig(actor_hidden=[32], critic_hidden=[32], encoder=EncoderConfig(conv_layers=2)), spec, 3)
    pixels = torch.randint(0, 256, (16, 6, 64, 64), dtype=torch.uint8)
    obs = {"pixels_front": pixels, "arm_qpos": torch.randn(16, 7)}
    assert agent.act(obs).shape == (16, 3)
    batch = Batch(obs, torch.rand(16, 3) * 2 - 1, torch.randn(16, 1), torch.full((16, 1), 0.99), obs)
    features = agent.encoder(obs)
    actor_loss, _, _ = agent._actor_loss(features.detach(), torch.tensor(0.1), batch, agent.encoder(batch.next_obs))
    actor_loss.backward()
    assert all(p.grad is None for p in agent.encoder.parameters())  # the actor's loss never reaches it
    agent.optimizer.zero_grad(set_to_none=True)
    before = [p.clone() for p in agent.encoder.parameters()]
    metrics = agent.update(batch)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.encoder.parameters(), strict=True))


def test_seeded_updates_are_reproducible():
    def run():
        torch.manual_seed(3)
        agent = SAC(SACConfig(), SPEC, 2)
        batch = _batch()
        for _ in range(3):
            agent.update(batch)
        return torch.cat([p.flatten() for p in agent.parameters()])

    assert torch.equal(run(), run())
    assert math.isfinite(run().sum().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_update_and_act_on_cuda():
    agent = SAC(SACConfig(precision="auto"), SPEC, 2, device="cuda")
    batch = _batch()
    to = lambda d: {k: v.cuda() for k, v in d.items()}  # noqa: E731
    batch = type(batch)(
        to(batch.obs), batch.action.cuda(), batch.reward.cuda(), batch.discount.cuda(), to(batch.next_obs)
    )
    metrics = agent.update(batch)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert agent.act(to(_batch().obs)).device.type == "cuda"


def test_bf16_mixed_precision_keeps_fp32_weights_and_q_heads():
    agent = SAC(SACConfig(precision="bf16"), SPEC, 2)
    metrics = agent.update(_batch())
    assert all(p.dtype == torch.float32 for p in agent.parameters())
    with agent._autocast():
        q = agent.critic(torch.randn(4, 10))
    assert q.dtype == torch.float32
    assert all(torch.isfinite(v) for v in metrics.values())
    with pytest.raises(ValueError, match=r"agent\.precision"):
        SAC(SACConfig(precision="fp8"), SPEC, 2)
