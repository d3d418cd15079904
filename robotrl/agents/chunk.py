"""Action-chunk critic: a SAC-style actor emits h actions at once and an ensemble critic scores the whole
chunk, Q(s_t, a_t..a_{t+h-1}) (as Q-chunking, Li et al. 2025, and CQN-AS, Seo et al. 2024).

Because the critic conditions on every action of the h steps it backs up over, the h-step return is an
unbiased target whatever policy collected the data:

    Q(s_t, a_t:t+h) <- sum_{j<h'} gamma^j r_{t+j} + gamma^h' (1 - terminated) min_i Q'_i(s_{t+h'}, c' ~ pi)

h' <= h is the number of steps before the episode ended (or the newest stored step); the replay pads
the chunk past them and masks their rewards (`SequenceBatch`). Only a termination makes h' < h exact (the
padding changes nothing after it): a sequence cut by a time limit or the newest stored step scores padding
that never ran, so the critics do not fit it (`td_rows`). The loop builds its replay with
`agent.replay_n_step`, which is `chunk_len` here, so `replay.sample` yields exactly these sequences.
Everything else is SAC's (subclassed): networks, temperature, precision, pixels.

With decoupled chunks (agent.policy_chunk_len = k < h) the actor plans only k actions; c' ~ pi above is
then scored by the target of a partial critic Q_k(s, a_t..a_{t+k-1}), distilled from the chunk critic by
expectile regression over the completions the data holds, which is also what the actor ascends.

Acting executes chunks open-loop, with temporal ensembling or receding (robotrl/nn/chunk_execution.py), per env,
on the actor's clock: the exploring actor on reset/advance_exploration, the deterministic one on
reset/advance_evaluation, so an evaluation inside a training run leaves the exploring envs' chunks alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from robotrl.agents.base import masked_mean
from robotrl.agents.sac import SAC, SACConfig, TanhGaussianActor
from robotrl.core.spec import PRIVILEGED, ObsSpec, check_obs
from robotrl.data.replay import Batch, SequenceBatch
from robotrl.nn import TanhNormal
from robotrl.nn.chunk_execution import EXECUTIONS, ChunkExecution
from robotrl.nn.distributions import TimeCorrelatedTanhNormal
from robotrl.nn.mlp import EnsembleMLP


@dataclass
class ChunkConfig(SACConfig):
    """SAC's settings (networks, learning rates, temperature, precision, pixels), and the chunk's own.
    `n_step` does not apply: the backup runs over `chunk_len` steps. `target_entropy` is the whole chunk's
    (chunk_len * action_dim entries; None: minus that count, SAC's -1 an entry)."""

    name: str = "chunk"
    chunk_len: int = 4  # h: actions per chunk, and steps per critic backup
    # open_loop: commit to each chunk for h steps (what the critic scores; the plan is coherent over h
    # steps, its noise only with noise_correlation); ensemble: replan every step and average the
    # overlapping chunks (smoother, more reactive); receding: replan every step and take the new chunk's
    # first action (MPC-style).
    execution: str = "open_loop"
    # How the deterministic policy (evaluation, deployment) executes its chunks; null: as `execution`.
    # Exploring open-loop keeps the data what the critic scores, while acting need not commit to a plan.
    eval_execution: str | None = None
    ensemble_decay: float = 0.01  # ensemble: weight exp(-decay * age) of a chunk planned `age` steps ago
    # Best-of-N (Q-chunking's QC, with the actor as the proposal): exploring and the TD target draw this
    # many chunks from the actor and take the one the critics' minimum (the target critics' in the target)
    # rates highest. 1: a single sample, as SAC. Evaluation keeps the actor's mode.
    num_samples: int = 1
    # Exploration noise correlated over a chunk's steps: per action entry an AR(1) process with this
    # correlation between consecutive steps (0: independent, as SAC). Independent noise averages out over a
    # chunk (its displacement grows as sqrt(h)); correlated noise moves the chunk coherently. Each entry keeps
    # its std: the target entropy is lowered by what the correlation removes (TimeCorrelatedTanhNormal).
    noise_correlation: float = 0.0
    # Decoupled chunks (DQC, Li, Park & Levine 2025): the actor plans and executes policy_chunk_len = k <= h
    # actions, so it reacts every k steps, while the critic keeps scoring and backing up over chunk_len = h. A
    # second ensemble Q_k(s, a_0..a_{k-1}) is regressed on the upper `distill_expectile` expectile of the chunk
    # critic over the completions a_k..a_{h-1} the data holds (an optimistic max over in-data completions); the
    # actor ascends Q_k and the h-step target bootstraps from it. null: k = h, the plain chunk critic.
    policy_chunk_len: int | None = None
    distill_expectile: float = 0.9

    @property
    def replay_n_step(self) -> int:
        return self.chunk_len  # the replay yields whole chunks: chunk_len steps per sampled sequence

    @property
    def plan_len(self) -> int:
        """Actions per planned (and executed) chunk: policy_chunk_len, or chunk_len when it is null."""
        return self.chunk_len if self.policy_chunk_len is None else self.policy_chunk_len

    def validate(self) -> None:
        for name in ("chunk_len", "num_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"agent.{name} must be an integer >= 1, got {value!r}")
        super().validate()
        if self.n_step != 1:
            raise ValueError(
                f"agent=chunk backs up over agent.chunk_len={self.chunk_len} steps; agent.n_step does not apply "
                f"(got {self.n_step}, leave it 1)"
            )
        if self.smoothness_weight:
            raise ValueError(
                "agent=chunk: agent.smoothness_weight compares actions one step apart, but a chunk's next "
                f"observation is chunk_len steps on; leave it 0 (got {self.smoothness_weight})"
            )
        if self.exploration != "gaussian":
            raise ValueError(
                f"agent=chunk samples whole chunks; agent.exploration must be gaussian, got {self.exploration!r}"
            )
        for name in ("execution", "eval_execution"):
            value = getattr(self, name)
            if value not in EXECUTIONS and not (name == "eval_execution" and value is None):
                raise ValueError(f"agent.{name} must be one of {', '.join(EXECUTIONS)}, got {value!r}")
        k = self.policy_chunk_len
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.chunk_len):
            raise ValueError(
                f"agent.policy_chunk_len must be null or an integer in [1, agent.chunk_len={self.chunk_len}], got {k!r}"
            )
        if not 0.0 < self.distill_expectile < 1.0:
            raise ValueError(f"agent.distill_expectile must be in (0, 1), got {self.distill_expectile}")
        if not 0.0 <= self.noise_correlation < 1.0:
            raise ValueError(f"agent.noise_correlation must be in [0, 1), got {self.noise_correlation}")
        if not abs(self.ensemble_decay) < float("inf"):
            raise ValueError(f"agent.ensemble_decay must be finite, got {self.ensemble_decay}")


class ChunkActor(TanhGaussianActor):
    """SAC's tanh-Gaussian actor over a flattened chunk, its noise correlated over the chunk's steps."""

    def __init__(self, features: int, hidden: list[int], plan_dim: int, cfg: ChunkConfig):
        super().__init__(features, hidden, plan_dim, cfg.log_std_min, cfg.log_std_max)
        self.steps, self.rho = cfg.plan_len, cfg.noise_correlation

    def forward(self, features: torch.Tensor) -> TimeCorrelatedTanhNormal:
        independent = super().forward(features)
        return TimeCorrelatedTanhNormal(independent.mean, independent.log_std, self.steps, self.rho)


class ChunkCritic(SAC):
    """SAC whose action is a whole chunk: the critic sees h * action_dim values, the actor plans k * action_dim
    (k = h unless agent.policy_chunk_len), the replay gives h-step sequences, and `act` executes the planned
    chunks one env step at a time."""

    def __init__(self, cfg: ChunkConfig, obs_spec: ObsSpec, action_dim: int, device: str | torch.device = "cpu"):
        if PRIVILEGED in obs_spec:
            raise ValueError(
                "agent=chunk has no privileged critic input (randomization.privileged=true): use agent=sac, or "
                "set randomization.privileged=false"
            )
        super().__init__(cfg, obs_spec, cfg.chunk_len * action_dim, device)  # validates; the critic sees chunks
        self.action_dim = action_dim  # what the env takes per step
        self.chunk_len, self.plan_len = cfg.chunk_len, cfg.plan_len
        if cfg.target_entropy is None:  # SAC's default, -1 an entry the actor samples
            self.target_entropy = -float(self.plan_len * action_dim)
        self.target_entropy += TimeCorrelatedTanhNormal.entropy_offset(self.plan_len, action_dim, cfg.noise_correlation)
        # Decoupled chunks: Q_k over the actor's k-step plans, distilled from the h-step chunk critic.
        self.partial_critic: EnsembleMLP | None = None
        if self.plan_len < self.chunk_len:
            inputs = self.encoder.out_dim + self.plan_len * action_dim
            self.partial_critic = EnsembleMLP(
                cfg.num_critics, inputs, cfg.critic_hidden, 1, layer_norm=cfg.critic_layer_norm
            ).to(device)
            self.target_partial_critic = copy.deepcopy(self.partial_critic).requires_grad_(False)
            self.optimizer.add_param_group({"params": list(self.partial_critic.parameters()), "lr": cfg.critic_lr})
            self._critic_params += list(self.partial_critic.parameters())
            self._target_params += list(self.target_partial_critic.parameters())
        # Actor-side state, not module state (never checkpointed: a resumed run's envs restart from a reset).
        self.exploring: ChunkExecution | None = None
        self.evaluating: ChunkExecution | None = None

    @property
    def policy_critic(self) -> torch.nn.Module:
        return self.critic if self.partial_critic is None else self.partial_critic

    @property
    def target_policy_critic(self) -> torch.nn.Module:
        return self.target_critic if self.partial_critic is None else self.target_partial_critic

    def _make_actor(self, features: int, chunk_dim: int) -> torch.nn.Module:
        cfg = self.cfg
        plan_dim = chunk_dim // cfg.chunk_len * cfg.plan_len
        if cfg.noise_correlation == 0:
            return super()._make_actor(features, plan_dim)
        return ChunkActor(features, cfg.actor_hidden, plan_dim, cfg)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"chunk": self.optimizer}

    # ---- acting -------------------------------------------------------------------------------------

    def _execution(self, num_envs: int, mode: str) -> ChunkExecution:
        cfg = self.cfg
        return ChunkExecution(num_envs, self.plan_len, self.action_dim, mode, cfg.ensemble_decay, self.device)

    def reset_exploration(self, num_envs: int) -> None:
        self.exploring = self._execution(num_envs, self.cfg.execution)

    def advance_exploration(self, episode_start: torch.Tensor) -> None:
        if self.exploring is not None:
            self.exploring.advance(episode_start)

    def reset_evaluation(self, num_envs: int) -> None:
        self.evaluating = self._execution(num_envs, self.cfg.eval_execution or self.cfg.execution)

    def advance_evaluation(self, episode_start: torch.Tensor) -> None:
        if self.evaluating is not None:
            self.evaluating.advance(episode_start)

    def chunks(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        """Planned chunks [B, plan_len, action_dim] in (-1, 1) for a batch of observations."""
        check_obs(self.obs_spec, obs)
        with torch.no_grad(), self._autocast():
            features = self.encoder(obs)
            dist = self.actor(features)
            flat = dist.mode if deterministic else self._best_of_samples(self.policy_critic, features, dist)[0]
        return flat.view(-1, self.plan_len, self.action_dim)

    def _best_of_samples(
        self, critic: torch.nn.Module, features: torch.Tensor, dist: TanhNormal
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, of `num_samples` chunks drawn from `dist` the one `critic`'s minimum rates highest, and its
        log-density under `dist` ([B, k * action_dim], [B, 1]). The selection makes the chosen chunk likelier
        than that density says: the entropy bonus of a target taken this way is an overestimate."""
        n = self.cfg.num_samples
        if n == 1:
            return dist.rsample_with_log_prob()
        rows = features.shape[0]
        chunks, log_probs = dist.expand(n).rsample_with_log_prob()  # [n, B, D], [n, B, 1]
        q = self._q(critic, features.expand(n, *features.shape).reshape(n * rows, -1), chunks.flatten(0, 1))
        best = q.min(dim=0).values.view(n, rows).argmax(dim=0)
        row = torch.arange(rows, device=features.device)
        return chunks[best, row], log_probs[best, row]

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

    def target_action(self, next_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._best_of_samples(self.target_policy_critic, next_features, self.actor(next_features))

    def _check_batch(self, batch: Batch) -> SequenceBatch:
        if not isinstance(batch, SequenceBatch) or batch.actions.shape[1:] != (self.chunk_len, self.action_dim):
            got = list(batch.actions.shape) if isinstance(batch, SequenceBatch) else "single actions"
            raise ValueError(
                f"the chunk critic learns from action sequences of agent.chunk_len={self.chunk_len} steps, got "
                f"{got}; sample with replay.sample_sequences(batch_size, {self.chunk_len}) or build the "
                f"ReplayBuffer with n_step={self.chunk_len}"
            )
        return batch

    def batch_action(self, batch: Batch) -> torch.Tensor:
        return batch.actions.flatten(1)

    def policy_action(self, batch: Batch) -> torch.Tensor:
        """[B, k * action_dim]: the recorded chunk's first k actions, the part the actor plans."""
        return batch.actions[:, : self.plan_len].flatten(1)

    def recorded_entries(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        """[B, k * action_dim]: a chunk past its episode's end repeats the last recorded action as padding,
        which the critic's masked return ignores and which cloning must not imitate either."""
        steps = batch.valid[:, : self.plan_len].repeat_interleave(self.action_dim, dim=1)
        return rows.unsqueeze(-1) & steps

    def td_rows(self, batch: Batch) -> torch.Tensor:
        """The sequences not `cut` short (SequenceBatch): a cut one's critic input holds padding that was never
        executed, while its target bootstraps as if the policy took over at the cut."""
        return ~batch.cut

    def _critic_loss(self, features: torch.Tensor, batch: Batch, alpha: torch.Tensor, next_features: torch.Tensor):
        """The chunk critic's TD loss, and with decoupled chunks the partial critic's distillation loss."""
        critic_loss, q = super()._critic_loss(features, batch, alpha, next_features)
        if self.partial_critic is None:
            return critic_loss, q
        return critic_loss + self._distillation_loss(features.detach(), batch, q.min(dim=0).values), q

    def _distillation_loss(self, features: torch.Tensor, batch: Batch, chunk_q: torch.Tensor) -> torch.Tensor:
        """Expectile regression of Q_k(s, a_0..a_{k-1}) on `chunk_q` ([B, 1], detached), the chunk critics'
        minimum for the recorded chunk: above the median (expectile > 0.5) it tends to the best completion
        a_k..a_{h-1} the data holds."""
        error = chunk_q - self._q(self.partial_critic, features, self.policy_action(batch))  # [N, B, 1]
        tau = self.cfg.distill_expectile
        weight = torch.where(error < 0, 1.0 - tau, tau)
        return masked_mean(weight * error.pow(2), self.td_rows(batch)).sum()

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """SAC's update on whole chunks: the critic regresses Q(s_t, chunk) on the masked h'-step return
        plus the discounted soft value after the sequence (`batch.reward`, `batch.discount`)."""
        return super().update(self._check_batch(batch))
