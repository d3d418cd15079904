"""The pose shield (robotrl/safety/pose_shield.py): equilibrium poses for an impedance controller are valid, lead the
measured tool pose by a bounded distance, move by bounded steps and stay in the workspace, whatever is asked."""

from __future__ import annotations

import math

import pytest
import torch

from robotrl.core.rotations import quat_angle, quat_from_axis_angle, quat_multiply
from robotrl.safety import PoseLimits, PoseShield, ShieldConfig, ShieldConfigError

LIMITS = PoseLimits(
    workspace_min=(0.3, -0.3, 0.05),
    workspace_max=(0.7, 0.3, 0.6),
    max_step=0.02,
    max_step_angle=0.1,
    max_lead=0.03,
    max_lead_angle=0.3,
)
HOME = torch.tensor([0.5, 0.0, 0.4], dtype=torch.float64)
DOWN = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # the tool pointing down


def shield() -> PoseShield:
    pose = PoseShield(LIMITS)
    pose.reset(HOME, DOWN)
    return pose


def turned(quat: torch.Tensor, axis, angle: float) -> torch.Tensor:
    rotation = quat_from_axis_angle(torch.tensor(axis, dtype=torch.float64), torch.tensor(angle, dtype=torch.float64))
    return quat_multiply(rotation, quat)


def test_invalid_poses_are_never_sent_and_counted():
    pose = shield()
    nan = torch.tensor([math.nan, 0.0, 0.4])
    safe, info = pose.filter(nan, DOWN, HOME, DOWN)
    assert safe is None and info["pose/nan"] == 1
    safe, info = pose.filter(HOME, torch.tensor([0.0, 1.0, 0.0, math.inf]), HOME, DOWN)
    assert safe is None and info["pose/nan"] == 1
    safe, info = pose.filter(HOME, DOWN * 1.1, HOME, DOWN)  # not a rotation: |q| = 1.1
    assert safe is None and info["pose/orientation"] == 1
    safe, info = pose.filter(HOME, DOWN * (1 + 1e-5), HOME, DOWN)  # round-off: normalised
    assert safe is not None and float(safe.quat.norm()) == pytest.approx(1.0, abs=1e-12)
    assert pose.totals["nan"] == 2 and pose.totals["orientation"] == 1
    with pytest.raises(ValueError, match=r"position \[3\] and a quaternion \[4\]"):
        pose.filter(HOME[:2], DOWN, HOME, DOWN)


def test_the_equilibrium_leads_the_tool_by_at_most_max_lead_and_steps_at_most_max_step():
    pose = shield()
    far = HOME + torch.tensor([0.2, 0.0, 0.0], dtype=torch.float64)
    safe, info = pose.filter(far, DOWN, HOME, DOWN)
    # the step bound (2 cm) is tighter than the lead (3 cm) here
    assert info["pose/step"] == 1 and float((safe.position - HOME).norm()) == pytest.approx(0.02)
    # the tool stuck in contact 1 cm behind the last equilibrium: the next may lead it by 3 cm, not more
    stuck = safe.position - torch.tensor([0.01, 0.0, 0.0], dtype=torch.float64)
    safe, info = pose.filter(far, DOWN, stuck, DOWN)
    assert info["pose/lead"] == 1 and float((safe.position - stuck).norm()) == pytest.approx(0.03)
    safe, info = pose.filter(far, DOWN, stuck, DOWN)  # and stays there while the tool does not move
    assert float((safe.position - stuck).norm()) == pytest.approx(0.03)


def test_rotations_are_limited_per_step_and_in_lead():
    pose = shield()
    half_turn = turned(DOWN, [0.0, 0.0, 1.0], 1.5)
    safe, info = pose.filter(HOME, half_turn, HOME, DOWN)
    assert info["pose/step_angle"] == 1 and info["pose/lead_angle"] == 1
    assert float(quat_angle(safe.quat, DOWN)) == pytest.approx(0.1, abs=1e-9)
    # the turn is toward the command: the next steps keep turning the same way
    for _ in range(2):
        previous = safe.quat
        safe, _ = pose.filter(HOME, half_turn, HOME, previous)
        assert float(quat_angle(safe.quat, previous)) == pytest.approx(0.1, abs=1e-9)
    assert float(quat_angle(safe.quat, half_turn)) == pytest.approx(1.5 - 0.3, abs=1e-6)


def test_random_commands_never_leave_the_box_nor_exceed_a_bound():
    """Fuzz: 3,000 commands anywhere (some far outside the box, some invalid), the measured tool following the
    equilibrium with lag and noise: every pose sent is in the box, a unit quaternion, within the step bounds of the
    last one sent and within the lead bounds of the measured pose."""
    generator = torch.Generator().manual_seed(0)
    pose = shield()
    tool, tool_quat = HOME.clone(), DOWN.clone()
    last = (HOME.clone(), DOWN.clone())
    low, high = torch.tensor(LIMITS.workspace_min).double(), torch.tensor(LIMITS.workspace_max).double()
    sent = 0
    for i in range(3000):
        position = HOME + (torch.rand(3, generator=generator, dtype=torch.float64) - 0.5) * 2.0
        axis = torch.randn(3, generator=generator, dtype=torch.float64)
        angle = float(torch.rand(1, generator=generator)) * math.pi
        quat = turned(DOWN, axis.tolist(), angle)
        if i % 97 == 0:
            position[1] = math.nan
        safe, _ = pose.filter(position, quat, tool, tool_quat)
        if safe is None:
            assert i % 97 == 0
            continue
        sent += 1
        assert bool(((safe.position >= low) & (safe.position <= high)).all())
        assert float(safe.quat.norm()) == pytest.approx(1.0, abs=1e-9)
        assert float((safe.position - last[0]).norm()) <= LIMITS.max_step + 1e-12
        assert float(quat_angle(safe.quat, last[1])) <= LIMITS.max_step_angle + 1e-6
        assert float(quat_angle(safe.quat, tool_quat)) <= LIMITS.max_lead_angle + LIMITS.max_step_angle + 1e-6
        last = (safe.position, safe.quat)
        # the tool follows halfway, with a millimetre of noise (it stays near the box: lead is checked from it)
        tool = tool + 0.5 * (safe.position - tool) + 1e-3 * torch.randn(3, generator=generator, dtype=torch.float64)
        tool_quat = safe.quat.clone()
    assert sent == 3000 - len(range(0, 3000, 97))


def test_bad_limits_are_refused_by_name():
    with pytest.raises(ValueError, match="max_lead must be a finite number > 0, got 0"):
        PoseShield(PoseLimits((0, 0, 0), (1, 1, 1), 0.01, 0.1, 0.0, 0.3))
    with pytest.raises(ValueError, match=r"min \[0, 0, 1\] must be below its max"):
        PoseShield(PoseLimits((0, 0, 1), (1, 1, 1), 0.01, 0.1, 0.03, 0.3))
    with pytest.raises(ShieldConfigError, match=r"shield\.pose_max_speed must be > 0, got -1"):
        ShieldConfig(pose_max_speed=-1).validate()
    with pytest.raises(RuntimeError, match="reset"):
        PoseShield(LIMITS).filter(HOME, DOWN, HOME, DOWN)
