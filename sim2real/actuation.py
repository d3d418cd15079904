"""An actuator model between a task's commands and the simulator: command latency in whole physics substeps and a
first-order low-pass filter on the targets, as a robot's drivers and controller add them.

A command computed at a control step arrives `k` substeps later, `k` drawn per env (per episode or per step) from
`[latency_min, latency_max]`; until it arrives the previous command stays in force. Arrivals never go backwards: a
command drawn to arrive before its predecessor arrives with it, and the later one wins, so commands are never
reordered (MuJoCo Playground's per-step observation delay can reorder them). A command may arrive in a later
control step than the one that sent it (k beyond a control step's substeps). At an episode's start an env holds
the pose the task reset it to until its first command arrives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from robotrl.sim2real.randomization import stream_seed
from robotrl.tasks.arm_task import ArmTask
from robotrl.tasks.backend import SimBackend

LATENCY_PER = ("episode", "step")


@dataclass
class ActuationConfig:
    latency_min: int = 0  # physics substeps (2 ms each in the built-in scenes) a command arrives late, at least
    latency_max: int = 0  # ... and at most; drawn uniformly per env
    latency_per: str = "episode"  # episode: one draw per env and episode | step: a draw per command
    # Low-pass filter on the actuator targets as they arrive: target = a * previous + (1 - a) * arrived, per
    # substep-free command (0: off). A Franka's controller smooths commands this way (its cutoff is configurable).
    target_smoothing: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.latency_max > 0 or self.target_smoothing > 0

    def validate(self, key: str = "actuation", episode_substeps: int | None = None) -> None:
        if self.latency_min < 0 or self.latency_max < self.latency_min:
            raise ValueError(
                f"{key}.latency_min and latency_max must satisfy 0 <= latency_min <= latency_max, got "
                f"{self.latency_min} and {self.latency_max}"
            )
        if episode_substeps is not None and self.latency_max >= episode_substeps:
            raise ValueError(
                f"{key}.latency_max={self.latency_max} substeps is not shorter than an episode ({episode_substeps} "
                "substeps): no command would arrive within it"
            )
        if self.latency_per not in LATENCY_PER:
            raise ValueError(f"{key}.latency_per must be one of {', '.join(LATENCY_PER)}, got {self.latency_per!r}")
        if not (math.isfinite(self.target_smoothing) and 0.0 <= self.target_smoothing < 1.0):
            raise ValueError(f"{key}.target_smoothing must be in [0, 1), got {self.target_smoothing}")


class DelayedActuation:
    """Delivers a task's actuator targets `k` substeps late per env and steps the physics in between
    (tasks/arm_task.py:Actuation)."""

    def __init__(self, cfg: ActuationConfig, task: ArmTask, seed: int):
        control_substeps = task.cfg.control_substeps
        cfg.validate(episode_substeps=task.episode_steps * control_substeps)
        self.cfg, self.task, self.backend = cfg, task, task.backend
        self.num_envs = task.num_envs
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "actuation"))
        self.latency = torch.zeros(self.num_envs, dtype=torch.long)  # this episode's draw per env
        # pending commands, FIFO per env: arrival substep (a large number where empty) and targets
        self.slots = math.ceil(cfg.latency_max / control_substeps) + 2
        self.arrival = torch.full((self.num_envs, self.slots), _NEVER, dtype=torch.long)
        self.sequence = torch.zeros(self.num_envs, self.slots, dtype=torch.long)  # commands sent before, per env
        self.sent = 0
        self.pending: torch.Tensor | None = None  # [E, slots, A]
        self.current: torch.Tensor | None = None  # [E, A] the targets in force
        self.last_arrival = torch.zeros(self.num_envs, dtype=torch.long)
        self.clock = 0  # substeps since the start

    def _draw(self, count: int) -> torch.Tensor:
        span = self.cfg.latency_max - self.cfg.latency_min + 1
        return self.cfg.latency_min + torch.randint(span, (count,), generator=self.generator)

    def reset(self, env_ids: torch.Tensor, actuators: Sequence[str]) -> None:
        """After the task reset `env_ids`: drop their commands in flight, draw their latency for the episode, and
        hold the pose they were reset to until their first command arrives."""
        ids = env_ids.cpu()
        self.latency[ids] = self._draw(len(ids))
        self.arrival[ids] = _NEVER
        self.last_arrival[ids] = self.clock
        hold = self.task.hold_targets(env_ids).cpu().float()
        if self.current is None:
            self.current = torch.zeros(self.num_envs, hold.shape[1])
        self.current[ids] = hold
        self.backend.set_actuators(actuators, self.current)

    def apply(self, actuators: Sequence[str], targets: torch.Tensor, substeps: int) -> None:
        """Send this control step's targets [E, A] and advance the physics `substeps`, delivering every command
        that arrives within them at its substep."""
        backend = self.backend
        targets = targets.detach().cpu().float()
        if self.pending is None:
            self.pending = torch.zeros(self.num_envs, self.slots, targets.shape[1])
        if self.current is None:
            self.current = targets.clone()
        latency = self._draw(self.num_envs) if self.cfg.latency_per == "step" else self.latency
        arrival = torch.maximum(self.clock + latency, self.last_arrival)  # never before its predecessor
        self.last_arrival = arrival
        free = self.arrival == _NEVER
        if not free.any(1).all():
            raise AssertionError("command queue overflow")  # slots cover latency_max; a bug if reached
        slot = free.float().argmax(1)  # the first free slot: the queue stays in arrival order
        rows = torch.arange(self.num_envs)
        self.arrival[rows, slot] = arrival
        self.pending[rows, slot] = targets
        self.sent += 1
        self.sequence[rows, slot] = self.sent
        end = self.clock + substeps
        while True:
            due = self.arrival[self.arrival < end]
            if len(due) == 0:
                break
            at = int(due.min())
            if at > self.clock:
                backend.step(at - self.clock)
                self.clock = at
            self._deliver(backend, actuators, self.arrival <= self.clock)
        if end > self.clock:
            backend.step(end - self.clock)
            self.clock = end

    def _deliver(self, backend: SimBackend, actuators: Sequence[str], arrived: torch.Tensor) -> None:
        """Put the latest arrived command of each env in force (filtered) and free the slots."""
        has = arrived.any(1)
        latest = torch.where(arrived, self.sequence, -1).argmax(1)  # the last sent of those arrived
        rows = has.nonzero().flatten()
        arrived_targets = self.pending[rows, latest[rows]]
        a = self.cfg.target_smoothing
        self.current[rows] = a * self.current[rows] + (1 - a) * arrived_targets
        self.arrival[arrived] = _NEVER
        backend.set_actuators(actuators, self.current)


_NEVER = 2**62
