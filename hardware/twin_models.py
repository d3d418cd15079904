"""The simulated twin's actuator and sensor models, so a deployment rehearsal meets what training modelled
(robotrl/sim2real/actuation.py, sensing.py): a command in force a whole number of physics steps after the twin
received it, and joint states published with a calibration offset, noise and lost messages.

The twin takes them as `latency_ms`, `joint_pos_bias`, `joint_pos_noise`, `joint_vel_noise`, `object_pos_noise`,
`state_drop_prob` and `noise_seed` (hardware/sim_twin.py:SimTwinConfig).
"""

from __future__ import annotations

from collections import deque

import numpy as np

MAX_LATENCY_S = 1.0  # the command buffer: a longer latency is a configuration error, not a robot


class CommandDelay:
    """Actuator targets in force `steps` physics steps after they were sent: a FIFO, so never reordered."""

    def __init__(self, steps: int, initial: np.ndarray):
        if steps < 0:
            raise ValueError(f"a command delay must be >= 0 physics steps, got {steps}")
        self.steps = steps
        self.in_force = np.array(initial, dtype=np.float64)
        self._sent: deque[tuple[int, np.ndarray]] = deque()
        self.clock = 0  # physics steps taken

    def send(self, targets: np.ndarray) -> None:
        """Targets sent now (before the next physics step)."""
        self._sent.append((self.clock, np.array(targets, dtype=np.float64)))

    def tick(self) -> np.ndarray:
        """The targets in force for the next physics step; call once per step."""
        while self._sent and self._sent[0][0] + self.steps <= self.clock:
            self.in_force = self._sent.popleft()[1]
        self.clock += 1
        return self.in_force


class StateNoise:
    """What the twin's encoders and tracker report: a per-joint offset drawn at start-up, per-message noise, and
    messages lost with a probability."""

    def __init__(
        self,
        joints: int,
        pos_bias: float,
        pos_noise: float,
        vel_noise: float,
        object_pos_noise: float,
        drop_prob: float,
        seed: int,
    ):
        self.rng = np.random.default_rng(seed)
        self.bias = self.rng.normal(0.0, pos_bias, joints) if pos_bias > 0 else np.zeros(joints)
        self.pos_noise, self.vel_noise, self.object_pos_noise = pos_noise, vel_noise, object_pos_noise
        self.drop_prob = drop_prob

    def lost(self) -> bool:
        return self.drop_prob > 0 and bool(self.rng.random() < self.drop_prob)

    def joint_state(self, position: np.ndarray, velocity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position = position + self.bias
        if self.pos_noise > 0:
            position = position + self.rng.normal(0.0, self.pos_noise, len(position))
        if self.vel_noise > 0:
            velocity = velocity + self.rng.normal(0.0, self.vel_noise, len(velocity))
        return position, velocity

    def object_position(self, position: np.ndarray) -> np.ndarray:
        if self.object_pos_noise > 0:
            return position + self.rng.normal(0.0, self.object_pos_noise, 3)
        return position
