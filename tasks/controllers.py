"""Arm controllers: map a normalized action to joint position targets for position actuators.

`ee_delta` is differential inverse kinematics (damped least squares on the site Jacobian): the action's
first three values ask for a tool motion of up to `max_ee_step` metres from the measured pose, and the
orientation is held at a target (the episode's start orientation unless a task sets another). The target
is rebuilt from the measured pose each step, as HIL-SERL's Franka env does, so how much of it a step covers
is the actuators' business: the simulated Panda's position actuators cover about a third within one 40 ms
control step (a full action moves the tool ~0.016 m per step at max_ee_step=0.05), a stiff real position
controller more (the safety shield's velocity limits bound it there).
"""

from __future__ import annotations

import torch
from robotrl.tasks.backend import SimBackend

from robotrl.core.robot_spec import RobotSpec
from robotrl.core.rotations import quat_to_matrix, rotation_error

CONTROLS = ("ee_delta", "joint_delta", "joint_position")


class ArmController:
    def __init__(
        self,
        kind: str,
        robot: RobotSpec,
        backend: SimBackend,
        max_ee_step: float = 0.05,
        max_joint_step: float = 0.1,
        damping: float = 0.05,
        relative_frame: bool = False,
    ):
        if kind not in CONTROLS:
            raise ValueError(f"task.control must be one of {', '.join(CONTROLS)}, got {kind!r}")
        if kind == "ee_delta" and robot.end_effector_site is None:
            raise ValueError(
                f"task.control=ee_delta needs a tool point; robot {robot.name!r} has none (use joint_delta)"
            )
        self.kind, self.robot, self.backend = kind, robot, backend
        self.max_ee_step, self.max_joint_step, self.damping = max_ee_step, max_joint_step, damping
        self.relative_frame = relative_frame
        self.lower, self.upper = robot.position_lower, robot.position_upper
        n, device = backend.num_envs, backend.device
        self.target_quat = torch.tensor([[1.0, 0.0, 0.0, 0.0]], device=device).repeat(n, 1)
        self.frame = torch.eye(3, device=device).repeat(n, 1, 1)  # action frame for ee_delta
        # joint_delta integrates on the last command, not on the measured position: a held action of zero
        # holds the pose instead of letting gravity or contact sag accumulate into the targets
        self.last_target = torch.zeros(n, len(robot.joints), device=device)
        self._damping_eye = self.damping**2 * torch.eye(6, device=device)

    @property
    def action_dim(self) -> int:
        return 3 if self.kind == "ee_delta" else len(self.robot.joints)

    def reset(self, env_ids: torch.Tensor) -> None:
        """Call after a reset's forward(): start from the measured joints; for ee_delta hold the start
        orientation, and take its frame if relative."""
        self.last_target[env_ids] = self.backend.joint_pos(self.robot.joints)[env_ids]
        if self.kind != "ee_delta":
            return
        _, quat = self.backend.site_pose(self.robot.end_effector_site)
        self.target_quat[env_ids] = quat[env_ids]
        if self.relative_frame:
            self.frame[env_ids] = quat_to_matrix(quat[env_ids])

    def world_to_action(self, action: torch.Tensor) -> torch.Tensor:
        """An ee_delta action [E, A] whose first three entries are a motion in world axes, expressed in this
        controller's action frame (the tool's start frame under `relative_frame`), clipped to [-1, 1]. What
        scripted experts and teleop devices, which think in world axes, must send. On `action`'s device."""
        if self.kind != "ee_delta" or not self.relative_frame:
            return action
        frame = self.frame.to(action.device)
        motion = torch.bmm(frame.transpose(1, 2), action[:, :3].unsqueeze(-1)).squeeze(-1)
        return torch.cat([motion.clamp(-1.0, 1.0), action[:, 3:]], -1)

    def joint_targets(self, action: torch.Tensor) -> torch.Tensor:
        """Joint position targets within the position limits. Not rate-limited: in simulation the
        position actuators' own dynamics bound the speed; on hardware the safety shield must."""
        q = self.backend.joint_pos(self.robot.joints)
        if self.kind == "joint_position":
            target = self.lower + (action + 1.0) * 0.5 * (self.upper - self.lower)
        elif self.kind == "joint_delta":
            target = self.last_target + action * self.max_joint_step
        else:
            target = q + self._ik_step(action)
        if not torch.isfinite(target).all():
            raise FloatingPointError(f"{self.kind} controller produced non-finite joint targets {target.tolist()}")
        target = torch.maximum(torch.minimum(target, self.upper), self.lower)
        self.last_target = target
        return target

    def _ik_step(self, action: torch.Tensor) -> torch.Tensor:
        site = self.robot.end_effector_site
        _, quat = self.backend.site_pose(site)
        jac = self.backend.site_jacobian(site, self.robot.joints)  # [E, 6, n]
        dx = torch.bmm(self.frame, (action * self.max_ee_step).unsqueeze(-1)).squeeze(-1)
        error = torch.cat([dx, rotation_error(self.target_quat, quat)], -1)  # [E, 6]
        jjt = torch.baddbmm(self._damping_eye, jac, jac.transpose(1, 2))
        return torch.bmm(jac.transpose(1, 2), torch.linalg.solve(jjt, error.unsqueeze(-1))).squeeze(-1)
