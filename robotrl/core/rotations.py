"""Batched quaternion helpers (w, x, y, z), torch only."""

from __future__ import annotations

import torch


def quat_conjugate(q: torch.Tensor) -> torch.Tensor:
    return q * _like(q, "conjugate")


def _hamilton_table() -> torch.Tensor:
    """[4, 16]: `a @ table` laid out as 4x4 is the matrix L(a) with L(a) @ b = a * b (Hamilton product)."""
    table = torch.zeros(4, 4, 4)  # [i, j, k]: coefficient of a_j * b_k in (a * b)_i
    for i, j, k, sign in (
        (0, 0, 0, 1), (0, 1, 1, -1), (0, 2, 2, -1), (0, 3, 3, -1),
        (1, 0, 1, 1), (1, 1, 0, 1), (1, 2, 3, 1), (1, 3, 2, -1),
        (2, 0, 2, 1), (2, 1, 3, -1), (2, 2, 0, 1), (2, 3, 1, 1),
        (3, 0, 3, 1), (3, 1, 2, 1), (3, 2, 1, -1), (3, 3, 0, 1),
    ):  # fmt: skip
        table[i, j, k] = sign
    return table.permute(1, 0, 2).reshape(4, 16)


_CONSTANTS = {"hamilton": _hamilton_table(), "conjugate": torch.tensor([1.0, -1.0, -1.0, -1.0])}
_ON_DEVICE: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}


def _like(x: torch.Tensor, name: str) -> torch.Tensor:
    """A constant on `x`'s device in its dtype, made there once (tasks on a GPU backend call these every control
    step; the pose shield computes in float64)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return _CONSTANTS[name]
    key = (x.device, x.dtype, name)
    if key not in _ON_DEVICE:
        _ON_DEVICE[key] = _CONSTANTS[name].to(x.device, x.dtype)
    return _ON_DEVICE[key]


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a * b, as one small matrix product (a task calls this every control step)."""
    left = torch.matmul(a, _like(a, "hamilton")).reshape(*a.shape[:-1], 4, 4)
    return torch.matmul(left, b.unsqueeze(-1)).squeeze(-1)


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
    q = q * torch.where(q[..., :1] < 0, -1.0, 1.0)
    vec = q[..., 1:]
    sin_half = vec.norm(dim=-1, keepdim=True)
    return vec * (2.0 * torch.atan2(sin_half, q[..., :1]) / sin_half.clamp_min(1e-9))


def quat_from_axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Unit quaternions [.., 4] for rotations by `angle` [..] about `axis` [.., 3] (need not be unit)."""
    axis = axis / axis.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    half = 0.5 * angle.unsqueeze(-1)
    return torch.cat([torch.cos(half), torch.sin(half) * axis], -1)


def quat_angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle [..] in radians of the rotation between orientations `a` and `b`, in [0, pi]."""
    dot = (a * b).sum(-1).abs().clamp(max=1.0)
    return 2.0 * torch.acos(dot)
