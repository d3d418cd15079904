"""hand_reorient: turn a cube lying on the palm of a four-finger hand to a goal orientation.

The hand (tasks/assets/hand4.xml, spec robotrl/core/robots/hand4.yaml) sits palm up on a fixed wrist. Action:
16 joint deltas (`task.control=joint_delta`, the default) or absolute joint positions (`joint_position`).
Goals turn the cube by 45 to 180 degrees from its start, about the vertical (`task.goal_rotation=z`) or
about a random axis (`any`). Success: within `rotation_threshold` radians of the goal. Dropping the cube
ends the episode (terminated).
"""

from __future__ import annotations

import math

import torch
from robotrl.tasks.arm_task import ArmTask

from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.env import Obs
from robotrl.core.robot_spec import RobotSpec
from robotrl.core.rotations import quat_angle, quat_conjugate, quat_from_axis_angle, quat_multiply

GOAL_ROTATIONS = ("z", "any")
FINGERTIPS = ("index_fingertip", "middle_fingertip", "ring_fingertip", "thumb_fingertip")
CUBE_HALF = 0.025
GOAL_MARKER = torch.tensor([0.4, 0.12, 0.3])


def outcome(
    cube_from_palm: torch.Tensor, cube_quat: torch.Tensor, goal_quat: torch.Tensor, cfg
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reward, success, dropped) [...] with the cube at `cube_from_palm` [..., 3] from the palm centre and turned
    `cube_quat` [..., 4], the goal `goal_quat`, under the task config `cfg` (its reward variant and thresholds)."""
    angle = quat_angle(cube_quat, goal_quat)
    dropped = cube_from_palm[..., 2] < -cfg.drop_height
    success = (angle < cfg.rotation_threshold) & ~dropped
    if cfg.reward == "sparse":
        reward = success.float() - 1.0
    else:  # as the IsaacGym Allegro task: inverse rotation distance, a success bonus, a drop penalty
        reward = 0.1 / (angle + 0.1) + success.float() - 2.0 * dropped.float()
    return reward, success, dropped


def score_from_obs(obs: Obs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) from observation entries alone (HandReorient.score_reads), as `evaluate` gives them."""
    reward, success, _ = outcome(obs["cube_pos"], obs["cube_quat"], obs["goal_quat"], cfg)
    return reward, success


class HandReorient(ArmTask):
    robot_name = "hand4"
    scene = "hand_reorient.xml"
    default_control = "joint_delta"
    default_episode_steps = 150

    def __init__(self, cfg, num_envs: int):
        if cfg.goal_rotation not in GOAL_ROTATIONS:
            choices = ", ".join(GOAL_ROTATIONS)
            raise ValueError(f"task.goal_rotation must be one of {choices}, got {cfg.goal_rotation!r}")
        if not 0.0 < cfg.rotation_threshold < math.pi:
            raise ValueError(f"task.rotation_threshold must be in (0, pi) radians, got {cfg.rotation_threshold}")
        if not cfg.drop_height > 0:
            raise ValueError(f"task.drop_height must be > 0 metres, got {cfg.drop_height}")
        super().__init__(cfg, num_envs)
        self.goal = self.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(num_envs, 1)
        self.palm_center = self.backend.site_pose("palm_center")[0][0].clone()  # the wrist is fixed

    @classmethod
    def observation_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        # a robot env gives them from the tracked cube and the hand's forward kinematics (the palm, the fingertips)
        return {
            **cls.proprio_entries(robot),
            "cube_pos": ObsEntry((3,), "object", of="cube", part="from_palm"),
            "cube_quat": ObsEntry((4,), "object", of="cube", part="quat"),
            "goal_quat": ObsEntry((4,), "goal"),
            "cube_to_goal": ObsEntry((4,), "object", of="cube", part="quat_to_goal", goal="goal_quat"),
        }

    @classmethod
    def proprio_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        n = len(robot.joints)
        return {
            "hand_qpos": ObsEntry((n,), "joint_state", of="position"),
            "hand_qvel": ObsEntry((n,), "joint_state", of="velocity"),
            "fingertips": ObsEntry((3 * len(FINGERTIPS),), "kinematics", of="fingertips"),
        }

    def proprio(self) -> Obs:
        tips = torch.cat([self.backend.site_pose(site)[0] for site in FINGERTIPS], -1)
        return {
            "hand_qpos": self.backend.joint_pos(self.robot.joints),
            "hand_qvel": self.backend.joint_vel(self.robot.joints),
            "fingertips": tips - self.palm_center.repeat(len(FINGERTIPS)),
        }

    def reset_scene(self, env_ids: torch.Tensor) -> None:
        k = len(env_ids)
        vertical = torch.tensor([0.0, 0.0, 1.0]).expand(k, 3)
        start_yaw = (torch.rand(k, generator=self.generator) * 2 - 1) * math.pi
        start = quat_from_axis_angle(vertical, start_yaw)
        xy = (torch.rand(k, 2, generator=self.generator) * 2 - 1) * 0.005
        pos = self.palm_center + torch.cat([xy, torch.full((k, 1), CUBE_HALF + 0.002)], -1).to(self.device)
        self.backend.set_free_body_pose(env_ids, "cube", pos, start.to(self.device))
        axis = vertical if self.cfg.goal_rotation == "z" else torch.randn(k, 3, generator=self.generator)
        turn = math.pi / 4 + torch.rand(k, generator=self.generator) * (3 * math.pi / 4)
        sign = torch.where(torch.rand(k, generator=self.generator) < 0.5, -1.0, 1.0)
        self.goal[env_ids] = quat_multiply(quat_from_axis_angle(axis, sign * turn), start).to(self.device)
        self.backend.set_mocap_pose(env_ids, "goal", self.tensor(GOAL_MARKER).expand(k, 3), self.goal[env_ids])

    def observe(self) -> Obs:
        obs = self.proprio()
        pos, quat = self.backend.body_pose("cube")
        obs.update(
            cube_pos=pos - self.palm_center,
            cube_quat=quat,
            goal_quat=self.goal.clone(),
            cube_to_goal=quat_multiply(self.goal, quat_conjugate(quat)),
        )
        return obs

    def evaluate(self):
        pos, quat = self.backend.body_pose("cube")
        reward, success, dropped = outcome(pos - self.palm_center, quat, self.goal, self.cfg)
        return reward, success, dropped

    score_reads = ("cube_pos", "cube_quat", "goal_quat")

    def score(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        return score_from_obs(obs, self.cfg)
