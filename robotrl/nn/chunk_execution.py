"""Executing action chunks one env step at a time, per parallel env, on the actor's clock.

A chunk policy plans `h` actions at once. Three ways to turn plans into one action per step:

- `open_loop`: commit to a chunk for its `h` steps, then plan the next one (Q-chunking, CQN-AS). The
  executed actions are exactly the chunks the policy emitted, which is what a chunk critic scores.
- `ensemble`: plan every step and act with a weighted average, over the chunks planned in the last `h`
  steps, of each one's entry for the current step (temporal ensembling, ACT). Weights are
  `exp(-decay * age)`, age 0 the chunk planned this step: decay > 0 favours recent plans, decay < 0
  older ones (ACT writes w_i = exp(-m * i) with i = 0 the oldest chunk, i.e. decay = -m).
- `receding`: plan every step and act with the new chunk's first action (receding horizon, as MPC):
  the most reactive, at a plan per step; the rest of each chunk only informs the critic's choice.

The clock is `advance(episode_start)`, called once per env step after the env stepped; an env whose
next action starts an episode forgets its chunks. `act` may be called again within a step: open-loop
returns the same action, ensembling and receding replace this step's plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

EXECUTIONS = ("open_loop", "ensemble", "receding")


def ensemble_weights(valid: torch.Tensor, decay: float) -> torch.Tensor:
    """Normalized weights [E, h] over chunk ages (column k: planned k steps ago) for the `valid` ones."""
    ages = torch.arange(valid.shape[1], device=valid.device, dtype=torch.float32)
    # normalized in log space: exp(-decay * age) overflows float32 for a strongly negative decay (inf / inf)
    return torch.softmax((-decay * ages).masked_fill(~valid, -math.inf), dim=1)


class ChunkExecution:
    """The chunks each of `num_envs` envs is executing, and how far it is into them."""

    def __init__(self, num_envs: int, chunk_len: int, action_dim: int, mode: str, decay: float, device: torch.device):
        if mode not in EXECUTIONS:
            raise ValueError(f"agent.execution must be one of {', '.join(EXECUTIONS)}, got {mode!r}")
        for name, value in (("num_envs", num_envs), ("agent.chunk_len", chunk_len), ("action_dim", action_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_envs, self.chunk_len, self.mode, self.decay = num_envs, chunk_len, mode, float(decay)
        self.device = torch.device(device)
        h, envs = chunk_len, torch.arange(num_envs, device=self.device)
        self._envs = envs
        # open-loop: each env's committed chunk and the steps already taken from it (h: plan anew)
        self.chunk = torch.zeros(num_envs, h, action_dim, device=self.device)
        self.steps_taken = torch.full((num_envs,), h, dtype=torch.long, device=self.device)
        # ensemble: plans[e, k] is the chunk env e planned k steps ago; live marks those still in use
        self.plans = torch.zeros(num_envs, h, h, action_dim, device=self.device)
        self.live = torch.zeros(num_envs, h, dtype=torch.bool, device=self.device)

    def act(self, plan: Callable[[], torch.Tensor]) -> torch.Tensor:
        """This step's actions [E, action_dim]; `plan()` returns fresh chunks [E, h, action_dim] for every
        env and is called only when some env needs one."""
        if self.mode == "open_loop":
            due = self.steps_taken >= self.chunk_len
            if bool(due.any()):
                chunks = self._checked(plan())
                self.chunk = torch.where(due[:, None, None], chunks, self.chunk)
                self.steps_taken = torch.where(due, 0, self.steps_taken)
            return self.chunk[self._envs, self.steps_taken]
        if self.mode == "receding":
            return self._checked(plan())[:, 0]
        self.plans[:, 0] = self._checked(plan())
        self.live[:, 0] = True
        current = self.plans.diagonal(dim1=1, dim2=2)  # [E, A, h]: plan k's entry k is for this step
        return torch.einsum("eak,ek->ea", current, ensemble_weights(self.live, self.decay))

    def advance(self, episode_start: torch.Tensor) -> None:
        """One env step has passed; envs in the [E] bool mask `episode_start` begin a new episode next."""
        episode_start = torch.as_tensor(episode_start)
        if episode_start.shape != (self.num_envs,) or episode_start.dtype != torch.bool:
            raise ValueError(
                f"episode_start must be a bool tensor of shape [{self.num_envs}], "
                f"got {episode_start.dtype} {list(episode_start.shape)}"
            )
        episode_start = episode_start.to(self.device)
        self.steps_taken = torch.where(episode_start, self.chunk_len, (self.steps_taken + 1).clamp(max=self.chunk_len))
        self.plans = self.plans.roll(1, dims=1)
        self.live = self.live.roll(1, dims=1)
        self.live[:, 0] = False  # the oldest plan has run out (it rolled round to age 0)
        self.live[episode_start] = False

    def _checked(self, chunks: torch.Tensor) -> torch.Tensor:
        expected = (self.num_envs, self.chunk_len, self.chunk.shape[-1])
        if tuple(chunks.shape) != expected:
            raise ValueError(
                f"chunks are executed for {self.num_envs} envs but plans of shape {list(chunks.shape)} came "
                f"(expected {list(expected)}); when the number of envs changes, call reset_exploration(num_envs) "
                "(reset_evaluation(num_envs) for deterministic acting)"
            )
        return chunks.to(self.chunk.dtype)
