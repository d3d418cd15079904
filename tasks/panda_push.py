"""panda_push: push a puck across the table until it rests on a goal, fingers closed.

Action: [dx, dy, dz] in [-1, 1] (no gripper command: the fingers stay shut). Success: the puck's centre
is within `success_threshold` of the goal in the table plane.
"""

from __future__ import annotations

import math

import torch
from robotrl.tasks.arm_task import REST_TOLERANCE, ArmTask
from robotrl.tasks.expert import Expert

from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.env import Obs
from robotrl.core.robot_spec import RobotSpec
from robotrl.data.hindsight import GoalSpec

PUCK_HALF_HEIGHT = 0.02
PUCK_RADIUS = 0.025
PUCK_XY_LOW = torch.tensor([0.40, -0.15])
PUCK_XY_HIGH = torch.tensor([0.55, 0.15])
GOAL_XY_LOW = torch.tensor([0.35, -0.25])
GOAL_XY_HIGH = torch.tensor([0.65, 0.25])
GOAL_DISTANCE = (0.10, 0.20)  # metres from the puck's start
PUSH_HEIGHT = 0.025  # tool point height while pushing: the finger tips just above the table
STANDOFF = PUCK_RADIUS + 0.02  # tool point behind the puck's centre when a push starts


def outcome(puck: torch.Tensor, ee: torch.Tensor, goal: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) [...] with the puck at `puck` [..., 3], the tool point at `ee` [..., 3] and the goal at
    `goal` [..., 2], under the task config `cfg` (its reward variant and success threshold)."""
    distance = (goal - puck[..., :2]).norm(dim=-1)
    success = distance < cfg.success_threshold
    if cfg.reward == "sparse":
        return success.float() - 1.0, success
    reach = 1.0 - torch.tanh(10.0 * (puck - ee).norm(dim=-1))  # get behind the puck, then bring it to the goal
    push = 1.0 - torch.tanh(5.0 * distance)
    return (0.2 * reach + push + success.float()) / 2.2, success


def score_from_obs(obs: Obs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) from observation entries alone (PandaPush.score_reads), as `evaluate` gives them."""
    return outcome(obs["puck_pos"], obs["ee_pos"], obs["goal"], cfg)


def draw_episode_goals(
    count: int, objects: dict[str, torch.Tensor], generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """A goal 10-20 cm from the puck (`objects["puck"]`, [count, 3]) in a random direction, inside the goal box;
    one the box's edge would pull in is mirrored across the puck, so no episode starts (nearly) solved."""
    xy = objects["puck"][:, :2]
    angle = torch.rand(count, generator=generator) * 2 * math.pi
    lo, hi = GOAL_DISTANCE
    distance = lo + torch.rand(count, generator=generator) * (hi - lo)
    offset = distance.unsqueeze(-1) * torch.stack([torch.cos(angle), torch.sin(angle)], -1)
    there, mirrored = (_in_workspace(xy + offset), _in_workspace(xy - offset))
    farther = (there - xy).norm(dim=-1, keepdim=True) >= (mirrored - xy).norm(dim=-1, keepdim=True)
    return {"goal": torch.where(farther, there, mirrored)}


def _in_workspace(xy: torch.Tensor) -> torch.Tensor:
    return torch.maximum(torch.minimum(xy, GOAL_XY_HIGH), GOAL_XY_LOW)


class PushExpert(Expert):
    """Go behind the puck on the goal line, lower, push along the line.

    A function of the state alone (no phase kept between steps), so behaviour cloning sees one action
    per state: an expert that remembers whether it is lowering or climbing back up shows both, up and
    down, in the same place behind the puck, and a policy fit to both stalls there.
    - on the line behind the puck at push height: push towards the goal;
    - behind the puck, clear of it (or already at push height, where the puck is in front): move to
      the push start at push height, lowering and aligning at once;
    - elsewhere: hover above the push start, climbing first where the puck is close below.
    """

    reads = ("ee_pos", "puck_pos", "goal")

    def motion(self, state):
        puck = state["puck_pos"]
        ee = state["ee_pos"]
        to_goal = state["goal"] - puck[:, :2]
        distance = to_goal.norm(dim=-1, keepdim=True)
        direction = to_goal / distance.clamp_min(1e-6)
        behind = puck[:, :2] - STANDOFF * direction
        offset = ee[:, :2] - puck[:, :2]
        along = (offset * direction).sum(-1)
        across = (offset - along.unsqueeze(-1) * direction).norm(dim=-1)
        low = ee[:, 2] < PUSH_HEIGHT + 0.012
        pushing = low & (across < 0.012) & (along < -PUCK_RADIUS + 0.005)
        aligning = (across < 0.03) & ((along < -PUCK_RADIUS - 0.015) | (low & (along < -PUCK_RADIUS + 0.005)))
        climbing = (ee[:, 2] < 0.06) & (offset.norm(dim=-1) < 0.06)  # near the puck and not behind it: up first
        push_height = torch.full_like(distance, PUSH_HEIGHT)
        push = torch.cat([behind + direction * distance.clamp(max=0.04), push_height], -1)
        start = torch.cat([behind, push_height], -1)
        hover = torch.cat([behind, torch.full_like(distance, 0.08)], -1)
        climb = torch.cat([ee[:, :2], torch.full_like(distance, 0.08)], -1)
        target = torch.where(
            pushing.unsqueeze(-1),
            push,
            torch.where(aligning.unsqueeze(-1), start, torch.where(climbing.unsqueeze(-1), climb, hover)),
        )
        return self.toward(target, ee)


class PandaPush(ArmTask):
    expert_class = PushExpert
    fewest_substeps = 5  # bench/substeps.py (2026-11-28): the expert and its contacts stay right
    scene = "panda_push.xml"
    default_episode_steps = 100
    resizable_objects = ("puck",)

    def __init__(self, cfg, num_envs: int):
        super().__init__(cfg, num_envs)
        self.goal = torch.zeros(num_envs, 2, device=self.device)

    @classmethod
    def observation_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        return {
            **cls.proprio_entries(robot),
            "puck_pos": ObsEntry((3,), "object", of="puck", part="pos"),
            "to_puck": ObsEntry((3,), "object", of="puck", part="from_ee"),
            "goal": ObsEntry((2,), "goal"),
            "puck_to_goal": ObsEntry((2,), "object", of="puck", part="to_goal", goal="goal"),
        }

    # where reset_scene puts the puck, resting on the table (a puck held above it is not back)
    start_regions = {
        "puck": (
            torch.tensor([*PUCK_XY_LOW.tolist(), PUCK_HALF_HEIGHT - REST_TOLERANCE]),
            torch.tensor([*PUCK_XY_HIGH.tolist(), PUCK_HALF_HEIGHT + REST_TOLERANCE]),
        )
    }
    drawn_goals = ("goal",)

    def reset_scene(self, env_ids: torch.Tensor) -> None:
        k = len(env_ids)
        xy = PUCK_XY_LOW + torch.rand(k, 2, generator=self.generator) * (PUCK_XY_HIGH - PUCK_XY_LOW)
        half = PUCK_HALF_HEIGHT * self.object_size("puck", env_ids).cpu()
        puck = torch.cat([xy, half.unsqueeze(-1)], -1)
        goal = self.draw_goals(k, {"puck": puck}, self.generator)["goal"]
        upright = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(k, 4)
        self.backend.set_free_body_pose(env_ids, "puck", puck, upright)
        self.backend.set_mocap_pose(env_ids, "goal", torch.cat([goal, torch.full((k, 1), 0.001)], -1))
        self.goal[env_ids] = goal.to(self.device)

    def draw_goals(
        self, count: int, objects: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """A goal 10-20 cm from the puck in a random direction, inside the goal box; one the box's edge would
        pull in is mirrored across the puck, so no episode starts (nearly) solved."""
        return draw_episode_goals(count, objects, generator)

    def puck_pos(self) -> torch.Tensor:
        return self.backend.body_pose("puck")[0]

    def observe(self) -> Obs:
        obs = self.proprio()
        puck = self.puck_pos()
        obs.update(
            puck_pos=puck,
            to_puck=puck - obs["ee_pos"],
            goal=self.goal.clone(),
            puck_to_goal=self.goal - puck[:, :2],
        )
        return obs

    def evaluate(self):
        reward, success = self.outcome(self.puck_pos(), self.ee_pos(), self.goal)
        return reward, success, torch.zeros_like(success)

    score_reads = ("puck_pos", "ee_pos", "goal")

    def score(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        return score_from_obs(obs, self.cfg)

    def outcome(self, puck: torch.Tensor, ee: torch.Tensor, goal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward, success) [...] with the puck at `puck` [..., 3], the tool point at `ee` [..., 3] and the
        goal at `goal` [..., 2]: the live state's, or a stored one's under another goal (goal_spec)."""
        return outcome(puck, ee, goal, self.cfg)

    def goal_spec(self) -> GoalSpec:
        """The goal is where the puck should be in the plane (hindsight relabelling, data/hindsight.py)."""
        return GoalSpec(
            achieved=lambda obs: obs["puck_pos"][..., :2],
            with_goal=lambda obs, goal: {**obs, "goal": goal, "puck_to_goal": goal - obs["puck_pos"][..., :2]},
            success=lambda obs, goal: self.outcome(obs["puck_pos"], obs["ee_pos"], goal)[1],
            reward=lambda obs, goal: self.outcome(obs["puck_pos"], obs["ee_pos"], goal)[0],
        )
