"""The end-effector workspace box, and pulling a target back so the move to it keeps the tool point inside."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from robotrl.safety.kinematics import KinematicChain

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

    def max_distance_outside(self, points: np.ndarray) -> float:
        """The largest `distance_outside` (own margin) over points [N, 3], in numpy (the per-step check)."""
        below = np.maximum(self._lower_inner - points, 0.0)
        above = np.maximum(points - self._upper_inner, 0.0)
        return float(np.sqrt(((below + above) ** 2).sum(axis=1)).max())


def limit_target_to_workspace(
    chain: KinematicChain,
    box: WorkspaceBox,
    current: torch.Tensor,
    base: torch.Tensor,
    candidate: torch.Tensor,
    path_to: Callable[[np.ndarray], np.ndarray | None],
) -> tuple[torch.Tensor | None, bool]:
    """The target nearest `candidate` on the joint-space segment base -> candidate whose whole predicted path
    (`path_to(target)`: joint positions along the move from the current state) keeps the tool point allowed.

    Allowed: inside the (shrunk) box, or, when the robot is outside it now (at `current`), no further out
    than now, so a robot that begins outside may only move toward the box. `base` is the target already
    being tracked. Returns (target, whether it was cut); target None: not even `base` is allowed (the
    caller brakes).
    """
    limit = None  # how far outside the robot is now: needed only when a path leaves the box

    def allowed(target: np.ndarray) -> bool:
        nonlocal limit
        path = path_to(target)
        if path is None:
            return False
        outside = box.max_distance_outside(chain.site_positions(path))
        if outside == 0.0:
            return True
        if limit is None:
            limit = box.max_distance_outside(chain.site_positions(current.numpy()[None])) + 1e-12
        return outside <= limit

    base_np, candidate_np = base.numpy(), candidate.numpy()
    if allowed(candidate_np):
        return candidate, False
    if not allowed(base_np):
        return None, True
    low, high = 0.0, 1.0
    delta = candidate_np - base_np
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        if allowed(base_np + middle * delta):
            low = middle
        else:
            high = middle
    return torch.from_numpy(base_np + low * delta), True
