"""Soft Actor-Critic (Haarnoja et al., 2018) with an ensemble critic evaluated in one batched pass."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from robotrl.agents.base import (
    PRECISIONS,
    Agent,
    bc_weight_at,
    behaviour_cloning_loss,
    check_bc_schedule,
    check_finite,
    check_layer_widths,
    make_adam,
    masked_mean,
    mixed_precision,
)
from robotrl.agents.compiled import CompiledFunction, GraphedStep
from robotrl.agents.config import AgentConfig
from robotrl.core.spec import PRIVILEGED, ObsSpec, actor_spec, check_obs, pixel_keys
from robotrl.data.replay import Batch
from robotrl.nn import GSDE, EnsembleMLP, GSDENoise, StateEncoder, TanhNormal, mlp
from robotrl.nn.augment import shift_images
from robotrl.nn.encoders import WithPrivileged
from robotrl.nn.mlp import full_precision

EXPLORATIONS = ("gaussian", "gsde")
Q_SCALE_FLOOR = 1e-6  # q_normalize: a batch whose critic values are all ~0 is not blown up
CRITIC_METRICS = ("critic_loss", "q_mean")  # every update's; the rest are the actor step's


@dataclass
class SACConfig(AgentConfig):
    name: str = "sac"
    actor_hidden: list[int] = field(default_factory=lambda: [256, 256])
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    num_critics: int = 2
    critic_layer_norm: bool = False
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    n_step: int = 1
    actor_update_interval: int = 1  # critic updates per actor update
    init_alpha: float = 0.1  # as DrQ/DrQ-v2; 1.0 (SB3's) swamps small per-step rewards for thousands of steps
    learn_alpha: bool = True
    target_entropy: float | None = None  # None: -action_dim
    log_std_min: float = -5.0  # gaussian exploration: bounds of the actor's per-dimension log-std
    log_std_max: float = 2.0
    # Exploration noise of the acting policy: gaussian (independent per step, state-dependent std head) or
    # gsde (generalized state-dependent exploration: noise = latent features @ a noise matrix held for
    # sde_sample_freq env steps, so exploration moves smoothly; see robotrl/nn/gsde.py).
    exploration: str = "gaussian"
    sde_sample_freq: int = 8  # gsde: env steps per noise matrix (a new one also at every episode start)
    full_std: bool = True  # gsde: one std per (feature, action) pair instead of one per feature
    use_expln: bool = True  # gsde: std = expln(log_std), bounded growth, instead of exp(log_std)
    learn_features: bool = False  # gsde: let the exploration's log-prob gradient reach the actor's features
    # gsde: initial log-std of the noise-matrix entries. SB3's SAC uses -3; here that left panda_reach
    # almost unexplored for thousands of steps (the std adapts slowly: Adam moves each entry ~lr a step).
    log_std_init: float = -2.0
    # gsde: the pre-tanh mean is held in [-clip_mean, clip_mean] (SB3's gSDE actor clips at 2). Unclipped, the
    # mean can run far into tanh's flat tails, where noise of the size gSDE's slowly adapting std gives no
    # longer moves the action: exploration stops there. 0: no clip.
    clip_mean: float = 0.0
    # Matmul precision of the hidden layers: fp32, bf16 (mixed precision: fp32 weights, optimizer and
    # output heads), or auto (bf16 where the device computes it natively, else fp32).
    precision: str = "fp32"
    # Pixel observations: agent.encoder.* (agents/config.py), shared by actor and critic and learned through the
    # critic (the actor reads detached features).
    # Behaviour cloning on offline rows (demonstrations and interventions, `Batch.demo`): the actor's loss
    # adds bc_weight * the mean squared distance of its deterministic action to the recorded one.
    bc_weight: float = 0.0
    bc_weight_final: float | None = None  # null: constant; else linear from bc_weight over bc_decay_updates
    bc_decay_updates: int = 0
    # Clone a recorded action only where the critic rates it above the policy's own (the Q-filter of Nair
    # et al., 2018): demonstrations then guide the policy without holding it at the demonstrator's speed.
    bc_q_filter: bool = False
    # TD3+BC's normalisation (Fujimoto & Gu 2021): the actor's critic term is divided by the batch's mean |Q|
    # (no gradient) and multiplied by q_normalize; 0 leaves it raw. With demos, a critic term of raw size (push:
    # |Q| ~10) outweighs cloning at weight 10: two online updates after hil.pretrain_updates took a cloned
    # policy from 0.56 to 0% success on push, and with q_normalize=1 it stayed at 0.46-0.66 (1e9c523, 2026-11-27;
    # bench/results/chunk_vs_sac.md).
    q_normalize: float = 0.0
    # Standardise state features (pixels' state entries too) with the running mean and std of every batch
    # the learner trains on, offline rows included; kept as encoder buffers, so checkpoints and published
    # weights carry them. Off by default: raw features are what every figure in the README was measured on.
    obs_norm: bool = False
    # Smooth policies (the temporal term of CAPS, Mysore et al. 2021): the actor's loss adds smoothness_weight
    # * the mean squared change of its deterministic action from obs to next_obs (n_step steps apart), the
    # figure runtime/smoothness.py logs as action_sq_diff. Exploration noise smooths only the noise; this term
    # smooths the policy itself, at a price in return where the task rewards fast switching (HalfCheetah's
    # gaits: bench/results/gsde_smoothness.md gives the figures).
    smoothness_weight: float = 0.0

    @property
    def replay_n_step(self) -> int:
        return self.n_step

    @property
    def replay_gamma(self) -> float:
        return self.gamma

    def validate(self) -> None:
        super().validate()
        for name in ("num_critics", "n_step", "actor_update_interval", "sde_sample_freq"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        check_finite(self, ("actor_lr", "critic_lr", "alpha_lr", "init_alpha"), 0.0)
        check_finite(self, ("smoothness_weight", "q_normalize", "clip_mean"), 0.0, inclusive=True)
        check_finite(self, ("target_entropy", "log_std_min", "log_std_max"), -math.inf)
        check_layer_widths(self, ("actor_hidden", "critic_hidden"))
        if not 0 < self.tau <= 1:
            raise ValueError(f"agent.tau must be in (0, 1], got {self.tau}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"agent.gamma must be in [0, 1], got {self.gamma}")
        check_bc_schedule(self.bc_weight, self.bc_weight_final, self.bc_decay_updates)
        if self.precision not in PRECISIONS:
            raise ValueError(f"agent.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.exploration not in EXPLORATIONS:
            raise ValueError(f"agent.exploration must be one of {', '.join(EXPLORATIONS)}, got {self.exploration!r}")
        if not math.isfinite(self.log_std_init):
            raise ValueError(f"agent.log_std_init must be finite, got {self.log_std_init}")
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"agent.log_std_min ({self.log_std_min}) must be below agent.log_std_max ({self.log_std_max})"
            )


def actor_observation(obs: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """`obs` without a privileged entry (a training env's observation has one where the critic reads the drawn
    physics): what an actor acts on."""
    return obs if PRIVILEGED not in obs else {key: value for key, value in obs.items() if key != PRIVILEGED}


class TanhGaussianActor(nn.Module):
    def __init__(self, in_dim: int, hidden: list[int], action_dim: int, log_std_min: float, log_std_max: float):
        super().__init__()
        self.net = mlp(in_dim, hidden, 2 * action_dim)
        self.in_dim = in_dim
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, features: torch.Tensor) -> TanhNormal:
        # the critic's features may go on with a privileged entry (WithPrivileged): the actor reads its own
        mean, raw_log_std = self.net(features[..., : self.in_dim]).chunk(2, dim=-1)
        # Smoothly bounded log-std (as in DrQ/SERL) keeps gradients alive at the bounds.
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(raw_log_std) + 1)
        return TanhNormal(mean, log_std)


class GSDEActor(nn.Module):
    """A mean head on an MLP, exploring with gSDE on the MLP's last hidden layer (its latent features)."""

    def __init__(self, in_dim: int, hidden: list[int], action_dim: int, cfg: SACConfig):
        super().__init__()
        self.net = mlp(in_dim, hidden, action_dim)
        self.in_dim = in_dim
        latent_dim = hidden[-1] if hidden else in_dim
        self.gsde = GSDE(latent_dim, action_dim, cfg.full_std, cfg.use_expln, cfg.learn_features, cfg.log_std_init)
        self.clip_mean = cfg.clip_mean

    def latent_and_mean(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent = self.net.hidden(features[..., : self.in_dim])  # without any privileged entry (WithPrivileged)
        mean = full_precision(self.net.head, latent)
        if self.clip_mean:
            mean = mean.clamp(-self.clip_mean, self.clip_mean)
        return latent, mean

    def forward(self, features: torch.Tensor) -> TanhNormal:
        """The state-conditional distribution the learner uses (independent noise per batch row)."""
        latent, mean = self.latent_and_mean(features)
        return self.gsde.distribution(mean, latent)

    def explore(self, features: torch.Tensor, noise: GSDENoise) -> torch.Tensor:
        """Exploration actions [E, action_dim]: tanh(mean + latent @ W_e), W_e the held matrix of env e."""
        latent, mean = self.latent_and_mean(features)
        return torch.tanh(mean + noise.noise(latent))


class SAC(Agent):
    def __init__(self, cfg: SACConfig, obs_spec: ObsSpec, action_dim: int, device: str | torch.device = "cpu"):
        super().__init__()
        cfg.validate()
        self.cfg, self.action_dim = cfg, action_dim
        # An asymmetric critic: a privileged entry (the drawn physics, sim2real/privileged.py) is appended to the
        # critic's features; the actor, and so `act` and an exported policy, never sees it.
        self.privileged_dim = obs_spec[PRIVILEGED].shape[0] if PRIVILEGED in obs_spec else 0
        self.obs_spec = actor_spec(obs_spec)
        self.pixel_keys = pixel_keys(self.obs_spec)
        if self.pixel_keys:
            encoder = cfg.encoder.image_state_encoder(self.obs_spec, cfg.obs_norm)
        else:
            encoder = StateEncoder(self.obs_spec, cfg.obs_norm)
        self.encoder = WithPrivileged(encoder, self.privileged_dim) if self.privileged_dim else encoder
        feat = self.encoder.out_dim  # the critic's: the actor's features, then any privileged entry
        self.actor = self._make_actor(encoder.out_dim, action_dim)
        # gSDE's per-env noise matrices on the actor's clock; not module state (never checkpointed: a
        # resumed run draws fresh ones, as its envs restart from a reset).
        self.exploration: GSDENoise | None = None
        self.critic = EnsembleMLP(
            cfg.num_critics, feat + action_dim, cfg.critic_hidden, 1, layer_norm=cfg.critic_layer_norm
        )
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(cfg.init_alpha)).log(), requires_grad=cfg.learn_alpha)
        self.target_entropy = float(-action_dim if cfg.target_entropy is None else cfg.target_entropy)
        self.register_buffer("_bc_weight", torch.zeros(()), persistent=False)
        self.to(device)

        dev = torch.device(device)
        graphs = cfg.compile and dev.type == "cuda"  # the whole update as one CUDA graph (agents/compiled.py)
        groups = [
            {"params": [*self.encoder.parameters(), *self.critic.parameters()], "lr": cfg.critic_lr},
            {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
        ]
        if cfg.learn_alpha:
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha_lr})
        self.optimizer = make_adam(groups, cfg.critic_lr, capturable=graphs)
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.target_critic.parameters())
        self.num_updates = 0
        self._imitating = False  # pretrain_update: the actor clones the demos, with its entropy term
        self._autocast = mixed_precision(cfg.precision, dev)
        self._last_actor_metrics: dict[str, torch.Tensor] = {}
        self._losses = self._sum_of_losses
        self._step = self._update_step
        if cfg.compile:
            self._losses = CompiledFunction(self._sum_of_losses, f"{type(self).__name__}'s losses")
            if graphs:
                self._step = GraphedStep(self._update_step, dev)

    def _make_actor(self, features: int, action_dim: int) -> nn.Module:
        cfg = self.cfg
        if cfg.exploration == "gsde":
            return GSDEActor(features, cfg.actor_hidden, action_dim, cfg)
        return TanhGaussianActor(features, cfg.actor_hidden, action_dim, cfg.log_std_min, cfg.log_std_max)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"sac": self.optimizer}

    def reset_exploration(self, num_envs: int) -> None:
        """gsde: fresh noise matrices for `num_envs` envs (seeded from the torch RNG); gaussian: nothing."""
        if self.cfg.exploration != "gsde":
            return
        seed = int(torch.randint(0, 2**62, ()))
        self.exploration = GSDENoise(self.actor.gsde, num_envs, self.cfg.sde_sample_freq, seed)

    def advance_exploration(self, episode_start: torch.Tensor) -> None:
        if self.exploration is not None:
            self.exploration.advance(episode_start)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """Actions in (-1, 1). Stochastic gsde actions use the held noise matrix of each env (row e of
        `obs` is env e); without a `reset_exploration` call first, one is made for this batch size."""
        obs = actor_observation(obs)
        check_obs(self.obs_spec, obs)
        with self._autocast():
            features = self.encoder(obs)
            if deterministic:
                return self.actor(features).mode
            if self.cfg.exploration == "gsde":
                if self.exploration is None:
                    self.reset_exploration(features.shape[0])
                return self.actor.explore(features, self.exploration)
            return self.actor(features).rsample_with_log_prob()[0]

    def _q(self, critic: nn.Module, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return critic(torch.cat([features, action], dim=-1))  # [N, B, 1]

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step and, every `actor_update_interval` updates, an actor and temperature step.

        The three losses share one backward pass and one fused Adam step: they touch disjoint parameters
        (the critic's target is computed without gradients, the actor sees the critic through detached
        weights, the temperature through a detached log-probability). The actor therefore ascends the
        critic as it was before this step's critic update, as in the JAX SAC implementations.
        """
        cfg = self.cfg
        update_actor = (self.num_updates + 1) % cfg.actor_update_interval == 0
        # the weight is a device tensor, so a compiled update (a CUDA graph) reads this update's value, not its
        # capture's; whether to clone at all selects the program
        bc_weight = bc_weight_at(cfg.bc_weight, cfg.bc_weight_final, cfg.bc_decay_updates, self.num_updates)
        self._bc_weight.fill_(bc_weight)
        metrics = self._step(batch, update_actor, self._imitating, bc_weight > 0)
        self.num_updates += 1
        if update_actor:
            self._last_actor_metrics = {k: v for k, v in metrics.items() if k not in CRITIC_METRICS}
        return {**{k: metrics[k] for k in CRITIC_METRICS}, **self._last_actor_metrics}

    def _update_step(self, batch: Batch, update_actor: bool, imitating: bool, cloning: bool) -> dict[str, torch.Tensor]:
        """The whole update on the device: what `agent.compile` captures as one CUDA graph."""
        self.encoder.observe(batch.obs)  # nothing without agent.obs_norm
        loss, metrics = self._losses(batch, update_actor, imitating, cloning)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._soft_update_target()
        return metrics

    def _sum_of_losses(
        self, batch: Batch, update_actor: bool, imitating: bool, cloning: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critics', the actor's and the temperature's losses summed, and their metrics (what `agent.compile`
        runs under torch.compile)."""
        if self.pixel_keys:  # DrQ: each observation randomly shifted
            pad = self.cfg.encoder.shift_pad
            batch = dataclasses.replace(
                batch,
                obs=shift_images(batch.obs, self.pixel_keys, pad),
                next_obs=shift_images(batch.next_obs, self.pixel_keys, pad),
            )
        alpha = self.log_alpha.detach().exp()
        with self._autocast():
            features = self.encoder(batch.obs)
            with torch.no_grad():  # the TD target's, and the smoothness term's
                next_features = self.encoder(batch.next_obs)
            critic_loss, q = self._critic_loss(features, batch, alpha, next_features)
            loss = critic_loss
            metrics = {"critic_loss": critic_loss.detach(), "q_mean": q.mean()}
            if update_actor:  # an encoder with weights (pixels) learns only through the critic
                actor_loss, log_prob, extra = self._actor_loss(
                    features.detach(), alpha, batch, next_features, imitating, cloning
                )
                loss = loss + actor_loss
                metrics.update(actor_loss=actor_loss.detach(), entropy=-log_prob.mean(), alpha=alpha, **extra)
                if self.cfg.learn_alpha:
                    alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).mean()
                    loss = loss + alpha_loss
                    metrics["alpha_loss"] = alpha_loss.detach()
        return loss, metrics

    def pretrain_update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """An update whose actor loss is the usual one without the critic's term: the entropy term and behaviour
        cloning (at agent.bc_weight, or 1 where that is 0). The critics fit the cloned policy's values as usual
        and the temperature is learnt, so the online phase starts with noise that already meets the target
        entropy. Ascending critics that had seen only the demos' actions drove the actor off them (push, 50
        demos, 5000 updates: SAC and the chunk critic at 0% success at 1000 env steps, BC alone at 54%);
        cloning without the entropy term left the temperature at its initial 0.1, some 20 times what these
        runs settle at, and the first online updates widened the noise until success fell from 0.6-0.7 to
        under 0.1."""
        self._imitating = True
        try:
            return self.update(batch)
        finally:
            self._imitating = False

    def batch_action(self, batch: Batch) -> torch.Tensor:
        """What the critic scores for each transition of `batch`: its action [B, action_dim]."""
        return batch.action

    @property
    def policy_critic(self) -> nn.Module:
        """The critic ensemble the actor ascends and the Q-filter asks: SAC's critic. (A chunk critic whose actor
        plans shorter chunks than the critic scores has one of its own.)"""
        return self.critic

    @property
    def target_policy_critic(self) -> nn.Module:
        """The target network of `policy_critic`: what the TD target scores the actor's next action with."""
        return self.target_critic

    def policy_action(self, batch: Batch) -> torch.Tensor:
        """The recorded action in the actor's output space, which behaviour cloning imitates."""
        return self.batch_action(batch)

    def recorded_entries(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        """Which entries of `policy_action` behaviour cloning imitates, given the demo `rows` ([B] bool)."""
        return rows

    @torch.no_grad()
    def td_target(self, batch: Batch, alpha: torch.Tensor, next_features: torch.Tensor | None = None) -> torch.Tensor:
        """[B, 1]: the (n-step) reward plus the discounted soft value of the next observation, under the
        minimum of the target critics (`target_policy_critic`) and an action from the actor (`next_features`:
        the encoded next_obs, if the caller has them)."""
        if next_features is None:
            next_features = self.encoder(batch.next_obs)
        next_action, next_log_prob = self.target_action(next_features)
        next_q = self._q(self.target_policy_critic, next_features, next_action).min(dim=0).values
        return batch.reward + batch.discount * (next_q - alpha * next_log_prob)

    def target_action(self, next_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The action the TD target evaluates after the batch, and its log-density: a sample of the actor."""
        return self.actor(next_features).rsample_with_log_prob()

    def _critic_loss(self, features: torch.Tensor, batch: Batch, alpha: torch.Tensor, next_features: torch.Tensor):
        """The critics' TD loss and their values for the batch's actions ([N, B, 1], detached)."""
        target = self.td_target(batch, alpha, next_features)
        q = self._q(self.critic, features, self.batch_action(batch))
        critic_loss = 0.5 * masked_mean((q - target).pow(2), self.td_rows(batch)).sum()
        return critic_loss, q.detach()

    def td_rows(self, batch: Batch) -> torch.Tensor | None:
        """[B] bool: the transitions whose TD target the critic fits; None: all of them."""
        return None

    def _actor_loss(
        self,
        features: torch.Tensor,
        alpha: torch.Tensor,
        batch: Batch,
        next_features: torch.Tensor,
        imitating: bool = False,
        cloning: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The actor's loss, its log-probabilities (detached) and the optional terms' values for logging
        (`bc_loss`, `smoothness_loss`). `imitating`: pretrain_update's loss, without the critic's term; `cloning`:
        this update's behaviour-cloning weight (`_bc_weight`) is above 0."""
        policy = self.actor(features)
        action, log_prob = policy.rsample_with_log_prob()
        cfg = self.cfg
        bc_weight = self._bc_weight  # this update's, filled by `update`
        if imitating:  # the online loss without the critic's term (BC weighted 1 where it has none)
            rows = torch.ones(len(log_prob), dtype=torch.bool, device=log_prob.device)
            bc_loss = behaviour_cloning_loss(policy.mode, self.policy_action(batch), self.recorded_entries(batch, rows))
            weight = torch.where(bc_weight > 0, bc_weight, torch.ones_like(bc_weight))
            actor_loss = (alpha * log_prob).mean() + weight * bc_loss
            return actor_loss, log_prob.detach(), {"bc_loss": bc_loss.detach()}
        # The critic is a fixed function here: through detached weights only the path to the action is
        # differentiated, and no critic weight gradients are computed.
        q = self.policy_critic(torch.cat([features, action], dim=-1), frozen=True).min(dim=0).values
        if cfg.q_normalize > 0:
            q = q * (cfg.q_normalize / q.detach().abs().mean().clamp_min(Q_SCALE_FLOOR))
        actor_loss = (alpha * log_prob - q).mean()
        extra: dict[str, torch.Tensor] = {}
        if cloning and batch.demo is not None:
            recorded, demo = self.policy_action(batch), batch.demo
            if self.cfg.bc_q_filter:
                demo = demo & self._prefers_recorded(features, recorded, policy.mode.detach())
            bc_loss = behaviour_cloning_loss(policy.mode, recorded, self.recorded_entries(batch, demo))
            actor_loss = actor_loss + bc_weight * bc_loss
            extra["bc_loss"] = bc_loss.detach()
        if cfg.smoothness_weight > 0:
            smoothness_loss = (policy.mode - self.actor(next_features).mode).pow(2).mean()
            actor_loss = actor_loss + cfg.smoothness_weight * smoothness_loss
            extra["smoothness_loss"] = smoothness_loss.detach()
        return actor_loss, log_prob.detach(), extra

    @torch.no_grad()
    def _prefers_recorded(self, features: torch.Tensor, recorded: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """[B] bool: rows where the critics' minimum rates the recorded action at least as high as `own`."""
        both = torch.cat([torch.cat([features, recorded], -1), torch.cat([features, own], -1)])
        q = self.policy_critic(both).min(dim=0).values.squeeze(-1)
        q_recorded, q_own = q.chunk(2)
        return q_recorded >= q_own

    @torch.no_grad()
    def _soft_update_target(self) -> None:
        torch._foreach_lerp_(self._target_params, self._critic_params, self.cfg.tau)
