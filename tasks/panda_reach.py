"""panda_reach: move the gripper's tool point to a random target within `success_threshold`."""

from __future__ import annotations

import torch
from robotrl.tasks.arm_task import ArmTask
from robotrl.tasks.expert import Expert

from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.env import Obs
from robotrl.core.robot_spec import RobotSpec
from robotrl.data.hindsight import GoalSpec

TARGET_LOW = torch.tensor([0.30, -0.25, 0.10])
TARGET_HIGH = torch.tensor([0.60, 0.25, 0.45])


def outcome(ee: torch.Tensor, target: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) [...] with the tool point at `ee` [..., 3] and the target at `target` [..., 3], under the
    task config `cfg` (its reward variant and success threshold)."""
    distance = (ee - target).norm(dim=-1)
    success = distance < cfg.success_threshold
    return (-distance if cfg.reward == "dense" else success.float() - 1.0), success


def score_from_obs(obs: Obs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) from observation entries alone (PandaReach.score_reads), as `evaluate` gives them."""
    return outcome(obs["ee_pos"], obs["target"], cfg)


def draw_episode_goals(
    count: int, objects: dict[str, torch.Tensor], generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """A target per episode drawn uniformly from the box in front of the arm."""
    u = torch.rand(count, 3, generator=generator)
    return {"target": TARGET_LOW + u * (TARGET_HIGH - TARGET_LOW)}


class ReachExpert(Expert):
    """Head straight for the target at up to full speed."""

    reads = ("ee_pos", "target")

    def motion(self, state):
        return self.toward(state["target"], state["ee_pos"])


class PandaReach(ArmTask):
    expert_class = ReachExpert
    fewest_substeps = 2  # bench/substeps.py (2026-11-28): the expert and its contacts stay right
    scene = "panda_reach.xml"

    def __init__(self, cfg, num_envs: int):
        super().__init__(cfg, num_envs)
        self.target = torch.zeros(num_envs, 3, device=self.device)

    @classmethod
    def observation_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        return {
            **cls.proprio_entries(robot),
            "target": ObsEntry((3,), "goal"),
            "to_target": ObsEntry((3,), "goal_minus_tool", goal="target"),
        }

    drawn_goals = ("target",)

    def reset_scene(self, env_ids: torch.Tensor) -> None:
        target = self.draw_goals(len(env_ids), {}, self.generator)["target"].to(self.device)
        self.target[env_ids] = target
        self.backend.set_mocap_pose(env_ids, "target", target)

    def draw_goals(
        self, count: int, objects: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """A target drawn uniformly from the box in front of the arm."""
        return draw_episode_goals(count, objects, generator)

    def observe(self) -> Obs:
        obs = self.proprio()
        obs.update(target=self.target.clone(), to_target=self.target - obs["ee_pos"])
        return obs

    def evaluate(self):
        reward, success = self.outcome(self.ee_pos(), self.target)
        return reward, success, torch.zeros_like(success)

    score_reads = ("ee_pos", "target")

    def score(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        return score_from_obs(obs, self.cfg)

    def outcome(self, ee: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward, success) [...] with the tool point at `ee` [..., 3] and the target at `target` [..., 3]:
        the live state's, or a stored one's under another target (goal_spec)."""
        return outcome(ee, target, self.cfg)

    def goal_spec(self) -> GoalSpec:
        """The goal is the target the tool point should reach (hindsight relabelling, data/hindsight.py)."""
        return GoalSpec(
            achieved=lambda obs: obs["ee_pos"],
            with_goal=lambda obs, goal: {**obs, "target": goal, "to_target": goal - obs["ee_pos"]},
            success=lambda obs, goal: self.outcome(obs["ee_pos"], goal)[1],
            reward=lambda obs, goal: self.outcome(obs["ee_pos"], goal)[0],
        )
