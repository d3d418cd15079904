"""An actuator model between a task's commands and the simulator: command latency in whole physics substeps, a
first-order low-pass filter on the targets, as a robot's drivers and controller add them, and the safety shield's
motion limits, as a robot's shield imposes them.

A command computed at a control step arrives `k` substeps later, `k` drawn per env (per episode or per step) from
`[latency_min, latency_max]`; until it arrives the previous command stays in force. Arrivals never go backwards: a
command drawn to arrive before its predecessor arrives with it, and the later one wins, so commands are never
reordered (MuJoCo Playground's per-step observation delay can reorder them). A command may arrive in a later
control step than the one that sent it (k beyond a control step's substeps). At an episode's start an env holds
the pose the task reset it to until its first command arrives.

With `shield_motion`, an arm's joint targets reach its actuators as the shield on a robot sends them
(robotrl/safety/motion.py): along ruckig's jerk-limited path within the robot spec's velocity, acceleration and
jerk limits, one setpoint per physics substep as the shield sends one per control period. Without it a simulated
Panda accelerates several times faster than a Franka may: the scripted pick took 41 control steps in simulation
and about 88 on the twin through the shield (tests/test_actuation.py measures both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from robotrl.sim2real.randomization import stream_seed
from robotrl.tasks.arm_task import ArmTask
from robotrl.tasks.backend import SimBackend

from robotrl.safety.config import ShieldConfig
from robotrl.safety.limits import JointLimits
from robotrl.safety.motion import JerkLimitedMotion

LATENCY_PER = ("episode", "step")


@dataclass
class ActuationConfig:
    latency_min: int = 0  # physics substeps (2 ms each in the built-in scenes) a command arrives late, at least
    latency_max: int = 0  # ... and at most; drawn uniformly per env
    latency_per: str = "episode"  # episode: one draw per env and episode | step: a draw per command
    # Low-pass filter on the actuator targets as they arrive: target = a * previous + (1 - a) * arrived, per
    # substep-free command (0: off). A Franka's controller smooths commands this way (its cutoff is configurable).
    target_smoothing: float = 0.0
    # The arm's targets follow the shield's jerk-limited motion (the robot spec's limits, the shield's default
    # scales), so a policy learns the pace a robot behind its shield can keep; needs the `safety` extra (ruckig)
    shield_motion: bool = False

    @property
    def enabled(self) -> bool:
        return self.latency_max > 0 or self.target_smoothing > 0 or self.shield_motion

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
        # the shield's motion per env: the arm's columns (the first ones) move along it, a gripper's does not
        self.arm_columns = len(task.arm_actuators)
        self.motions: list[JerkLimitedMotion] = []
        if cfg.shield_motion:
            limits = JointLimits.from_spec(task.robot, ShieldConfig(control_period=task.backend.physics_dt))
            self.motions = [JerkLimitedMotion(limits, task.backend.physics_dt) for _ in range(self.num_envs)]
            self._lower, self._upper = limits.lower.float(), limits.upper.float()  # the margin the shield keeps

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
        for k, env in enumerate(ids.tolist() if self.motions else ()):
            self.motions[env].reset(hold[k, : self.arm_columns])
        self.backend.set_actuators(actuators, self._setpoints() if self.motions else self.current)

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
                self._advance(backend, actuators, at - self.clock)
            self._deliver(backend, actuators, self.arrival <= self.clock)
        if end > self.clock:
            self._advance(backend, actuators, end - self.clock)

    def _advance(self, backend: SimBackend, actuators: Sequence[str], substeps: int) -> None:
        """Step the physics `substeps`; with the shield's motion, one substep at a time, each with its setpoint."""
        if not self.motions:
            backend.step(substeps)
        else:
            for _ in range(substeps):
                for motion in self.motions:
                    motion.step()
                backend.set_actuators(actuators, self._setpoints())
                backend.step(1)
        self.clock += substeps

    def _setpoints(self) -> torch.Tensor:
        """The targets in force with the arm's columns at each env's motion setpoint."""
        out = self.current.clone()
        out[:, : self.arm_columns] = torch.stack([motion.position for motion in self.motions]).float()
        return out

    def _deliver(self, backend: SimBackend, actuators: Sequence[str], arrived: torch.Tensor) -> None:
        """Put the latest arrived command of each env in force (filtered) and free the slots."""
        has = arrived.any(1)
        latest = torch.where(arrived, self.sequence, -1).argmax(1)  # the last sent of those arrived
        rows = has.nonzero().flatten()
        arrived_targets = self.pending[rows, latest[rows]]
        a = self.cfg.target_smoothing
        self.current[rows] = a * self.current[rows] + (1 - a) * arrived_targets
        self.arrival[arrived] = _NEVER
        if not self.motions:
            backend.set_actuators(actuators, self.current)
            return
        for env in rows.tolist():  # a new move from where each arm's setpoint is now (a retarget mid-move curves)
            motion = self.motions[env]
            plan = motion.plan(torch.clamp(self.current[env, : self.arm_columns], self._lower, self._upper))
            if plan is not None:
                motion.follow(plan)


_NEVER = 2**62
