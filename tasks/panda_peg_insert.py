"""panda_peg_insert: put a square peg held in the hand into a square hole with 1 mm clearance per side.

Contact-rich and precise, as in HIL-SERL's insertion tasks. The peg is held firmly (welded to the hand)
and the tool keeps pointing straight down (the controller holds a fixed world orientation), so the action
is [dx, dy, dz] in [-1, 1]. Success: the peg tip is at least `INSERT_DEPTH` below the hole's rim.
"""

from __future__ import annotations

import torch
from robotrl.tasks.arm_task import ArmTask
from robotrl.tasks.expert import Expert

from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.env import Obs
from robotrl.core.robot_spec import RobotSpec
from robotrl.core.rotations import quat_to_matrix

HOLE_XY_LOW = torch.tensor([0.42, -0.15])
HOLE_XY_HIGH = torch.tensor([0.60, 0.15])
HOLE_DEPTH = 0.04  # rim height above the table
HOLE_HALF_WIDTH = 0.013  # the peg's half width is 0.012
INSERT_DEPTH = 0.025
PEG_IN_HAND = torch.tensor([0.0, 0.0, 0.1234])  # the weld's offset (panda_peg_insert.xml)
TOOL_DOWN = torch.tensor([0.0, 1.0, 0.0, 0.0])  # hand axes on the world's: tool axis straight down


def outcome(tip: torch.Tensor, hole: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) [...] with the peg's tip at `tip` [..., 3] and the hole's rim centre at `hole`, under the
    task config `cfg` (its reward variant)."""
    lateral = (tip[..., :2] - hole[..., :2]).norm(dim=-1)
    depth = hole[..., 2] - tip[..., 2]
    success = (depth >= INSERT_DEPTH) & (lateral < HOLE_HALF_WIDTH)
    if cfg.reward == "sparse":
        return success.float() - 1.0, success
    # line up over the hole, then go down it
    approach = 1.0 - torch.tanh(10.0 * (hole - tip).norm(dim=-1))
    aligned = lateral < HOLE_HALF_WIDTH
    inserted = aligned.float() * (depth / INSERT_DEPTH).clamp(0.0, 1.0)
    return (approach + 2.0 * inserted + 2.0 * success.float()) / 5.0, success


def score_from_obs(obs: Obs, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward, success) from observation entries alone (PandaPegInsert.score_reads), as `evaluate` gives them."""
    return outcome(obs["peg_tip"], obs["hole"], cfg)


class PegExpert(Expert):
    """Line the tip up 3 cm above the hole -> descend slowly, re-aligning on drift."""

    reads = ("peg_tip", "hole")

    def __init__(self, max_ee_step: float, num_envs: int, device: torch.device | str = "cpu"):
        super().__init__(max_ee_step, num_envs, device)
        self.phase = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # 0 above the hole, 1 down

    def reset(self, env_ids: torch.Tensor) -> None:
        self.phase[env_ids] = 0

    def motion(self, state):
        tip, hole = state["peg_tip"].to(self.device), state["hole"].to(self.device)
        above = hole + torch.tensor([0.0, 0.0, 0.03], device=self.device)
        bottom = hole - torch.tensor([0.0, 0.0, HOLE_DEPTH - 0.005], device=self.device)
        lateral = (tip[:, :2] - hole[:, :2]).norm(dim=-1)
        phase = self.phase
        # back to phase 0 if the tip drifts while still above the rim
        drifted = (phase == 1) & (lateral > 0.004) & (tip[:, 2] > hole[:, 2])
        phase = torch.where(drifted, torch.zeros_like(phase), phase)
        arrived = (phase == 0) & ((above - tip).norm(dim=-1) < 0.003)
        self.phase = phase = torch.where(arrived, torch.ones_like(phase), phase)
        target = torch.where((phase == 0).unsqueeze(-1), above, bottom)
        speed = torch.where(phase == 0, 1.0, 0.3).unsqueeze(-1)  # slow once the peg nears the hole
        return self.toward(target, tip) * speed


class PandaPegInsert(ArmTask):
    expert_class = PegExpert
    fewest_substeps = 4  # bench/substeps.py (2026-11-28): the expert and its contacts stay right
    scene = "panda_peg_insert.xml"
    default_episode_steps = 100
    tool_orientation = TOOL_DOWN
    held_sites = ("peg_tip",)

    def __init__(self, cfg, num_envs: int):
        super().__init__(cfg, num_envs)
        self.hole = torch.zeros(num_envs, 3, device=self.device)  # centre of the hole's rim

    @classmethod
    def observation_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        return {
            **cls.proprio_entries(robot),
            "peg_tip": ObsEntry((3,), "held_point", of="peg_tip"),
            "hole": ObsEntry((3,), "goal"),
            "tip_to_hole": ObsEntry((3,), "goal_minus_held", of="peg_tip", goal="hole"),
        }

    def reset_scene(self, env_ids: torch.Tensor) -> None:
        k = len(env_ids)
        xy = HOLE_XY_LOW + torch.rand(k, 2, generator=self.generator) * (HOLE_XY_HIGH - HOLE_XY_LOW)
        self.hole[env_ids] = torch.cat([xy, torch.full((k, 1), HOLE_DEPTH)], -1).to(self.device)
        self.backend.set_mocap_pose(env_ids, "hole", torch.cat([xy, torch.zeros(k, 1)], -1))
        # put the peg where the weld holds it, so the first physics step does not yank it into place
        self.backend.forward(env_ids)
        hand_pos, hand_quat = (x[env_ids] for x in self.backend.body_pose("hand"))
        peg_pos = hand_pos + torch.einsum("kij,j->ki", quat_to_matrix(hand_quat), self.tensor(PEG_IN_HAND))
        self.backend.set_free_body_pose(env_ids, "peg", peg_pos, hand_quat)

    def peg_tip(self) -> torch.Tensor:
        return self.backend.site_pose("peg_tip")[0]

    def observe(self) -> Obs:
        obs = self.proprio()
        tip = self.peg_tip()
        obs.update(peg_tip=tip, hole=self.hole.clone(), tip_to_hole=self.hole - tip)
        return obs

    def evaluate(self):
        reward, success = self.outcome(self.peg_tip(), self.hole)
        return reward, success, torch.zeros_like(success)

    score_reads = ("peg_tip", "hole")

    def score(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        return score_from_obs(obs, self.cfg)

    def outcome(self, tip: torch.Tensor, hole: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward, success) [...] with the peg's tip at `tip` [..., 3] and the hole's rim centre at `hole`."""
        return outcome(tip, hole, self.cfg)
