"""Hindsight goal relabelling (HER, Andrychowicz et al. 2017, its "future" strategy) for sampled sequences.

A goal-conditioned task describes where its goal sits in the observation with a `GoalSpec`; a replay with a
`Hindsight` gives `ratio` of the sequences it samples the goal that their episode achieved at a uniformly
drawn step at or after the start, recomputes every step's reward and success for it, and ends the sequence
at the first success where success ends episodes. Relabelling happens at sampling time, so the stored data
stays as it was recorded and each transition is seen with many goals over a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Obs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class GoalSpec:
    """How a goal-conditioned task's observations, rewards and success depend on its goal.

    Every callable works on any leading dimensions ([B], [B, L], ...):
    - `achieved(obs)` -> [..., G]: the goal the state reached (a pushed puck's position in the plane);
    - `with_goal(obs, goal)` -> the observation asking for `goal` [..., G] instead, every entry derived
      from the goal (a vector from the object to the goal) recomputed, the rest as it was;
    - `success(obs, goal)` -> [...] bool and `reward(obs, goal)` -> [...] float: the task's success and
      reward in the state `obs` shows, had the goal been `goal`.
    """

    achieved: Callable[[Obs], torch.Tensor]
    with_goal: Callable[[Obs, torch.Tensor], Obs]
    success: Callable[[Obs, torch.Tensor], torch.Tensor]
    reward: Callable[[Obs, torch.Tensor], torch.Tensor]


@dataclass
class Hindsight:
    """What a replay relabels: `ratio` of its sampled sequences, with goals found within `window` steps of
    their start (the task's episode length); `terminal_success`: a success ends the episode (the run's
    `task.terminate_on_success`), so a relabelled sequence ends at its first success, without bootstrapping."""

    spec: GoalSpec
    ratio: float
    window: int
    terminal_success: bool

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and 0.0 <= self.ratio <= 1.0):
            raise ValueError(f"her_ratio must be in [0, 1], got {self.ratio}")
        if self.window < 1:
            raise ValueError(f"the hindsight window (the task's episode length) must be >= 1, got {self.window}")

    def relabel(self, replay, row: torch.Tensor, env: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor):
        """Relabel sequences of `replay` (a ReplayBuffer) starting at (`row`, `env`) [B], stepping through
        `rows` [B, L] of which `valid` [B, L] belong to the stored episode.

        Returns (picked [B] bool, goal [B, G], valid [B, L], rewards [B, L], terminal [B, L]): the rows
        given a goal achieved later, that goal (anything where not picked), and each step's reward and
        termination for it. Steps after a relabelled termination leave the sequence. The goal is reached at
        the latest by the stored episode's last step, so no stored termination comes before a relabelled
        one: where success ends episodes, any stored termination at or after the goal's is moot.
        """
        spec, device = self.spec, row.device
        envs = env.unsqueeze(1)
        batch = row.shape[0]
        picked = torch.rand(batch, device=device) < self.ratio
        _, _, ahead = replay._sequence_rows(row, env, min(self.window, replay.horizon))  # steps left, >= 1
        future = (row + (torch.rand(batch, device=device) * ahead).long().clamp(max=ahead - 1)) % replay.horizon
        goal = spec.achieved({k: v[future, env] for k, v in replay.next_obs.items()})

        reached = {k: v[rows, envs] for k, v in replay.next_obs.items()}  # [B, L, ...]
        steps_goal = goal.unsqueeze(1).expand(*rows.shape, *goal.shape[1:])
        stored_terminal = replay.terminated[rows, envs]
        terminal = (stored_terminal | spec.success(reached, steps_goal)) if self.terminal_success else stored_terminal
        ended = (terminal & valid).int()
        relabelled_valid = valid & ((ended.cumsum(1) - ended) == 0)  # nothing after a relabelled termination

        keep = ~picked.unsqueeze(1)
        valid = torch.where(keep, valid, relabelled_valid)
        rewards = torch.where(keep, replay.reward[rows, envs], spec.reward(reached, steps_goal))
        terminal = torch.where(keep, stored_terminal, terminal)
        return picked, goal, valid, rewards, terminal

    def with_goal(self, obs: Obs, picked: torch.Tensor, goal: torch.Tensor) -> Obs:
        """`obs` [B, ...] asking for `goal` in the `picked` rows, unchanged elsewhere."""
        relabelled = self.spec.with_goal(obs, goal)
        return {
            key: torch.where(picked.view(-1, *[1] * (value.dim() - 1)), relabelled[key], value)
            for key, value in obs.items()
        }
