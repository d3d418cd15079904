"""DrQ-v2 (Yarats et al., 2021): DDPG from pixels with random-shift augmentation, n-step returns, clipped
double Q and a scheduled exploration std.

The conv encoder learns only through the critic; the actor reads detached features. Each camera has its
own encoder; state entries (proprioception) join after the image trunk, next to its 50 features.
Defaults are the paper's (84x84, frame stack 3, 4x32 convolutions, hidden 1024, batch 256, n-step 3,
lr 1e-4, tau 0.01, an update every 2 env steps); `configs/agent/drqv2_light.yaml` is a CPU-sized variant.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
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
    mixed_precision,
)
from robotrl.agents.compiled import CompiledFunction, GraphedStep
from robotrl.agents.config import AgentConfig
from robotrl.core.spec import PRIVILEGED, ObsSpec, check_obs, pixel_keys
from robotrl.data.replay import Batch
from robotrl.nn.augment import shift_images
from robotrl.nn.encoders import ImageTrunk, PixelEncoder
from robotrl.nn.mlp import EnsembleMLP, mlp


@dataclass
class DrQv2Config(AgentConfig):
    name: str = "drqv2"
    hidden: list[int] = field(default_factory=lambda: [1024, 1024])
    num_critics: int = 2
    lr: float = 1e-4
    gamma: float = 0.99
    tau: float = 0.01
    n_step: int = 3
    update_every: int = 2  # env steps per update round
    std_init: float = 1.0  # exploration std, linear in env steps from std_init to std_final
    std_final: float = 0.1
    std_decay_steps: int = 100_000
    std_clip: float = 0.3  # target-policy and actor-loss noise is clipped to +-std_clip
    precision: str = "fp32"  # fp32 | bf16 | auto, as SAC's
    bc_weight: float = 0.0  # behaviour cloning on offline rows (Batch.demo), as SAC's
    bc_weight_final: float | None = None
    bc_decay_updates: int = 0
    obs_norm: bool = False  # standardise the state entries with the training batches' running statistics (as SAC's)

    @property
    def replay_n_step(self) -> int:
        return self.n_step

    @property
    def replay_gamma(self) -> float:
        return self.gamma

    def validate(self) -> None:
        super().validate()
        positive = ("num_critics", "n_step", "std_decay_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        check_finite(self, ("lr",), 0.0)
        check_finite(self, ("std_init", "std_final", "std_clip"), 0.0, inclusive=True)
        check_layer_widths(self, ("hidden",))
        if not 0 < self.tau <= 1:
            raise ValueError(f"agent.tau must be in (0, 1], got {self.tau}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"agent.gamma must be in [0, 1], got {self.gamma}")
        check_bc_schedule(self.bc_weight, self.bc_weight_final, self.bc_decay_updates)
        if self.precision not in PRECISIONS:
            raise ValueError(f"agent.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")


class Actor(nn.Module):
    def __init__(self, image_dim: int, state_dim: int, cfg: DrQv2Config, action_dim: int):
        super().__init__()
        self.trunk = ImageTrunk(image_dim, cfg.encoder.feature_dim)
        self.policy = mlp(cfg.encoder.feature_dim + state_dim, cfg.hidden, action_dim)

    def forward(self, image: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """The deterministic action in (-1, 1)."""
        return torch.tanh(self.policy(self.trunk(image, state)))


class Critic(nn.Module):
    """Its own trunk, then `num_critics` Q heads evaluated in one batched pass."""

    def __init__(self, image_dim: int, state_dim: int, cfg: DrQv2Config, action_dim: int):
        super().__init__()
        self.trunk = ImageTrunk(image_dim, cfg.encoder.feature_dim)
        self.q = EnsembleMLP(cfg.num_critics, cfg.encoder.feature_dim + state_dim + action_dim, cfg.hidden, 1)

    def forward(self, image: torch.Tensor, state: torch.Tensor | None, action: torch.Tensor) -> torch.Tensor:
        h = self.trunk(image, state)
        return self.q(torch.cat([h, action.to(h.dtype)], -1))  # [N, B, 1]


def clipped_noise(shape, std: float | torch.Tensor, clip: float, device) -> torch.Tensor:
    return (torch.randn(shape, device=device) * std).clamp_(-clip, clip)


class DrQv2(Agent):
    def __init__(self, cfg: DrQv2Config, obs_spec: ObsSpec, action_dim: int, device: str | torch.device = "cpu"):
        if PRIVILEGED in obs_spec:
            raise ValueError(
                "agent=drqv2 has no privileged critic input (randomization.privileged=true): use agent=sac, or "
                "set randomization.privileged=false"
            )
        super().__init__()
        cfg.validate()
        if not pixel_keys(obs_spec):
            raise ValueError(
                f"agent=drqv2 learns from pixels, but the task's observation has no image entry ({sorted(obs_spec)}); "
                "set task.obs=pixels or task.obs=state+pixels"
            )
        self.cfg, self.obs_spec, self.action_dim = cfg, dict(obs_spec), action_dim
        self.encoder = PixelEncoder(
            obs_spec, cfg.encoder.conv_channels, cfg.encoder.conv_layers, cfg.encoder.conv_stride, cfg.obs_norm
        )
        image_dim, state_dim = self.encoder.out_dim, self.encoder.state_dim
        self.actor = Actor(image_dim, state_dim, cfg, action_dim)
        self.critic = Critic(image_dim, state_dim, cfg, action_dim)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        # env steps on the actor's clock: drives the exploration std (saved with the agent)
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.long))
        # this update's behaviour-cloning weight, filled before each update (a CUDA graph reads it in place)
        self.register_buffer("_bc_weight", torch.zeros(()), persistent=False)
        self.to(device)
        dev = torch.device(device)
        graphs = cfg.compile and dev.type == "cuda"  # the whole update as one CUDA graph (agents/compiled.py)
        critic_params = [*self.encoder.parameters(), *self.critic.parameters()]
        self.critic_optimizer = make_adam(critic_params, cfg.lr, capturable=graphs)
        self.actor_optimizer = make_adam(self.actor.parameters(), cfg.lr, capturable=graphs)
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.target_critic.parameters())
        self._autocast = mixed_precision(cfg.precision, dev)
        self.num_updates = 0
        self._critic_losses, self._actor_losses, self._step = self._critic_loss, self._actor_loss, self._update_step
        if cfg.compile:
            self._critic_losses = CompiledFunction(self._critic_loss, "DrQ-v2's critic loss")
            self._actor_losses = CompiledFunction(self._actor_loss, "DrQ-v2's actor loss")
            if graphs:
                self._step = GraphedStep(self._update_step, dev)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic": self.critic_optimizer, "actor": self.actor_optimizer}

    def advance_exploration(self, episode_start: torch.Tensor) -> None:
        self.env_steps += episode_start.numel()

    def exploration_std(self) -> float:
        return float(self._std())

    def _std(self) -> torch.Tensor:
        """The scheduled std as a 0-d tensor on the agent's device: reading it needs no host sync."""
        cfg = self.cfg
        progress = (self.env_steps.float() / cfg.std_decay_steps).clamp(max=1.0)
        return cfg.std_init + progress * (cfg.std_final - cfg.std_init)

    def _encode(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.encoder(obs), self.encoder.state_features(obs)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        check_obs(self.obs_spec, obs)
        with self._autocast():
            action = self.actor(*self._encode(obs)).float()
        if deterministic:
            return action
        return (action + torch.randn_like(action) * self._std()).clamp_(-1.0, 1.0)

    def _policy_sample(self, image: torch.Tensor, state: torch.Tensor | None, std: torch.Tensor) -> torch.Tensor:
        return self._perturb(self.actor(image, state).float(), std)

    def _perturb(self, mean: torch.Tensor, std: torch.Tensor, straight_through: bool = False) -> torch.Tensor:
        """`mean` plus clipped noise, clamped to [-1, 1]. With `straight_through` (the actor's loss) the clamp
        passes its gradient on, as DrQ-v2's TruncatedNormal does: a hard clamp gave every sample beyond a
        bound no gradient at all, even where the critic pulls the action back inside."""
        noisy = mean + clipped_noise(mean.shape, std, self.cfg.std_clip, mean.device)
        clamped = noisy.clamp(-1.0, 1.0)
        return noisy + (clamped - noisy).detach() if straight_through else clamped

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """A critic (and encoder) step on augmented observations, then an actor step on detached features."""
        cfg = self.cfg
        bc_weight = bc_weight_at(cfg.bc_weight, cfg.bc_weight_final, cfg.bc_decay_updates, self.num_updates)
        self._bc_weight.fill_(bc_weight)
        metrics = self._step(batch, bc_weight > 0)
        self.num_updates += 1
        return metrics

    def _update_step(self, batch: Batch, cloning: bool) -> dict[str, torch.Tensor]:
        """The whole update on the device: what `agent.compile` captures as one CUDA graph."""
        std = self._std()
        self.encoder.observe(batch.obs)  # nothing without agent.obs_norm
        critic_loss, q_mean, image, state = self._critic_losses(batch, std)
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        # the actor ascends a fixed critic: its weights are switched out of autograd for this step, so no
        # critic weight gradients (the trunk's alone is [feature_dim, 39,200]) are computed and thrown away
        self.critic.requires_grad_(False)
        state = None if state is None else state.detach()
        actor_loss, bc_loss = self._actor_losses(batch, image.detach(), state, std, cloning)
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.critic.requires_grad_(True)
        self.actor_optimizer.step()

        with torch.no_grad():
            torch._foreach_lerp_(self._target_params, self._critic_params, self.cfg.tau)
        metrics = {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "q_mean": q_mean,
            "exploration_std": std,
        }
        if bc_loss is not None:
            metrics["bc_loss"] = bc_loss.detach()
        return metrics

    def _critic_loss(
        self, batch: Batch, std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The critics' TD loss on shifted observations, their mean value, and the encoded observations."""
        keys, pad = self.encoder.image_keys, self.cfg.encoder.shift_pad
        obs, next_obs = shift_images(batch.obs, keys, pad), shift_images(batch.next_obs, keys, pad)
        with self._autocast():
            image, state = self._encode(obs)
            with torch.no_grad():
                next_image, next_state = self._encode(next_obs)
                next_action = self._policy_sample(next_image, next_state, std)
                target_q = full_precision_min(self.target_critic(next_image, next_state, next_action))
                target = batch.reward + batch.discount * target_q
            q = self.critic(image, state, batch.action).float()
            critic_loss = F.mse_loss(q, target.expand_as(q)) * q.shape[0]
        return critic_loss, q.detach().mean(), image, state

    def _actor_loss(
        self, batch: Batch, image: torch.Tensor, state: torch.Tensor | None, std: torch.Tensor, cloning: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The actor's loss against the (fixed) critic, and its behaviour-cloning term where it has one (`cloning`:
        this update's weight, `_bc_weight`, is above 0)."""
        with self._autocast():
            mean = self.actor(image, state).float()
            actor_q = full_precision_min(self.critic(image, state, self._perturb(mean, std, straight_through=True)))
            actor_loss = -actor_q.mean()
            bc_loss = None
            if cloning and batch.demo is not None:
                bc_loss = behaviour_cloning_loss(mean, batch.action, batch.demo)
                actor_loss = actor_loss + self._bc_weight * bc_loss
        return actor_loss, bc_loss


def full_precision_min(q: torch.Tensor) -> torch.Tensor:
    """The ensemble minimum [B, 1] of [N, B, 1] Q-values, in float32."""
    return q.float().min(dim=0).values
