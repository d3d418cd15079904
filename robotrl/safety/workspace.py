"""The end-effector workspace box, and pulling a target back so the move to it keeps the tool point inside."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from robotrl.safety.kinematics import KinematicChain
from robotrl.safety.motion import Plan

SEARCH_STEPS = 6  # bisections along the segment from the tracked target to a refused one (1/64 of it)


class WorkspaceBox:
    """An axis-aligned box for the end effector; `margin` shrinks it for the targets the shield accepts."""

    def __init__(self, lower: Sequence[float], upper: Sequence[float], margin: float = 0.0):
        self.lower = torch.tensor(lower, dtype=torch.float64)
        self.upper = torch.tensor(upper, dtype=torch.float64)
        self.margin = float(margin)
        self._lower_inner = (self.lower + self.margin).numpy()
        self._upper_inner = (self.upper - self.margin).numpy()

    def distance_outside(self, point: torch.Tensor, margin: float | None = None) -> torch.Tensor:
        """Euclidean distance from the box shrunk by `margin` (default: the box's), 0 inside; [...]."""
        margin = self.margin if margin is None else margin
        below = (self.lower + margin - point).clamp(min=0)
        above = (point - self.upper + margin).clamp(min=0)
        return (below + above).norm(dim=-1)

    def contains(self, point: torch.Tensor, margin: float | None = None) -> torch.Tensor:
        return self.distance_outside(point, margin) == 0

    def clamp_inside(self, point: np.ndarray, slack: float = 0.0) -> np.ndarray:
        """`point` [..., 3] moved, axis by axis, into the box shrunk by its margin (where the shield accepts
        targets): a coordinate beyond a face goes `slack` inside it, one within the box stays as it is. A Cartesian
        step that would leave the box so keeps its parts along the faces it does not cross."""
        inside = (point >= self._lower_inner) & (point <= self._upper_inner)
        return np.where(inside, point, np.clip(point, self._lower_inner + slack, self._upper_inner - slack))

    def max_distance_outside(self, points: np.ndarray, margin: float | None = None) -> float:
        """The largest `distance_outside` (default: own margin) over points [N, 3], in numpy (the per-step
        checks)."""
        if margin is None:
            lower, upper = self._lower_inner, self._upper_inner
        else:
            lower, upper = self._lower_inner - self.margin + margin, self._upper_inner + self.margin - margin
        below = np.maximum(lower - points, 0.0)
        above = np.maximum(points - upper, 0.0)
        return float(np.sqrt(((below + above) ** 2).sum(axis=1)).max())


class PathCheck:
    """Whether a planned move keeps the tool point allowed: inside the (shrunk) box, or, when the robot is
    outside it now, no further out than now (a robot that begins outside may only move toward the box)."""

    def __init__(self, chain: KinematicChain, box: WorkspaceBox, current: torch.Tensor):
        self.chain, self.box = chain, box
        self._current = current
        self._limit: float | None = None  # how far outside the robot is now: needed only when a path leaves

    def allows(self, plan: Plan | None) -> bool:
        if plan is None:
            return False
        outside = self.box.max_distance_outside(self.chain.site_positions(plan.path()))
        if outside == 0.0:
            return True
        if self._limit is None:
            current = self._current.numpy()[None]
            self._limit = self.box.max_distance_outside(self.chain.site_positions(current)) + 1e-12
        return outside <= self._limit


def limit_target_to_workspace(
    check: PathCheck,
    base: torch.Tensor,
    candidate: torch.Tensor,
    plan: Callable[[torch.Tensor], Plan | None],
) -> tuple[Plan | None, bool]:
    """The move (`plan(target)`, from the current state) to the target nearest `candidate` on the joint-space
    segment base -> candidate that `check` allows. `base` is the target already being tracked. Returns
    (plan, whether the target was cut); plan None: no target on the segment but perhaps `base` itself is
    allowed from here (the caller keeps the move it follows, which was checked when it began).
    """
    candidate_plan = plan(candidate)
    if check.allows(candidate_plan):
        return candidate_plan, False
    low, high, best = 0.0, 1.0, None
    delta = candidate - base
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        middle_plan = plan(base + middle * delta)
        if check.allows(middle_plan):
            low, best = middle, middle_plan
        else:
            high = middle
    return best, True
