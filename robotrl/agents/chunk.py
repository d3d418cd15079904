"""Action-chunk critic: a SAC-style actor emits h actions at once and an ensemble critic scores the whole
chunk, Q(s_t, a_t..a_{t+h-1}) (as Q-chunking, Li et al. 2025, and CQN-AS, Seo et al. 2024).

Because the critic conditions on every action of the h steps it backs up over, the h-step return is an
unbiased target whatever policy collected the data:

    Q(s_t, a_t:t+h) <- sum_{j<h'} gamma^j r_{t+j} + gamma^h' (1 - terminated) min_i Q'_i(s_{t+h'}, c' ~ pi)

h' <= h is the number of steps before the episode ended (or the newest stored step); the replay pads
the chunk past them and masks their rewards (`SequenceBatch`). The loop builds its ReplayBuffer with
`n_step=cfg.agent.n_step`, which is `chunk_len` here, so `replay.sample` yields exactly these sequences.

Acting executes chunks open-loop or with temporal ensembling (robotrl/nn/chunk_execution.py), per env,
on the actor's clock: the exploring actor on reset/advance_exploration, the deterministic one on
reset/advance_evaluation, so an evaluation inside a training run leaves the exploring envs' chunks alone.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from robotrl.agents.base import PRECISIONS, Agent, make_adam, mixed_precision
from robotrl.agents.sac import TanhGaussianActor
from robotrl.data.replay import Batch, SequenceBatch
from robotrl.data.spec import ObsSpec, check_obs, pixel_keys
from robotrl.nn import EnsembleMLP, StateEncoder
from robotrl.nn.augment import random_shift
from robotrl.nn.chunk_execution import EXECUTIONS, ChunkExecution
from robotrl.nn.encoders import ImageStateEncoder


@dataclass
class ChunkConfig:
    name: str = "chunk"
    chunk_len: int = 4  # h: actions per chunk, and steps per critic backup
    # open_loop: commit to each chunk for h steps (what the critic scores; exploration coherent over h
    # steps); ensemble: replan every step and average the overlapping chunks (smoother, more reactive).
    execution: str = "open_loop"
    ensemble_decay: float = 0.01  # ensemble: weight exp(-decay * age) of a chunk planned `age` steps ago
    actor_hidden: list[int] = field(default_factory=lambda: [256, 256])
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    num_critics: int = 2
    critic_layer_norm: bool = False
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    utd_ratio: int = 1  # gradient updates per env step
    actor_update_interval: int = 1  # critic updates per actor update
    init_alpha: float = 0.1
    learn_alpha: bool = True
    target_entropy: float | None = None  # None: -chunk_len * action_dim (SAC's -action_dim per step)
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    precision: str = "fp32"  # fp32 | bf16 | auto, as SAC's
    # Pixel observations (uint8 image entries): DrQ-v2's conv encoder and trunk, shared by actor and critic
    # (learned through the critic; the actor reads detached features), random-shift augmentation.
    frame_stack: int = 3
    conv_channels: int = 32
    conv_layers: int = 4
    feature_dim: int = 50
    shift_pad: int = 4

    @property
    def n_step(self) -> int:
        """Steps per backup, read by the loop to build the replay: always the chunk length."""
        return self.chunk_len

    def validate(self) -> None:
        positive = (
            "chunk_len",
            "num_critics",
            "batch_size",
            "utd_ratio",
            "actor_update_interval",
            "frame_stack",
            "conv_channels",
            "conv_layers",
            "feature_dim",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"agent.{name} must be an integer >= 1, got {value!r}")
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha"):
            if not getattr(self, name) > 0:
                raise ValueError(f"agent.{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"agent.tau must be in (0, 1], got {self.tau}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"agent.gamma must be in [0, 1], got {self.gamma}")
        if self.execution not in EXECUTIONS:
            raise ValueError(f"agent.execution must be one of {', '.join(EXECUTIONS)}, got {self.execution!r}")
        if not abs(self.ensemble_decay) < float("inf"):
            raise ValueError(f"agent.ensemble_decay must be finite, got {self.ensemble_decay}")
        if self.shift_pad < 0:
            raise ValueError(f"agent.shift_pad must be >= 0, got {self.shift_pad}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"agent.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"agent.log_std_min ({self.log_std_min}) must be below agent.log_std_max ({self.log_std_max})"
            )


class ChunkCritic(Agent):
    def __init__(self, cfg: ChunkConfig, obs_spec: ObsSpec, action_dim: int, device: str | torch.device = "cpu"):
        super().__init__()
        cfg.validate()
        self.cfg, self.obs_spec, self.action_dim = cfg, dict(obs_spec), action_dim
        self.chunk_len = cfg.chunk_len
        chunk_dim = cfg.chunk_len * action_dim
        # The one place observations become features: conv encoders + trunk for image entries, else flat state.
        self.pixel_keys = pixel_keys(obs_spec)
        if self.pixel_keys:
            self.encoder = ImageStateEncoder(obs_spec, cfg.feature_dim, cfg.conv_channels, cfg.conv_layers)
        else:
            self.encoder = StateEncoder(obs_spec)
        feat = self.encoder.out_dim
        self.actor = TanhGaussianActor(feat, cfg.actor_hidden, chunk_dim, cfg.log_std_min, cfg.log_std_max)
        self.critic = EnsembleMLP(
            cfg.num_critics, feat + chunk_dim, cfg.critic_hidden, 1, layer_norm=cfg.critic_layer_norm
        )
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(cfg.init_alpha)).log(), requires_grad=cfg.learn_alpha)
        self.target_entropy = float(-chunk_dim if cfg.target_entropy is None else cfg.target_entropy)
        self.to(device)

        groups = [
            {"params": [*self.encoder.parameters(), *self.critic.parameters()], "lr": cfg.critic_lr},
            {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
        ]
        if cfg.learn_alpha:
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha_lr})
        self.optimizer = make_adam(groups, cfg.critic_lr)
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.target_critic.parameters())
        self.num_updates = 0
        self._autocast = mixed_precision(cfg.precision, torch.device(device))
        self._last_actor_metrics: dict[str, torch.Tensor] = {}
        # Actor-side state, not module state (never checkpointed: a resumed run's envs restart from a reset).
        self.exploring: ChunkExecution | None = None
        self.evaluating: ChunkExecution | None = None

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"chunk": self.optimizer}

    # ---- acting -------------------------------------------------------------------------------------

    def _execution(self, num_envs: int) -> ChunkExecution:
        cfg = self.cfg
        return ChunkExecution(num_envs, cfg.chunk_len, self.action_dim, cfg.execution, cfg.ensemble_decay, self.device)

    def reset_exploration(self, num_envs: int) -> None:
        self.exploring = self._execution(num_envs)

    def advance_exploration(self, episode_start: torch.Tensor) -> None:
        if self.exploring is not None:
            self.exploring.advance(episode_start)

    def reset_evaluation(self, num_envs: int) -> None:
        self.evaluating = self._execution(num_envs)

    def advance_evaluation(self, episode_start: torch.Tensor) -> None:
        if self.evaluating is not None:
            self.evaluating.advance(episode_start)

    def chunks(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """Planned chunks [B, chunk_len, action_dim] in (-1, 1) for a batch of observations."""
        check_obs(self.obs_spec, obs)
        with torch.no_grad(), self._autocast():
            dist = self.actor(self.encoder(obs))
            flat = dist.mode if deterministic else dist.rsample_with_log_prob()[0]
        return flat.view(-1, self.chunk_len, self.action_dim)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """This step's actions [E, action_dim] for E envs (row e of `obs` is env e), from the chunks each env
        is executing; without a reset_exploration / reset_evaluation call first, one is made for E envs."""
        num_envs = next(iter(obs.values())).shape[0]
        if deterministic:
            if self.evaluating is None:
                self.reset_evaluation(num_envs)
            execution = self.evaluating
        else:
            if self.exploring is None:
                self.reset_exploration(num_envs)
            execution = self.exploring
        if num_envs != execution.num_envs:
            hook = "reset_evaluation" if deterministic else "reset_exploration"
            raise ValueError(
                f"chunks are executed for {execution.num_envs} envs but {num_envs} observations came; "
                f"call agent.{hook}({num_envs}) when the number of envs changes"
            )
        return execution.act(lambda: self.chunks(obs, deterministic))

    # ---- learning -----------------------------------------------------------------------------------

    def _q(self, critic: nn.Module, features: torch.Tensor, chunk: torch.Tensor, frozen: bool = False):
        return critic(torch.cat([features, chunk.flatten(1)], dim=-1), frozen=frozen)  # [N, B, 1]

    def _check_batch(self, batch: Batch) -> SequenceBatch:
        if not isinstance(batch, SequenceBatch) or batch.actions.shape[1:] != (self.chunk_len, self.action_dim):
            got = list(batch.actions.shape) if isinstance(batch, SequenceBatch) else "single actions"
            raise ValueError(
                f"the chunk critic learns from action sequences of agent.chunk_len={self.chunk_len} steps, got "
                f"{got}; sample with replay.sample_sequences(batch_size, {self.chunk_len}) or build the "
                f"ReplayBuffer with n_step={self.chunk_len}"
            )
        return batch

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step and, every `actor_update_interval` updates, an actor and temperature step, in one
        backward pass and one fused Adam step (the losses touch disjoint parameters, as in SAC)."""
        batch = self._check_batch(batch)
        alpha = self.log_alpha.detach().exp()
        update_actor = (self.num_updates + 1) % self.cfg.actor_update_interval == 0
        if self.pixel_keys:
            batch = self._augmented(batch)
        with self._autocast():
            features = self.encoder(batch.obs)
            target = self.td_target(batch, alpha)
            q = self._q(self.critic, features, batch.actions)
            critic_loss = 0.5 * (q - target).pow(2).mean(dim=(1, 2)).sum()
            loss = critic_loss
            metrics = {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean()}
            if update_actor:  # the encoder learns only through the critic
                actor_loss, log_prob = self._actor_loss(features.detach(), alpha)
                loss = loss + actor_loss
                self._last_actor_metrics = {
                    "actor_loss": actor_loss.detach(),
                    "entropy": -log_prob.mean(),
                    "alpha": alpha,
                }
                if self.cfg.learn_alpha:
                    alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).mean()
                    loss = loss + alpha_loss
                    self._last_actor_metrics["alpha_loss"] = alpha_loss.detach()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._soft_update_target()
        self.num_updates += 1
        metrics.update(self._last_actor_metrics)
        return metrics

    def _augmented(self, batch: SequenceBatch) -> SequenceBatch:
        """The batch with every image entry of obs and next_obs randomly shifted (DrQ)."""
        obs, next_obs = dict(batch.obs), dict(batch.next_obs)
        for key in self.pixel_keys:
            obs[key] = random_shift(obs[key], self.cfg.shift_pad)
            next_obs[key] = random_shift(next_obs[key], self.cfg.shift_pad)
        return dataclasses.replace(batch, obs=obs, next_obs=next_obs)

    @torch.no_grad()
    def td_target(self, batch: SequenceBatch, alpha: torch.Tensor) -> torch.Tensor:
        """[B, 1]: the masked h'-step reward sum plus gamma^h' (1 - terminated) times the soft value of the
        observation after the sequence, under the target critics' minimum and a chunk from the actor."""
        next_features = self.encoder(batch.next_obs)
        next_chunk, next_log_prob = self.actor(next_features).rsample_with_log_prob()
        next_q = self._q(self.target_critic, next_features, next_chunk).min(dim=0).values
        return batch.reward + batch.discount * (next_q - alpha * next_log_prob)

    def _actor_loss(self, features: torch.Tensor, alpha: torch.Tensor):
        chunk, log_prob = self.actor(features).rsample_with_log_prob()
        q = self._q(self.critic, features, chunk, frozen=True).min(dim=0).values  # no critic weight gradients
        actor_loss = (alpha * log_prob - q).mean()
        return actor_loss, log_prob.detach()

    @torch.no_grad()
    def _soft_update_target(self) -> None:
        torch._foreach_lerp_(self._target_params, self._critic_params, self.cfg.tau)
