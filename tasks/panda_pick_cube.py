"""panda_pick_cube: grasp a cube from the table and lift it to a target height.

Action: [dx, dy, dz, gripper] in [-1, 1]; gripper -1 opens fully, +1 closes. Success: the cube is at
least `lift_height` above the table and held between the fingers.
"""

from __future__ import annotations

import math

import torch
from robotrl.tasks.arm_task import REST_TOLERANCE, ArmTask
from robotrl.tasks.expert import Expert

from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.env import Obs
from robotrl.core.robot_spec import RobotSpec

CUBE_HALF = 0.02
CUBE_XY_LOW = torch.tensor([0.40, -0.15])
CUBE_XY_HIGH = torch.tensor([0.60, 0.15])
CUBE_MAX_YAW = math.radians(20)  # rad: the cube starts flat, turned about the vertical by up to this either way
LIFT_HEIGHT = 0.10
FINGER_PADS = ("left_pad", "right_pad")


class PickExpert(Expert):
    """Above the cube -> down -> close -> lift. Keeps a phase per env, and starts over when the cube is no longer
    where its phase assumes (someone else moved the arm or the cube: it also serves as the operator who corrects a
    policy mid-episode)."""

    reads = ("ee_pos", "cube_pos")

    def __init__(self, max_ee_step: float, num_envs: int, device: torch.device | str = "cpu"):
        super().__init__(max_ee_step, num_envs, device)
        self.phase = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # 0 above, 1 down, 2 close, 3 lift
        self.phase_steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        # the cube's half size per env: the task sets each episode's (randomization's body_size); a robot's nominal
        self.cube_half = torch.full((num_envs,), CUBE_HALF, device=self.device)

    def reset(self, env_ids: torch.Tensor) -> None:
        self.phase[env_ids] = 0
        self.phase_steps[env_ids] = 0

    def motion(self, state):
        cube_pos, ee = state["cube_pos"].to(self.device), state["ee_pos"].to(self.device)
        offset = cube_pos - ee
        lost = (self.phase == 1) & (offset[:, :2].norm(dim=-1) > 0.02)  # descending, but not above the cube
        lost |= (self.phase >= 2) & (offset.norm(dim=-1) > 0.03)  # closing or lifting without the cube in hand
        self.phase = torch.where(lost, torch.zeros_like(self.phase), self.phase)
        self.phase_steps = torch.where(lost, torch.zeros_like(self.phase_steps), self.phase_steps)
        phase = self.phase
        target = cube_pos.clone()
        target[phase == 0] += torch.tensor([0.0, 0.0, 0.08], device=self.device)
        lift = cube_pos.clone()
        lift[:, 2] = self.cube_half + LIFT_HEIGHT + 0.03
        target[phase == 3] = lift[phase == 3]
        grip = torch.where(phase >= 2, 1.0, -1.0)
        error = target - ee
        self.phase_steps += 1
        advance = (phase == 0) & (error.norm(dim=-1) < 0.01)
        advance |= (phase == 1) & (error.norm(dim=-1) < 0.006)
        advance |= (phase == 2) & (self.phase_steps >= 6)
        self.phase = torch.where(advance, phase + 1, phase)
        self.phase_steps = torch.where(advance, torch.zeros_like(self.phase_steps), self.phase_steps)
        return torch.cat([self.toward(target, ee), grip.unsqueeze(-1)], -1)

    def judges_success(self, state):
        """Lifting, the cube at least the lift height above the table and still in the hand."""
        cube_pos, ee = state["cube_pos"].to(self.device), state["ee_pos"].to(self.device)
        lifted = cube_pos[:, 2] - self.cube_half >= LIFT_HEIGHT
        return (self.phase == 3) & lifted & ((cube_pos - ee).norm(dim=-1) < 0.03)


class PandaPickCube(ArmTask):
    expert_class = PickExpert
    fewest_substeps = 5  # bench/substeps.py (2026-11-28): the expert and its contacts stay right
    scene = "panda_pick_cube.xml"
    has_gripper = True
    default_episode_steps = 100
    resizable_objects = ("cube",)

    def __init__(self, cfg, num_envs: int):
        super().__init__(cfg, num_envs)
        self._cube_half = torch.full((num_envs,), CUBE_HALF, device=self.device)  # per env: body_size may change it

    @classmethod
    def observation_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        return {
            **cls.proprio_entries(robot),
            "gripper": ObsEntry((1,), "joint_state", of="gripper"),
            "cube_pos": ObsEntry((3,), "object", of="cube", part="pos"),
            "cube_quat": ObsEntry((4,), "object", of="cube", part="quat"),
            "to_cube": ObsEntry((3,), "object", of="cube", part="from_ee"),
        }

    # where reset_scene puts the cube, resting on the table
    start_regions = {
        "cube": (
            torch.tensor([*CUBE_XY_LOW.tolist(), CUBE_HALF - REST_TOLERANCE]),
            torch.tensor([*CUBE_XY_HIGH.tolist(), CUBE_HALF + REST_TOLERANCE]),
        )
    }

    def reset_scene(self, env_ids: torch.Tensor) -> None:
        k = len(env_ids)
        half = CUBE_HALF * self.object_size("cube", env_ids)
        self._cube_half[env_ids] = half
        self.expert.cube_half[env_ids] = half
        xy = CUBE_XY_LOW + torch.rand(k, 2, generator=self.generator) * (CUBE_XY_HIGH - CUBE_XY_LOW)
        pos = torch.cat([xy, half.cpu().unsqueeze(-1)], -1)
        yaw = (torch.rand(k, generator=self.generator) * 2 - 1) * CUBE_MAX_YAW
        quat = torch.stack([torch.cos(yaw / 2), torch.zeros(k), torch.zeros(k), torch.sin(yaw / 2)], -1)
        self.backend.set_free_body_pose(env_ids, "cube", pos, quat)
        self.backend.set_mocap_pose(env_ids, "target", pos + torch.tensor([0.0, 0.0, LIFT_HEIGHT]))

    def finger_opening(self) -> torch.Tensor:
        return self.backend.joint_pos(self.robot.gripper.joints[:1])

    def observe(self) -> Obs:
        obs = self.proprio()
        cube_pos, cube_quat = self.backend.body_pose("cube")
        obs.update(
            gripper=self.finger_opening() / self.robot.gripper.open,
            cube_pos=cube_pos,
            cube_quat=cube_quat,
            to_cube=cube_pos - obs["ee_pos"],
        )
        return obs

    def evaluate(self):
        cube_pos, _ = self.backend.body_pose("cube")
        ee = self.ee_pos()
        grasped = self.backend.in_contact(FINGER_PADS[:1], ("cube",)) & self.backend.in_contact(
            FINGER_PADS[1:], ("cube",)
        )
        height = cube_pos[:, 2] - self._cube_half
        success = (height >= LIFT_HEIGHT) & grasped
        if self.cfg.reward == "sparse":
            reward = success.float() - 1.0
        else:  # staged: reach the cube, hold it, lift it
            reach = 1.0 - torch.tanh(10.0 * (cube_pos - ee).norm(dim=-1))
            lift = grasped.float() * (1.0 + 4.0 * (height / LIFT_HEIGHT).clamp(0.0, 1.0))
            reward = (reach + lift + 5.0 * success.float()) / 10.0
        return reward, success, torch.zeros_like(success)
