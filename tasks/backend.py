"""The simulator interface a task is written against: batched, torch in and out.

A task never touches a simulator's own API. Every query and command carries a leading `num_envs`
dimension; `env_ids` selects a subset for resets. MuJoCo implements this now (mujoco_backend.py); a
second simulator must implement the same methods and no task may need to change for it.
Quaternions are (w, x, y, z).
State comes back on the backend's `device` (the CPU for MuJoCo, the simulator's device for Genesis), so a
task's per-step math runs where the state lives; setters take tensors on any device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


class SimBackend(ABC):
    num_envs: int
    physics_dt: float
    device: torch.device = torch.device("cpu")

    @abstractmethod
    def joint_pos(self, joints: Sequence[str]) -> torch.Tensor:
        """[E, len(joints)] positions of hinge/slide joints."""

    @abstractmethod
    def joint_vel(self, joints: Sequence[str]) -> torch.Tensor:
        """[E, len(joints)] velocities of hinge/slide joints."""

    @abstractmethod
    def set_joint_state(
        self, env_ids: torch.Tensor, joints: Sequence[str], pos: torch.Tensor, vel: torch.Tensor | None = None
    ) -> None:
        """Set positions (and velocities, else zero) of `joints` in the envs `env_ids` ([K] long)."""

    @abstractmethod
    def set_free_body_pose(self, env_ids: torch.Tensor, body: str, pos: torch.Tensor, quat: torch.Tensor) -> None:
        """Place a body that has a free joint; its velocity is zeroed."""

    @abstractmethod
    def set_mocap_pose(
        self, env_ids: torch.Tensor, body: str, pos: torch.Tensor, quat: torch.Tensor | None = None
    ) -> None:
        """Move (and, given `quat`, turn) a mocap body (markers, targets, fixtures) in the envs `env_ids`."""

    @abstractmethod
    def set_actuators(self, actuators: Sequence[str], values: torch.Tensor) -> None:
        """Targets [E, len(actuators)] for the named actuators (position actuators take joint targets)."""

    @abstractmethod
    def step(self, substeps: int) -> None:
        """Advance every env by `substeps` physics steps."""

    @abstractmethod
    def forward(self, env_ids: torch.Tensor | None = None) -> None:
        """Recompute derived quantities (poses, Jacobians) after states were set."""

    @abstractmethod
    def site_pose(self, site: str) -> tuple[torch.Tensor, torch.Tensor]:
        """World position [E, 3] and orientation quaternion [E, 4] of a site."""

    @abstractmethod
    def body_pose(self, body: str) -> tuple[torch.Tensor, torch.Tensor]:
        """World position [E, 3] and orientation quaternion [E, 4] of a body."""

    @abstractmethod
    def site_jacobian(self, site: str, joints: Sequence[str]) -> torch.Tensor:
        """[E, 6, len(joints)]: rows 0-2 translational, 3-5 rotational, columns for `joints`."""

    @abstractmethod
    def in_contact(self, geoms_a: Sequence[str], geoms_b: Sequence[str]) -> torch.Tensor:
        """[E] bool: any geom of `geoms_a` touches any geom of `geoms_b`."""

    @abstractmethod
    def render(self, camera: str, width: int, height: int) -> torch.Tensor:
        """[E, H, W, 3] uint8 images from a named camera."""

    def close(self) -> None:  # noqa: B027  (optional hook)
        pass
