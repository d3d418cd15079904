"""Replay storage in preallocated torch tensors.

Layout is [time, env, ...]: each `add` writes one step of `num_envs` parallel environments, so a
transition's successor in its own episode is always one row down, whatever the number of envs. That
keeps n-step returns and action sequences (for action-chunk critics) a vectorized gather instead of a
per-sample walk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from robotrl.core.memory import tensor_bytes
from robotrl.core.spec import ObsSpec, TensorSpec, check_obs
from robotrl.data.hindsight import Hindsight

Obs = dict[str, torch.Tensor]


@dataclass
class Batch:
    """A sampled minibatch. `discount` already holds gamma^m * (1 - terminated), m the steps summed."""

    obs: Obs
    action: torch.Tensor
    reward: torch.Tensor  # [B, 1], the (n-step) discounted sum of rewards
    discount: torch.Tensor  # [B, 1]
    next_obs: Obs
    # [B] bool, set by a MixedReplay: rows drawn from the offline buffer (demonstrations and interventions),
    # which an agent may also fit by behaviour cloning. None: no offline rows in this batch.
    demo: torch.Tensor | None = field(default=None, kw_only=True)


@dataclass
class SequenceBatch(Batch):
    """A Batch whose transitions each start a sequence of `L` steps that stays inside one episode.

    A sequence stops after its episode's last step (termination or truncation) and at the newest stored
    step; `valid` marks the steps it keeps (step 0 always), `count` of them. `reward` is their discounted
    sum, `discount` is gamma^count * (1 - terminated) and `next_obs` the observation after the last kept
    step: the h-step backup of a critic that scores the whole action sequence. `action` is step 0's.

    A sequence that ends at a termination is as good as whole: whatever actions pad it change nothing. One
    `cut` short otherwise (by a time limit, the end of a stored segment or the newest stored step) scores
    padding that was never executed while its target bootstraps as if the policy took over at the cut, so
    a critic of whole sequences must not fit it (the last L-1 starts of every timed-out episode).
    """

    actions: torch.Tensor  # [B, L, A]; steps past the sequence's end repeat its last kept action
    rewards: torch.Tensor  # [B, L]; 0 where not valid
    valid: torch.Tensor  # [B, L] bool
    cut: torch.Tensor  # [B] bool: fewer than L steps kept, and the last of them not a termination


class ReplayBuffer:
    """Ring buffer of transitions with vectorized uniform sampling and optional n-step returns.

    Truncation (a time limit) ends the n-step sum but still bootstraps from the next observation;
    termination ends it without bootstrapping. Sums never run past the newest stored step.
    """

    def __init__(
        self,
        obs_spec: ObsSpec,
        action_dim: int,
        capacity: int,
        num_envs: int = 1,
        n_step: int = 1,
        gamma: float = 0.99,
        device: str | torch.device = "cpu",
    ):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.obs_spec = dict(obs_spec)
        self.action_dim = action_dim
        self.num_envs = num_envs
        self.horizon = math.ceil(capacity / num_envs)  # rows of the ring
        if self.horizon < n_step + 1:  # an n-step sum would silently be cut to what the ring holds
            raise ValueError(
                f"n_step={n_step} does not fit a replay of {self.horizon} steps per env (replay_capacity={capacity}, "
                f"num_envs={num_envs}); raise replay_capacity"
            )
        self.n_step = n_step
        self.gamma = gamma
        self.device = torch.device(device)

        rows, envs = self.horizon, num_envs
        self.obs = self._alloc_obs(rows, envs)
        self.next_obs = self._alloc_obs(rows, envs)
        self.action = torch.zeros(rows, envs, action_dim, device=self.device)
        self.reward = torch.zeros(rows, envs, device=self.device)
        self.terminated = torch.zeros(rows, envs, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(rows, envs, dtype=torch.bool, device=self.device)
        self.pos = 0  # next row to write
        self.full = False
        self._gamma_powers = gamma ** torch.arange(n_step, device=self.device, dtype=torch.float32)
        self.hindsight: Hindsight | None = None  # goal relabelling at sampling time, set by the run

    def committed_bytes(self, stored: int, device: torch.device) -> int:
        """Bytes this buffer holds on `device` once `stored` transitions were written; built on the meta device,
        it allocates nothing itself. Here everything: the rows are allocated zeroed up front."""
        return tensor_bytes(self)

    def _alloc_obs(self, rows: int, envs: int) -> Obs:
        return {
            k: torch.zeros(rows, envs, *s.shape, dtype=s.dtype, device=self.device) for k, s in self.obs_spec.items()
        }

    @property
    def rows_filled(self) -> int:
        return self.horizon if self.full else self.pos

    def __len__(self) -> int:
        return self.rows_filled * self.num_envs

    def add(
        self,
        obs: Mapping[str, torch.Tensor],
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: Mapping[str, torch.Tensor],
        terminated: torch.Tensor,
        truncated: torch.Tensor,
    ) -> None:
        """Store one step of every env; each argument has a leading [num_envs] dimension."""
        row = self.pos
        for key in self.obs_spec:
            self.obs[key][row].copy_(obs[key])
            self.next_obs[key][row].copy_(next_obs[key])
        self.action[row].copy_(action)
        self.reward[row].copy_(reward)
        self.terminated[row].copy_(terminated)
        self.truncated[row].copy_(truncated)
        self.pos = (row + 1) % self.horizon
        self.full = self.full or self.pos == 0

    def check_step(self, obs: Mapping[str, torch.Tensor], action: torch.Tensor) -> None:
        """Validate shapes once (e.g. on the first add) with messages that name the bad entry."""
        check_obs(self.obs_spec, obs)
        TensorSpec((self.action_dim,)).check("action", action)

    def _sample_index(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        filled = self.rows_filled
        if filled == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        row = torch.randint(0, filled, (batch_size,), device=self.device)
        env = torch.randint(0, self.num_envs, (batch_size,), device=self.device)
        return row, env

    def sample(self, batch_size: int) -> SequenceBatch:
        """Uniform transitions with `n_step` returns; each also carries its `n_step`-step action sequence."""
        row, env = self._sample_index(batch_size)
        if self.n_step > 1 or self.hindsight is not None:
            return self.sequences_at(row, env, self.n_step)
        obs, next_obs = self._observations(row, env, row)
        action = self.action[row, env]
        reward = self.reward[row, env].unsqueeze(-1)
        discount = self.gamma * (~self.terminated[row, env]).float()
        valid = torch.ones(batch_size, 1, dtype=torch.bool, device=self.device)
        cut = torch.zeros(batch_size, dtype=torch.bool, device=self.device)
        return SequenceBatch(
            obs, action, reward, discount.unsqueeze(-1), next_obs, action.unsqueeze(1), reward, valid, cut
        )

    def sample_sequences(self, batch_size: int, length: int) -> SequenceBatch:
        """Uniform start transitions, each with the sequence of up to `length` steps that follows it."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"sequence length must be an integer >= 1, got {length!r}")
        row, env = self._sample_index(batch_size)
        return self.sequences_at(row, env, length)

    def sequences_at(self, row: torch.Tensor, env: torch.Tensor, length: int) -> SequenceBatch:
        """The sequences starting at stored rows `row` of envs `env` ([B] long tensors), see SequenceBatch;
        with `hindsight`, some of them asking for a goal their episode achieved later (data/hindsight.py)."""
        rows, valid, count = self._sequence_rows(row, env, length)
        envs = env.unsqueeze(1)
        if self.hindsight is None:
            rewards, terminal = self.reward[rows, envs], self.terminated[rows, envs]
        else:
            picked, goal, valid, rewards, terminal = self.hindsight.relabel(self, row, env, rows, valid)
            count = valid.sum(1)
        last_step = (count - 1).unsqueeze(1)
        last = rows.gather(1, last_step).squeeze(1)
        steps = torch.arange(length, device=self.device)
        padded_rows = rows.gather(1, torch.minimum(steps.unsqueeze(0), last_step))  # pad: repeat the last action
        rewards = rewards * valid
        gamma_powers = self.gamma ** steps.float()
        reward = (rewards * gamma_powers).sum(1, keepdim=True)
        terminated = terminal.gather(1, last_step).squeeze(1)
        discount = self.gamma ** count.float() * (~terminated).float()
        cut = (count < length) & ~terminated
        obs, next_obs = self._observations(row, env, last)
        if self.hindsight is not None:
            relabel = self.hindsight.with_goal
            obs, next_obs = relabel(obs, picked, goal), relabel(next_obs, picked, goal)
        actions = self.action[padded_rows, envs]
        return SequenceBatch(obs, actions[:, 0], reward, discount.unsqueeze(-1), next_obs, actions, rewards, valid, cut)

    def _observations(self, row: torch.Tensor, env: torch.Tensor, last: torch.Tensor) -> tuple[Obs, Obs]:
        """The observations of transitions (`row`, `env`) and the next observations of (`last`, `env`)."""
        return {k: v[row, env] for k, v in self.obs.items()}, {k: v[last, env] for k, v in self.next_obs.items()}

    def _sequence_rows(self, row: torch.Tensor, env: torch.Tensor, length: int):
        """Rows [B, L] of the `length` steps from `row` (ring order), which of them belong to the sequence
        (same episode, not past the newest stored row) and how many do (>= 1)."""
        steps = torch.arange(length, device=self.device)
        rows = (row.unsqueeze(1) + steps) % self.horizon  # [B, L]
        envs = env.unsqueeze(1)
        ends = (self.terminated[rows, envs] | self.truncated[rows, envs]).int()
        steps_ahead = (self.pos - 1 - row) % self.horizon  # newest stored row is reachable
        within = steps.unsqueeze(0) <= steps_ahead.unsqueeze(1)
        before_end = (ends.cumsum(1) - ends) == 0  # no episode end strictly before step k
        valid = within & before_end
        return rows, valid, valid.sum(1)

    def _n_step(self, row: torch.Tensor, env: torch.Tensor):
        """(discounted reward sum [B], discount [B], last row [B]) of the `n_step` returns from `row`."""
        rows, included, count = self._sequence_rows(row, env, self.n_step)
        reward = (self.reward[rows, env.unsqueeze(1)] * self._gamma_powers * included).sum(1)
        last = rows.gather(1, (count - 1).unsqueeze(1)).squeeze(1)
        discount = self.gamma ** count.float() * (~self.terminated[last, env]).float()
        return reward, discount, last

    def _storage(self) -> dict[str, torch.Tensor]:
        named = {f"obs.{k}": v for k, v in self.obs.items()}
        named.update({f"next_obs.{k}": v for k, v in self.next_obs.items()})
        named.update(action=self.action, reward=self.reward, terminated=self.terminated, truncated=self.truncated)
        return named

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The filled rows only, as tensors (safetensors-ready); counters are 0-dim tensors."""
        filled = self.rows_filled
        state = {name: t[:filled] for name, t in self._storage().items()}
        state.update(pos=torch.tensor(self.pos), full=torch.tensor(self.full), horizon=torch.tensor(self.horizon))
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for name in ("pos", "full", "horizon"):
            if name not in state:
                raise KeyError(f"replay state lacks {name!r}")
        if int(state["horizon"]) != self.horizon:
            raise ValueError(
                f"replay state was saved with {int(state['horizon'])} rows per env, this buffer has "
                f"{self.horizon} (replay_capacity or num_envs changed?)"
            )
        pos, full = int(state["pos"]), bool(state["full"])
        filled = self.horizon if full else pos
        for name, target in self._storage().items():
            if name not in state:
                raise KeyError(f"replay state lacks {name!r}")
            if tuple(state[name].shape) != (filled, *target.shape[1:]):
                raise ValueError(
                    f"replay state {name!r} has shape {list(state[name].shape)}, expected {[filled, *target.shape[1:]]}"
                )
            target[:filled].copy_(state[name])
        self.pos, self.full = pos, full
        if filled:
            # A resumed run restarts every env from a reset, so the episodes in the newest row were cut
            # there: a time-limit-like end (bootstrap, but no n-step sum or sequence into the next episode).
            newest = (pos - 1) % self.horizon
            self.truncated[newest] |= ~self.terminated[newest]
