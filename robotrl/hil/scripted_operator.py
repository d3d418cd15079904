"""A scripted operator for simulation: takes over as a person would, so the HIL loop runs without one.

It watches the policy against the task's scripted expert (tasks expose `expert_action()`), and takes over
an env for `takeover_steps` steps when the policy either drifts from the expert (the RMS difference of
their actions stays above `drift_threshold` for `patience` consecutive steps) or stalls (the state
observation barely changes for `stall_steps` steps). It never takes over an env whose task is already
succeeding. Each episode it may intervene for at most a budget of steps that decays geometrically with
the env's episode count, as a person corrects less as the policy improves and tires of correcting.

`would_intervene_rate` (logged) counts the steps on which a trigger fired, whatever the budget: it
falls only if the policy itself drifts and stalls less, which is the figure to watch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from robotrl.core.env import Obs, StepResult
from robotrl.hil.intervention import Operator


@dataclass
class ScriptedOperatorConfig:
    drift_threshold: float = 0.5  # RMS action difference to the expert that counts as drifting
    patience: int = 3  # consecutive drifting steps before taking over
    stall_steps: int = 15  # steps without state change that count as a stall (0: never)
    stall_tolerance: float = 1e-3  # largest change of any state entry that still counts as standing still
    takeover_steps: int = 10  # steps per takeover, then control returns to the policy
    budget: int = 60  # intervened steps allowed in an env's first episode
    budget_decay: float = 0.99  # per episode of that env (0.37 of the budget after 100 episodes)

    def validate(self) -> None:
        for name in ("patience", "takeover_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"hil.scripted.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("stall_steps", "budget"):
            if getattr(self, name) < 0:
                raise ValueError(f"hil.scripted.{name} must be >= 0, got {getattr(self, name)}")
        if not self.drift_threshold > 0:
            raise ValueError(f"hil.scripted.drift_threshold must be > 0, got {self.drift_threshold}")
        if not self.stall_tolerance >= 0:
            raise ValueError(f"hil.scripted.stall_tolerance must be >= 0, got {self.stall_tolerance}")
        if not 0 <= self.budget_decay <= 1:
            raise ValueError(f"hil.scripted.budget_decay must be within [0, 1], got {self.budget_decay}")


def find_task(env):
    """The simulated task under any wrappers (each wrapper keeps the wrapped env in `.env`), or None."""
    seen = env
    while seen is not None:
        task = seen.__dict__.get("task") if hasattr(seen, "__dict__") else None
        if task is not None:
            return task
        seen = seen.__dict__.get("env") if hasattr(seen, "__dict__") else None
    return None


def world_to_action_of(env) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How to turn an action whose motion is in world axes (a teleop device's) into `env`'s action frame:
    its simulated arm controller's `world_to_action`, a robot env's own, or None where there is none."""
    controller = getattr(find_task(env), "controller", None)
    if controller is not None:
        return controller.world_to_action
    seen = env  # a robot env converts in its own frame
    while seen is not None:
        if "world_to_action" in type(seen).__dict__:
            return seen.world_to_action
        seen = seen.__dict__.get("env") if hasattr(seen, "__dict__") else None
    return None


def expert_of(env) -> Callable[[], torch.Tensor]:
    """The scripted expert of `env`'s task: a callable returning [E, A] actions for the current state."""
    task = find_task(env)
    if task is None or task.expert is None:
        raise ValueError(f"task {env.name!r} has no scripted expert; the scripted operator needs one")
    return task.expert_action


class ScriptedOperator(Operator):
    def __init__(self, expert: Callable[[], torch.Tensor], num_envs: int, cfg: ScriptedOperatorConfig | None = None):
        self.cfg = cfg or ScriptedOperatorConfig()
        self.cfg.validate()
        self.expert = expert
        self.num_envs = num_envs
        self.drift_count = torch.zeros(num_envs, dtype=torch.long)
        self.stall_count = torch.zeros(num_envs, dtype=torch.long)
        self.takeover_left = torch.zeros(num_envs, dtype=torch.long)
        self.episodes = torch.zeros(num_envs, dtype=torch.long)
        self.budget_left = torch.full((num_envs,), self.cfg.budget, dtype=torch.long)
        self.succeeding = torch.zeros(num_envs, dtype=torch.bool)
        self._last_state: torch.Tensor | None = None
        self._steps = 0
        self._triggers = 0
        self._drift_sum = 0.0

    @staticmethod
    def _state(obs: Obs) -> torch.Tensor | None:
        """The observation's state entries (images left out) as one [E, D] tensor."""
        entries = [v.flatten(1).float() for _, v in sorted(obs.items()) if v.dtype != torch.uint8]
        return torch.cat(entries, 1) if entries else None

    def decide(self, obs: Obs, policy_action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        expert = self.expert().to(policy_action.dtype).cpu()
        policy = policy_action.detach().cpu()
        drift = (policy - expert).pow(2).mean(-1).sqrt()
        in_control = self.takeover_left > 0
        self.drift_count = torch.where((drift > cfg.drift_threshold) & ~in_control, self.drift_count + 1, 0)

        state = self._state(obs)
        if state is not None and self._last_state is not None and cfg.stall_steps > 0:
            still = (state - self._last_state).abs().amax(-1) <= cfg.stall_tolerance
            self.stall_count = torch.where(still & ~in_control, self.stall_count + 1, 0)
        self._last_state = state

        drifting = self.drift_count >= cfg.patience
        stalled = (self.stall_count >= cfg.stall_steps) if cfg.stall_steps > 0 else torch.zeros_like(drifting)
        trigger = (drifting | stalled) & ~self.succeeding
        start = trigger & ~in_control & (self.budget_left > 0)
        self.takeover_left[start] = cfg.takeover_steps
        engaged = (self.takeover_left > 0) & (self.budget_left > 0)
        self.budget_left = self.budget_left - engaged.long()
        # a takeover ends when its steps or the episode's budget run out
        self.takeover_left = torch.where(self.budget_left > 0, self.takeover_left - engaged.long(), 0)
        self.drift_count[start] = 0
        self.stall_count[start] = 0

        self._steps += self.num_envs
        self._triggers += int(trigger.sum())
        self._drift_sum += float(drift.sum())
        return engaged, expert

    def observe(self, result: StepResult) -> None:
        self.succeeding = result.success.clone()
        done = result.terminated | result.truncated
        if not done.any():
            return
        self.episodes += done.long()
        budget = (self.cfg.budget * self.cfg.budget_decay ** self.episodes.double()).floor().long()
        self.budget_left = torch.where(done, budget, self.budget_left)
        for counter in (self.drift_count, self.stall_count, self.takeover_left):
            counter[done] = 0
        self.succeeding[done] = False

    def flush_stats(self) -> dict[str, float]:
        if not self._steps:
            return {}
        stats = {
            "would_intervene_rate": self._triggers / self._steps,
            "expert_drift": self._drift_sum / self._steps,
            "intervention_budget": float(self.budget_left.float().mean()),
        }
        self._steps, self._triggers, self._drift_sum = 0, 0, 0.0
        return stats
