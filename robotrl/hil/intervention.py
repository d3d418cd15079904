"""Takeover corrections: an operator's action replaces the policy's while the operator is engaged.

`InterventionEnv` wraps any VecEnv. Each step it asks its `Operator` whether to take over each env and
with which action, executes the operator's action where it did, and reports both in the StepResult
(`intervened`, `action`), so the loop stores the executed action and copies the corrected steps to the
offline buffer (robotrl/data/mixer.py). The operator is a person on a teleop device (`TeleopOperator`)
or, in simulation, a scripted expert (robotrl/hil/scripted_operator.py).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch

from robotrl.core.env import EnvCancelled, Obs, StepResult
from robotrl.hil.teleop import TeleopCommand, TeleopDevice, command_to_action

log = logging.getLogger(__name__)

ON_DISCONNECT = ("resume", "stop")


class Operator(ABC):
    """Decides, for a batch of envs, where to take over and with what action."""

    @abstractmethod
    def decide(self, obs: Obs, policy_action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(engaged [E] bool, action [E, A] in [-1, 1]) for the step about to be taken from `obs`."""

    def observe(self, result: StepResult) -> None:  # noqa: B027
        """The step's outcome (called after every step); the default ignores it."""

    def stop_episode(self) -> torch.Tensor | None:
        """[E] bool: envs whose episode the operator ends now (e.g. its device disconnected); None: none."""
        return None

    def flush_stats(self) -> dict[str, float]:
        """Operator-specific figures since the last call, for the training log."""
        return {}

    def close(self) -> None:  # noqa: B027
        """Release the operator's device, if any."""


class TeleopOperator(Operator):
    """A person on a teleop device, for one env. A device that disconnects ends the takeover: the policy
    resumes (`on_disconnect="resume"`) or the episode is stopped (`"stop"`, then the policy runs on)."""

    def __init__(
        self,
        device: TeleopDevice,
        action_dim: int,
        on_disconnect: str = "resume",
        gain: float = 1.0,
        to_action_frame: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        """`to_action_frame` maps the device's [1, A] command, whose motion is in the robot's base axes, to
        the env's action frame (an ArmController's `world_to_action` under `task.relative_frame`)."""
        if on_disconnect not in ON_DISCONNECT:
            raise ValueError(f"hil.on_disconnect must be one of {', '.join(ON_DISCONNECT)}, got {on_disconnect!r}")
        self.device, self.action_dim, self.on_disconnect, self.gain = device, action_dim, on_disconnect, gain
        self.to_action_frame = to_action_frame
        self.connected = True
        self.last_command: TeleopCommand | None = None
        self._stop_pending = False

    def decide(self, obs: Obs, policy_action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if policy_action.shape[0] != 1:
            raise ValueError(f"a teleop operator drives one env, got {policy_action.shape[0]}")
        command = self.device.poll()
        self.last_command = command
        if not command.connected:
            if self.connected:
                log.warning("teleop device %s disconnected; takeover ended (%s)", self.device.name, self.on_disconnect)
                self._stop_pending = self.on_disconnect == "stop"
            self.connected = False
            return torch.zeros(1, dtype=torch.bool), policy_action
        self.connected = True
        action = command_to_action(command, self.action_dim, self.gain).unsqueeze(0)
        if self.to_action_frame is not None:
            action = self.to_action_frame(action)
        return torch.tensor([command.engaged]), action

    def stop_episode(self) -> torch.Tensor | None:
        if not self._stop_pending:
            return None
        self._stop_pending = False
        return torch.ones(1, dtype=torch.bool)

    def close(self) -> None:
        self.device.close()


class InterventionEnv:
    """A VecEnv whose steps an operator may take over; the StepResult says where and what was executed."""

    def __init__(self, env, operator: Operator):
        self.env, self.operator = env, operator
        self.name, self.num_envs, self.obs_spec = env.name, env.num_envs, env.obs_spec
        self.action_dim, self.has_success = env.action_dim, env.has_success
        self._obs: Obs | None = None
        self._steps = torch.zeros(self.num_envs, dtype=torch.long)
        self._intervened = torch.zeros(self.num_envs, dtype=torch.long)
        self._finished: list[tuple[int, int]] = []  # (intervened steps, steps) of finished episodes

    def __getattr__(self, name: str):  # the wrapped env's extras (e.g. `task`) stay reachable
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int | None = None) -> Obs:
        self._obs = self.env.reset(seed=seed)
        self._steps.zero_()
        self._intervened.zero_()
        return self._obs

    def step(self, action: torch.Tensor) -> StepResult:
        if self._obs is None:
            raise RuntimeError(f"{self.name}: step() before reset()")
        engaged, operator_action = self.operator.decide(self._obs, action)
        engaged = engaged.to(torch.bool).cpu()
        executed = torch.where(engaged.unsqueeze(-1), operator_action.to(action.dtype).cpu(), action.cpu())
        result = self.env.step(executed)
        result.intervened, result.action = engaged, executed
        stop = self.operator.stop_episode()
        if stop is not None and stop.any():
            result = self._stop(result, stop)
        self.operator.observe(result)
        self._account(engaged, result.terminated | result.truncated)
        self._obs = result.obs
        return result

    def _stop(self, result: StepResult, stop: torch.Tensor) -> StepResult:
        """End the episodes `stop` here as a truncation; their next observation is a fresh reset's."""
        if self.num_envs != 1:
            raise NotImplementedError("stopping one env's episode needs a VecEnv with per-env resets")
        ended = result.terminated | result.truncated
        if not ended.any():
            result.truncated = result.truncated | stop
            try:
                result.obs = self.env.reset()
            except EnvCancelled:  # stopped while a robot's scene was awaited: this step still counts
                result.obs = result.next_obs
        return result

    def _account(self, engaged: torch.Tensor, done: torch.Tensor) -> None:
        self._steps += 1
        self._intervened += engaged.long()
        for i in done.nonzero().flatten().tolist():
            self._finished.append((int(self._intervened[i]), int(self._steps[i])))
        self._steps[done] = 0
        self._intervened[done] = 0

    def flush_stats(self) -> dict[str, float]:
        """Mean intervened steps per finished episode and the share of their steps, since the last call."""
        stats = self.operator.flush_stats()
        if self._finished:
            counts, lengths = np.array(self._finished, dtype=np.float64).T
            self._finished.clear()
            stats.update(
                interventions_per_episode=float(counts.mean()), intervention_rate=float(counts.sum() / lengths.sum())
            )
        return stats

    def render(self) -> np.ndarray:
        return self.env.render()

    def close(self) -> None:
        self.operator.close()
        self.env.close()
