"""How many gradient updates a run owes after a number of env steps, from `agent.*`'s update schedule.

Two schedules:
- per transition (the default): `agent.utd_ratio` updates per `agent.update_every` env steps, every env's step
  counted. One env: updates per step; 4,096 envs: 4,096 updates per vectorized step at the defaults.
- per vectorized step: `agent.updates_per_step` updates each time all `num_envs` envs step once, fractional
  allowed (0.25: one update every 4 vectorized steps), as off-policy learners on thousands of GPU envs run (FastTD3:
  a couple of updates per vectorized step on a large batch).

The training loop asks `due`; so does the learner, per transition only (the env steps its actors send arrive in
batches of any size, so it has no vectorized step to count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from robotrl.agents.config import AgentConfig

# Fractional schedules count in floating point: a product that should be a whole number must not round down.
ROUNDING_SLACK = 1e-9


@dataclass(frozen=True)
class UpdateSchedule:
    learning_starts: int
    num_envs: int
    utd_ratio: int = 1
    update_every: int = 1
    updates_per_step: float | None = None

    @classmethod
    def of(cls, agent: AgentConfig, learning_starts: int, num_envs: int) -> UpdateSchedule:
        return cls(learning_starts, num_envs, agent.utd_ratio, agent.update_every, agent.updates_per_step)

    def due(self, env_steps: int) -> int:
        """Updates owed after `env_steps` env steps in all: none up to `learning_starts`, then the schedule's."""
        if env_steps <= self.learning_starts:
            return 0
        if self.updates_per_step is None:
            every = self.update_every
            return self.utd_ratio * (env_steps // every - self.learning_starts // every)
        vectorized_steps = (env_steps - self.learning_starts) / self.num_envs
        return math.floor(self.updates_per_step * vectorized_steps + ROUNDING_SLACK)

    def env_steps_for(self, updates: int) -> int:
        """The env steps whose share of the schedule is `updates` updates (at least; `due` inverted)."""
        if updates <= 0:
            return 0
        if self.updates_per_step is None:
            return math.ceil(updates / self.utd_ratio) * self.update_every
        return math.ceil(updates * self.num_envs / self.updates_per_step - ROUNDING_SLACK)

    @property
    def updates_per_vectorized_step(self) -> int:
        """The most updates one vectorized step (every env stepping once) can owe."""
        if self.updates_per_step is None:
            return self.utd_ratio * math.ceil(self.num_envs / self.update_every)
        return math.ceil(self.updates_per_step - ROUNDING_SLACK)

    def describe(self) -> str:
        if self.updates_per_step is None:
            return f"agent.utd_ratio={self.utd_ratio} per agent.update_every={self.update_every} env steps"
        return f"agent.updates_per_step={self.updates_per_step} per vectorized step of num_envs={self.num_envs}"

    def check(self, total_steps: int) -> None:
        """Refuse, naming the settings, a schedule that would make no update in a run of `total_steps` env steps,
        or more updates in one vectorized step than the replay holds transitions at the first update."""
        if self.due(total_steps) == 0:
            raise ValueError(
                f"the update schedule ({self.describe()}) makes no update between learning_starts="
                f"{self.learning_starts} and total_steps={total_steps}: update more often or run longer"
            )
        # Checked with several envs only: one env's first updates may draw on demonstrations (hil.*) as well.
        in_replay = math.ceil((self.learning_starts + 1) / self.num_envs) * self.num_envs  # at the first update
        per_step = self.updates_per_vectorized_step
        if self.num_envs > 1 and per_step > in_replay:
            raise ValueError(
                f"the update schedule ({self.describe()}) makes {per_step} updates in one vectorized step, more than "
                f"the {in_replay} transitions the replay holds at the first update (learning_starts="
                f"{self.learning_starts}); with many envs set agent.updates_per_step (updates per vectorized step, "
                "e.g. 2) or raise learning_starts"
            )
