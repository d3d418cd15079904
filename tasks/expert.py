"""A task's scripted expert as a function of observation entries, so one expert drives a simulated env and a robot.

In simulation the task feeds it the entries it `reads`, computed from the simulator's state whatever the policy
observes (pixels included); on a robot the robot env's observation holds the same entries (joint states, forward
kinematics, tracked objects, goals), and `robotrl-record hardware=... teleop=scripted` feeds it those. Its action
moves the tool in world axes (`motion`); the env's `world_to_action` turns that into the env's action frame.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import ClassVar

import torch


class Expert(ABC):
    """A scripted expert for `num_envs` envs; phases it keeps between steps are per env and start over at `reset`."""

    reads: ClassVar[tuple[str, ...]]  # the observation entries `motion` and `judges_success` read

    def __init__(self, max_ee_step: float, num_envs: int, device: torch.device | str = "cpu"):
        self.max_ee_step, self.num_envs, self.device = max_ee_step, num_envs, torch.device(device)

    def reset(self, env_ids: torch.Tensor) -> None:
        """`env_ids`' episodes start over (a stateless expert keeps nothing)."""
        return

    @abstractmethod
    def motion(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The action [E, A] for observation entries `state` ([E, ...] each), its motion in world axes, in [-1, 1]."""

    def judges_success(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[E] bool: what a person watching would call done, from `state` alone. Used where the task cannot score
        itself from its observation (pick's contacts): the scripted person of a robot recording marks success by it.
        No judgement by default: never done."""
        return torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def toward(self, target: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
        """The motion [E, 3] that moves `point` towards `target`, full speed beyond one step's reach."""
        return ((target - point) / self.max_ee_step).clamp(-1.0, 1.0)

    @classmethod
    def missing_entries(cls, observed: Iterable[str]) -> list[str]:
        """The entries the expert reads that an observation of entries `observed` lacks."""
        return sorted(set(cls.reads) - set(observed))
