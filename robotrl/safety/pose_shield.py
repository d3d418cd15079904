"""The pose shield: every equilibrium pose sent to a Cartesian impedance controller passes through `PoseShield.filter`.

An impedance controller pulls the tool toward its equilibrium with a spring: the force is the stiffness times how far
the equilibrium leads the tool. So a pose command is safe when it is a valid pose, inside the workspace, not far
ahead of where the tool is, and not a jump from the last one sent. Order of the checks in one call:

1. finite position and quaternion, the quaternion of unit norm (within `UNIT_TOLERANCE`): else nothing is sent
   (the controller keeps the last equilibrium: it holds) and the call says why;
2. lead: the equilibrium at most `max_lead` metres and `max_lead_angle` radians from the measured tool pose (this
   bounds the spring's pull, stiffness x lead, in contact as in free space);
3. step: at most `max_step` metres and `max_step_angle` radians from the equilibrium sent last;
4. workspace: the position clipped into the box. The box is convex and the last equilibrium lies in it, so the
   straight move between them does too, and clipping never lengthens the step (a projection onto a convex set
   does not expand distances).

Each correction is counted (`info`: pose/<kind> = 1 when it fired). The shield holds no e-stop or watchdog of its
own: the robot env sends nothing while the joint shield is latched or the observation is stale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from robotrl.core.rotations import quat_from_axis_angle, quat_multiply, rotation_error

# |q| may differ from 1 by this much and still be normalised: float32 round trips keep it within 1e-6; a
# quaternion further off was not computed as a rotation (a bug, or a message's fields swapped)
UNIT_TOLERANCE = 1e-3
POSE_CORRECTIONS = ("nan", "orientation", "lead", "lead_angle", "step", "step_angle", "workspace")


@dataclass(frozen=True)
class PoseLimits:
    workspace_min: tuple[float, float, float]  # the tool point's box (x, y, z), in the robot's base frame
    workspace_max: tuple[float, float, float]
    max_step: float  # m between consecutive equilibria (a speed limit times the command period)
    max_step_angle: float  # rad between consecutive equilibria
    max_lead: float  # m the equilibrium may be from the measured tool point: bounds the spring's pull
    max_lead_angle: float  # rad the equilibrium's orientation may be from the measured one

    def validate(self) -> None:
        for name in ("max_step", "max_step_angle", "max_lead", "max_lead_angle"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"pose limit {name} must be a finite number > 0, got {value!r}")
        low, high = self.workspace_min, self.workspace_max
        if len(low) != 3 or len(high) != 3 or not all(math.isfinite(v) for v in (*low, *high)):
            raise ValueError(f"the pose workspace needs two finite (x, y, z) corners, got {low} and {high}")
        if not all(lo < hi for lo, hi in zip(low, high, strict=True)):
            raise ValueError(f"the pose workspace's min {list(low)} must be below its max {list(high)} on every axis")


@dataclass(frozen=True)
class SafePose:
    position: torch.Tensor  # float64 [3]
    quat: torch.Tensor  # float64 [4], unit, (w, x, y, z)
    info: dict[str, int]  # pose/<kind>: 1 where that correction fired


class PoseShield:
    def __init__(self, limits: PoseLimits):
        limits.validate()
        self.limits = limits
        self._low = torch.tensor(limits.workspace_min, dtype=torch.float64)
        self._high = torch.tensor(limits.workspace_max, dtype=torch.float64)
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self.totals = dict.fromkeys(POSE_CORRECTIONS, 0)

    @property
    def last(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The equilibrium (position, quaternion) let through last; None before the first."""
        return None if self._last is None else (self._last[0].clone(), self._last[1].clone())

    def reset(self, position: torch.Tensor, quat: torch.Tensor) -> None:
        """Start from the measured tool pose (a reset, a restart after a stop): the first step is measured from it."""
        position, quat, problem = _checked(position, quat)
        if problem is not None:
            raise ValueError(f"the pose shield cannot start from an invalid tool pose ({problem})")
        self._last = (position.clamp(self._low, self._high), quat)

    def filter(
        self, position: torch.Tensor, quat: torch.Tensor, measured_position: torch.Tensor, measured_quat: torch.Tensor
    ) -> tuple[SafePose | None, dict[str, int]]:
        """(the equilibrium to send, or None: send nothing; the corrections of this call). Positions in metres in
        the base frame, quaternions (w, x, y, z); the measured pose is the tool point's, from a fresh joint state."""
        if self._last is None:
            raise RuntimeError("call PoseShield.reset(position, quat) before filter()")
        info = dict.fromkeys((f"pose/{kind}" for kind in POSE_CORRECTIONS), 0)
        position, quat, problem = _checked(position, quat)
        measured_position, measured_quat, measured_problem = _checked(measured_position, measured_quat)
        if problem is not None or measured_problem is not None:
            kind = "nan" if "finite" in (problem or measured_problem) else "orientation"
            self._count(info, kind)
            return None, info
        lim = self.limits
        position, clipped = _clip_distance(position, measured_position, lim.max_lead)
        self._count(info, "lead", clipped)
        quat, clipped = _clip_angle(quat, measured_quat, lim.max_lead_angle)
        self._count(info, "lead_angle", clipped)
        last_position, last_quat = self._last
        position, clipped = _clip_distance(position, last_position, lim.max_step)
        self._count(info, "step", clipped)
        quat, clipped = _clip_angle(quat, last_quat, lim.max_step_angle)
        self._count(info, "step_angle", clipped)
        inside = position.clamp(self._low, self._high)
        self._count(info, "workspace", bool((inside != position).any()))
        self._last = (inside, quat)
        return SafePose(inside.clone(), quat.clone(), info), info

    def _count(self, info: dict[str, int], kind: str, fired: bool = True) -> None:
        if fired:
            info[f"pose/{kind}"] = 1
            self.totals[kind] += 1


def _checked(position, quat) -> tuple[torch.Tensor, torch.Tensor, str | None]:
    """(position, unit quaternion with w >= 0, None) or the problem: not finite, or not a rotation."""
    position = torch.as_tensor(position, dtype=torch.float64).reshape(-1)
    quat = torch.as_tensor(quat, dtype=torch.float64).reshape(-1)
    if position.shape != (3,) or quat.shape != (4,):
        raise ValueError(
            f"a pose is a position [3] and a quaternion [4], got {list(position.shape)} and {list(quat.shape)}"
        )
    if not (torch.isfinite(position).all() and torch.isfinite(quat).all()):
        return position, quat, "not finite"
    norm = float(quat.norm())
    if abs(norm - 1.0) > UNIT_TOLERANCE:
        return position, quat, f"quaternion norm {norm:.6f}, not 1"
    quat = quat / norm
    return position, quat if quat[0] >= 0 else -quat, None


def _clip_distance(point: torch.Tensor, anchor: torch.Tensor, bound: float) -> tuple[torch.Tensor, bool]:
    offset = point - anchor
    distance = float(offset.norm())
    if distance <= bound:
        return point, False
    return anchor + offset * (bound / distance), True


def _clip_angle(quat: torch.Tensor, anchor: torch.Tensor, bound: float) -> tuple[torch.Tensor, bool]:
    """`quat`, or the orientation `bound` radians from `anchor` along the shortest rotation toward it."""
    error = rotation_error(quat.unsqueeze(0), anchor.unsqueeze(0))[0]  # axis-angle, anchor -> quat
    angle = float(error.norm())
    if angle <= bound:
        return quat, False
    turned = quat_multiply(quat_from_axis_angle(error, torch.tensor(bound, dtype=torch.float64)), anchor)
    turned = turned / turned.norm()
    return (turned if turned[0] >= 0 else -turned), True
