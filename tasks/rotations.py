"""Batched quaternion helpers (w, x, y, z), torch only."""

from __future__ import annotations

import torch


def quat_conjugate(q: torch.Tensor) -> torch.Tensor:
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        -1,
    )


def quat_to_matrix(q: torch.Tensor) -> torch.Tensor:
    w, x, y, z = q.unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        -1,
    ).reshape(*q.shape[:-1], 3, 3)


def rotation_error(target: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Axis-angle vector [.., 3] rotating `current` onto `target`, in the world frame (shortest way)."""
    q = quat_multiply(target, quat_conjugate(current))
    q = torch.where(q[..., :1] < 0, -q, q)
    vec = q[..., 1:]
    sin_half = vec.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    angle = 2.0 * torch.atan2(sin_half, q[..., :1])
    return vec / sin_half * angle


def quat_from_axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Unit quaternions [.., 4] for rotations by `angle` [..] about `axis` [.., 3] (need not be unit)."""
    axis = axis / axis.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    half = 0.5 * angle.unsqueeze(-1)
    return torch.cat([torch.cos(half), torch.sin(half) * axis], -1)


def quat_angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle [..] in radians of the rotation between orientations `a` and `b`, in [0, pi]."""
    dot = (a * b).sum(-1).abs().clamp(max=1.0)
    return 2.0 * torch.acos(dot)
