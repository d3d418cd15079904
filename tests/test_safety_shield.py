"""The safety shield (robotrl/safety/): kinematics against MuJoCo, every correction kind, hostile command
sequences, motion limits by finite differences, watchdog and e-stop timing, config errors."""

from __future__ import annotations

import logging
import math
import sys

import mujoco
import numpy as np
import pytest
import torch
import yaml
from robotrl.tasks.arm_task import ASSETS

from robotrl.core.robot_spec import ROBOTS_DIR, load_robot_spec, read_robot_spec
from robotrl.safety import (
    CORRECTION_KINDS,
    KinematicChain,
    MJCFError,
    Shield,
    ShieldConfig,
    ShieldConfigError,
    ShieldResetError,
)

PANDA_XML = ASSETS / "panda.xml"
BOX_MIN, BOX_MAX = (0.15, -0.55, 0.10), (0.80, 0.55, 0.95)
DT = 0.001

SPEC = load_robot_spec("panda")
LOWER, UPPER = SPEC.position_lower.double(), SPEC.position_upper.double()
HOME = SPEC.home.double()


def make_shield(**overrides) -> Shield:
    settings = {"control_period": DT, "workspace_min": BOX_MIN, "workspace_max": BOX_MAX, **overrides}
    shield = Shield.from_spec(SPEC, ShieldConfig(**settings), PANDA_XML)
    shield.reset(HOME, 0.0, 0.0, gripper_position=0.02)
    return shield


def drive(shield: Shield, commands, start: float = 0.0, stamp_lag: float = 0.0):
    """Feed one command (or None) per control period with a fresh state; return the setpoints [T, n]."""
    targets, position = [], shield._output.clone()
    for i, command in enumerate(commands):
        now = start + (i + 1) * DT
        out = shield.filter(command, position, now - stamp_lag, now)
        position = out.target
        targets.append(out.target)
    return torch.stack(targets)


# ---------------------------------------------------------------- kinematics


@pytest.mark.parametrize("xml", ["panda.xml", "panda_reach.xml"])  # the second reaches the arm by <include>
def test_forward_kinematics_matches_mujoco(xml):
    chain = KinematicChain.from_mjcf(ASSETS / xml, SPEC.end_effector_site, SPEC.joints)
    model = mujoco.MjModel.from_xml_path(str(ASSETS / xml))
    data = mujoco.MjData(model)
    site = model.site(SPEC.end_effector_site).id
    qpos_index = [model.jnt_qposadr[model.joint(name).id] for name in SPEC.joints]
    q = LOWER + torch.rand(300, 7, dtype=torch.float64) * (UPPER - LOWER)
    position, rotation = chain.forward(q)
    for i in range(len(q)):
        data.qpos[qpos_index] = q[i].numpy()
        mujoco.mj_kinematics(model, data)
        np.testing.assert_allclose(position[i].numpy(), data.site_xpos[site], atol=1e-5, rtol=0)
        np.testing.assert_allclose(rotation[i].numpy(), data.site_xmat[site].reshape(3, 3), atol=1e-6, rtol=0)


SYNTHETIC = """
<mujoco>
  <compiler angle="degree" eulerseq="zyx"/>
  <default>
    <default class="arm"><joint axis="0 1 0" pos="0 0 0.05"/><site pos="0.01 0 0"/></default>
  </default>
  <worldbody>
    <body name="a" pos="0.1 0.2 0.3" euler="10 20 30" childclass="arm">
      <joint name="j1" ref="15"/><geom size="0.01"/>
      <body name="b" pos="0 0 0.4" axisangle="1 1 0 40">
        <joint name="j2" type="slide" axis="1 0 1"/><geom size="0.01"/>
        <frame pos="0.05 0 0" quat="0.9 0.1 0.2 0.3">
          <body name="c" xyaxes="0 1 0 -1 0.2 0">
            <joint name="j3" axis="1 0 0" pos="0.02 0.03 0"/>
            <joint name="j4" class="arm"/><geom size="0.01"/>
            <body name="d" zaxis="0.3 -0.4 1"><geom size="0.01"/><site name="tip" euler="5 0 0"/></body>
          </body>
        </frame>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def test_forward_kinematics_reads_the_mjcf_conventions(tmp_path):
    """Degrees, euler sequences, axisangle, xyaxes, zaxis, frames, default classes, anchors, ref, slides."""
    path = tmp_path / "chain.xml"
    path.write_text(SYNTHETIC)
    joints = ("j1", "j2", "j3", "j4")
    chain = KinematicChain.from_mjcf(path, "tip", joints)
    model = mujoco.MjModel.from_xml_path(str(path))
    data = mujoco.MjData(model)
    q = torch.rand(50, 4, dtype=torch.float64) * 4 - 2
    position, rotation = chain.forward(q)
    for i in range(len(q)):
        data.qpos[:] = q[i].numpy()
        mujoco.mj_kinematics(model, data)
        np.testing.assert_allclose(position[i].numpy(), data.site_xpos[0], atol=1e-6, rtol=0)
        np.testing.assert_allclose(rotation[i].numpy(), data.site_xmat[0].reshape(3, 3), atol=1e-6, rtol=0)


def test_kinematic_chain_errors_name_the_problem(tmp_path):
    with pytest.raises(MJCFError, match="no_such_site"):
        KinematicChain.from_mjcf(PANDA_XML, "no_such_site", SPEC.joints)
    with pytest.raises(MJCFError, match="joint7"):
        KinematicChain.from_mjcf(PANDA_XML, SPEC.end_effector_site, SPEC.joints[:6])
    with pytest.raises(MJCFError, match="does not exist"):
        KinematicChain.from_mjcf(tmp_path / "missing.xml", "tip", ("j1",))


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"control_period": 0.0}, "control_period"),
        ({"velocity_scale": 1.5}, "velocity_scale"),
        ({"jerk_scale": float("nan")}, "jerk_scale"),
        ({"position_margin": -0.1}, "position_margin"),
        ({"position_margin": [0.1, 0.1]}, "position_margin"),
        ({"position_margin": 1.6}, "joint4"),  # joint4's range is 3.0 rad: 1.6 rad each side leaves nothing
        ({"max_step": 0.0}, "max_step"),
        ({"shape_motion": False, "max_step": 0.01}, "max_step.*joint1.*velocity bound"),  # 10 rad/s at 1 kHz
        ({"tracking_error": 0.0}, "tracking_error"),
        ({"tracking_error": [0.1] * 3}, "tracking_error"),
        ({"workspace_min": (0.0, 0.0)}, "workspace_min"),
        ({"workspace_min": (0.5, -0.5, 0.1), "workspace_max": (0.4, 0.5, 0.9)}, "workspace_max.x"),
        ({"workspace_margin": 0.5}, "workspace_margin"),
        ({"workspace_max": None}, "workspace_max"),
        ({"hold_after": 1.0, "stop_after": 0.5}, "stop_after"),
        ({"command_timeout": -1.0}, "command_timeout"),
        ({"watchdog": "yes"}, "watchdog"),
    ],
)
def test_config_errors_name_the_bad_value(overrides, named):
    with pytest.raises(ShieldConfigError, match=named):
        make_shield(**overrides)


@pytest.mark.parametrize(
    ("key", "index", "value", "named"),
    [
        # a negative velocity limit made the per-step guard push every joint to its upper limit
        ("velocity_limit", 0, -2.175, "velocity_limit must be > 0.*joint1"),
        ("acceleration_limit", 2, 0.0, "acceleration_limit must be > 0.*joint3"),
        ("jerk_limit", 6, ".nan", "jerk_limit must be finite"),
        ("position_upper", 3, ".inf", "position_upper must be finite"),
    ],
)
def test_robot_spec_refuses_limits_that_are_not_positive_and_finite(tmp_path, key, index, value, named):
    raw = yaml.safe_load((ROBOTS_DIR / "panda.yaml").read_text())
    raw[key][index] = value
    path = tmp_path / "panda.yaml"
    path.write_text(yaml.safe_dump(raw).replace(f"'{value}'", str(value)))
    with pytest.raises(ValueError, match=named):
        read_robot_spec(path)


def test_workspace_needs_the_model_file():
    with pytest.raises(ShieldConfigError, match="model_file"):
        Shield.from_spec(SPEC, ShieldConfig(workspace_min=BOX_MIN, workspace_max=BOX_MAX))


def test_missing_ruckig_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ruckig", None)
    with pytest.raises(ImportError, match=r"robotrl\[safety\]"):
        Shield.from_spec(SPEC, ShieldConfig())
    Shield.from_spec(SPEC, ShieldConfig(shape_motion=False))  # the per-step clip needs no ruckig


def test_filter_before_reset_is_refused():
    shield = Shield.from_spec(SPEC, ShieldConfig())
    with pytest.raises(RuntimeError, match="reset"):
        shield.filter(HOME, HOME, 0.0, 0.0)


# ---------------------------------------------------------------- each correction kind


def test_every_correction_kind_is_counted_and_reported():
    shield = make_shield(command_timeout=0.05, hold_after=0.01, stop_after=0.03, tracking_error=0.15)
    fired = {}
    clock = [0.0]

    def step(command=None, stamp=None, gripper=None, measured=None, wait=0.0):
        clock[0] += DT + wait
        measured = shield._output if measured is None else measured
        out = shield.filter(command, measured, clock[0] if stamp is None else stamp, clock[0], gripper=gripper)
        for kind in CORRECTION_KINDS:
            if out.info[f"safety/{kind}"]:
                fired[kind] = fired.get(kind, 0) + 1
        return out

    def settle(stamp):  # let a hold's brake finish (reset() refuses a moving setpoint)
        while not shield.at_rest:
            step(stamp=stamp)

    nan_command = HOME.clone()
    nan_command[2] = float("nan")
    out = step(nan_command)
    assert out.info["safety/nan"] == 1 and torch.equal(out.target, HOME)  # held: no motion at all
    beyond = HOME.clone()
    beyond[0] = 10.0
    for _ in range(200):
        step(beyond)  # clamped, and far: velocity, acceleration and jerk shape the move
    low = HOME.clone()
    low[1], low[3] = 1.5, -0.3  # reaches down past the box floor
    step(low)
    blocked = shield._output.clone()
    for _ in range(300):  # the arm stops while its setpoint moves on: re-seeded once the lag passes 0.15 rad
        if step(low, measured=blocked).info["safety/tracking_error"]:
            break
    step(measured=shield._output + 0.3)  # a joint state 0.3 rad off in 1 ms: a glitch, refused
    step(stamp=clock[0] - 0.005)  # stamped before the newest state: refused
    for _ in range(60):
        step()  # no command for 60 ms > 50: command timeout
    frozen = clock[0]
    step(HOME, stamp=frozen, wait=0.014)  # no joint state for 15 ms: hold
    step(HOME, stamp=frozen, wait=0.035)  # for 50 ms: stop, latched
    assert shield.latched == "stale_stop"
    with pytest.raises(ShieldResetError, match="braking"):
        shield.reset(shield._output, clock[0], clock[0])
    settle(stamp=frozen)
    shield.reset(shield._output, clock[0], clock[0])
    shield.estop(True)
    step(HOME)
    shield.estop(False)
    settle(stamp=None)
    shield.acknowledge_estop()
    shield.reset(shield._output, clock[0], clock[0])
    step(HOME, gripper=float("nan"))
    step(HOME, gripper=1.0)
    step(HOME, gripper=0.0)  # 1 ms after the last change: waits for gripper_min_interval
    expected = set(CORRECTION_KINDS) - {"delta_clip", "motion_error", "workspace_guard"}
    assert expected <= set(fired), f"not fired: {expected - set(fired)}"
    assert {kind: shield.counts[kind] for kind in fired} == fired
    info = step().info
    assert set(info) == {f"safety/{k}" for k in CORRECTION_KINDS} | {"safety/hold", "safety/stop"}
    assert all(isinstance(v, int) for v in info.values())


def test_delta_clip_limits_each_step_when_shaping_is_off():
    shield = make_shield(shape_motion=False, max_step=0.001)  # 1 rad/s at 1 kHz, inside every joint's limit
    target = HOME + 0.5
    targets = drive(shield, [target] + [None] * 9)
    assert (targets.diff(dim=0).abs() <= 0.001 + 1e-12).all()
    assert torch.allclose(targets[0] - HOME, torch.full((7,), 0.001, dtype=torch.float64))
    assert shield.counts["delta_clip"] == 10


def test_max_step_caps_the_shaped_velocity():
    shield = make_shield(max_step=0.0005)  # 0.5 rad/s at 1 kHz
    targets = drive(shield, [HOME + 0.3] + [None] * 600)
    assert (torch.cat([targets[:1] - HOME, targets.diff(dim=0)]).abs() <= 0.0005 * (1 + 1e-9)).all()
    assert shield.counts["velocity"] > 0 and shield.counts["delta_clip"] == 0


def test_workspace_pulls_the_step_back_inside_the_box():
    shield = make_shield(command_timeout=10.0)
    outside = HOME.clone()
    outside[1], outside[3] = 1.5, -0.3  # reaching forward and down: the tool point ends below the box floor
    assert shield.chain.position(outside)[2] < BOX_MIN[2]
    targets = drive(shield, [outside] + [None] * 1500)
    assert shield.counts["workspace"] == 1
    ee = shield.chain.position(targets)
    box, margin = shield.box, shield.box.margin
    assert box.contains(ee).all()  # the whole move stays inside the shrunk box ...
    gap = torch.minimum(ee - (box.lower + margin), (box.upper - margin) - ee).min()
    assert gap < 0.02  # ... and goes nearly as far as it allows
    along = (targets[-1] - HOME) / (outside - HOME)
    assert torch.allclose(along[[1, 3]], along[1].expand(2)) and 0.5 < along[1] < 1  # pulled back on the segment


def test_a_start_outside_the_box_may_only_move_toward_it():
    shield = make_shield(command_timeout=10.0)
    outside = HOME.clone()
    outside[1], outside[3] = 1.5, -0.3
    shield.reset(outside, 0.0, 0.0)
    start_distance = shield.box.distance_outside(shield.chain.position(outside), margin=0.0)
    further = outside.clone()
    further[1] = 1.7
    targets = drive(shield, [further] + [None] * 300 + [HOME] + [None] * 1500)
    distance = shield.box.distance_outside(shield.chain.position(targets), margin=0.0)
    assert (distance[:300] <= start_distance + 1e-9).all()
    assert distance[-1] == 0


# ---------------------------------------------------------------- hostile sequences


def hostile_sequence(steps: int, policy_period: int, generator: torch.Generator) -> list:
    commands, previous = [], HOME.clone()
    for i in range(steps):
        if i % policy_period:
            commands.append(None)
            continue
        kind = int(torch.randint(0, 6, (1,), generator=generator))
        if kind == 0:
            command = LOWER - 2 + torch.rand(7, generator=generator, dtype=torch.float64) * (UPPER - LOWER + 4)
        elif kind == 1:
            command = torch.where(torch.rand(7, generator=generator) < 0.5, UPPER + 1, LOWER - 1)
        elif kind == 2:
            command = -previous
        elif kind == 3:
            command = (torch.rand(7, generator=generator, dtype=torch.float64) * 2 - 1) * 1e9
        elif kind == 4:
            command = previous.clone()
            command[torch.rand(7, generator=generator) < 0.5] = float("nan")
            command[int(torch.randint(0, 7, (1,), generator=generator))] = float("inf")
        else:
            command = previous + torch.randn(7, generator=generator, dtype=torch.float64) * 0.3
        commands.append(command)
        if bool(torch.isfinite(command).all()):
            previous = command
    return commands


@pytest.mark.parametrize("policy_period", [1, 7, 50])  # a new command every control step, and slower
def test_hostile_sequences_never_leave_the_limits(policy_period):
    shield = make_shield(command_timeout=10.0)
    generator = torch.Generator().manual_seed(policy_period)
    steps = 1000 if policy_period == 1 else 3000  # a checked command every step costs ~2 ms
    targets = drive(shield, hostile_sequence(steps, policy_period, generator))
    assert torch.isfinite(targets).all()
    limits = shield.limits
    assert (targets >= limits.lower - 1e-9).all() and (targets <= limits.upper + 1e-9).all()
    steps = torch.cat([targets[:1] - HOME, targets.diff(dim=0)])
    assert (steps.abs() <= limits.max_step * (1 + 1e-9)).all()
    ee = shield.chain.position(targets)
    assert shield.box.contains(ee, margin=0.0).all()
    assert shield.counts["nan"] > 0 and shield.counts["position_limit"] > 0 and shield.counts["workspace"] > 0
    assert shield.counts["motion_error"] == 0 and shield.counts["delta_clip"] == 0  # the guards never fired


def test_at_rest_means_the_brake_has_finished_not_a_velocity_near_zero():
    """A stop from a workspace-cut move passes a period whose velocity is under 1e-6 rad/s while the
    deceleration is still easing off. at_rest waits for velocity and acceleration both, and from then on the
    setpoint never changes (reset() and a robot env's close() both rely on that)."""
    period = 0.004
    shield = make_shield(
        control_period=period, stop_after=0.1, workspace_min=(0.1, -0.6, 0.05), workspace_max=(0.8, 0.6, 0.9)
    )
    target, now = HOME.clone(), 0.0
    for i in range(80):
        now += period
        command = None
        if i % 5 == 0:
            target = target + 0.1
            command = target
        shield.filter(command, shield._output, now, now)
    slow_but_moving, rested = 0, None
    last_state, now = now, now + 0.1
    for _ in range(300):
        now += period
        out = shield.filter(None, shield._output, last_state, now)  # no state for over stop_after: stopped
        assert out.mode == "stop"
        if rested is not None:
            assert torch.equal(out.target, rested)
        elif shield.at_rest:
            rested = out.target
        elif bool((shield.motion.velocity.abs() <= 1e-6).all()):
            slow_but_moving += 1
    assert rested is not None and slow_but_moving >= 1


def test_a_released_estop_restarts_only_once_acknowledged():
    shield = make_shield()
    shield.estop(True)
    with pytest.raises(ShieldResetError, match="still pressed"):
        shield.acknowledge_estop()
    with pytest.raises(ShieldResetError, match="still pressed"):
        shield.reset(HOME, 0.0, 0.0)
    drive(shield, [None] * 5)
    shield.estop(False)  # released: an automatic reset (an episode ending) must not restart motion
    with pytest.raises(ShieldResetError, match="not acknowledged"):
        shield.reset(HOME, 0.005, 0.005)
    assert shield.latched == "estop"
    shield.acknowledge_estop()
    shield.reset(HOME, 0.005, 0.005)
    assert shield.latched is None
    shield.estop(True)  # an acknowledgement is spent by its reset, and a new press needs a new one
    shield.estop(False)
    with pytest.raises(ShieldResetError, match="not acknowledged"):
        shield.reset(HOME, 0.005, 0.005)
    shield.acknowledge_estop()
    shield.estop(True)  # pressed again after the acknowledgement: it no longer counts
    shield.estop(False)
    with pytest.raises(ShieldResetError, match="not acknowledged"):
        shield.reset(HOME, 0.005, 0.005)


def test_shaped_output_respects_velocity_acceleration_and_jerk_at_1khz():
    shield = make_shield(command_timeout=10.0, hold_after=0.002, stop_after=0.02)
    generator = torch.Generator().manual_seed(3)
    commands = hostile_sequence(4000, 40, generator)
    targets, position = [HOME, HOME, HOME], HOME
    for i, command in enumerate(commands):
        now = (i + 1) * DT
        if i == 1000:
            shield.estop(True)  # braking from whatever motion is under way
        if i == 1400:
            shield.estop(False)
            shield.acknowledge_estop()
            shield.reset(position, now, now)
        stale = 2000 <= i < 2500  # a hold, then a latched stop and, once braked, its reset
        if i == 2500:
            shield.reset(position, now, now)
        out = shield.filter(command, position, 1999 * DT if stale else now, now)
        position = out.target
        targets.append(position)
    p = torch.stack(targets)
    velocity = p.diff(dim=0) / DT
    acceleration = velocity.diff(dim=0) / DT
    jerk = acceleration.diff(dim=0) / DT
    limits = shield.limits
    assert (velocity.abs() <= limits.velocity * (1 + 1e-6)).all()
    assert (acceleration.abs() <= limits.acceleration * (1 + 1e-6) + 1e-6).all()
    assert (jerk.abs() <= limits.jerk * (1 + 1e-6) + 1e-3).all()
    assert velocity.abs().max(dim=0).values.min() > 0.5 * limits.velocity.min()  # it really moved
    assert shield.counts["estop"] > 0 and shield.counts["stale_stop"] > 0


# ---------------------------------------------------------------- watchdog, timeout, e-stop


def test_watchdog_holds_then_stops_and_needs_a_fresh_state_and_reset():
    shield = make_shield(hold_after=0.02, stop_after=0.1, command_timeout=10.0)
    goal = HOME + 0.3
    drive(shield, [goal] + [None] * 50)
    stamp, modes = 0.051, []
    for i in range(1, 150):
        now = stamp + i * DT
        modes.append(shield.filter(goal, shield._output, stamp, now).mode)
    ages = [i * DT for i in range(1, 150)]
    assert all(m == "track" for m, age in zip(modes, ages, strict=True) if age <= 0.02 - 1e-9)
    assert all(m == "hold" for m, age in zip(modes, ages, strict=True) if 0.02 + 1e-9 < age <= 0.1 - 1e-9)
    assert all(m == "stop" for m, age in zip(modes, ages, strict=True) if age > 0.1 + 1e-9)
    now = stamp + 0.2
    assert shield.filter(None, shield._output, now, now).mode == "stop"  # fresh again, still latched
    with pytest.raises(ShieldResetError, match="not fresh"):
        shield.reset(shield._output, now - 0.5, now)
    shield.reset(shield._output, now, now)
    assert shield.filter(goal, shield._output, now + DT, now + DT).mode == "track"
    assert shield.counts["stale_hold"] > 0 and shield.counts["stale_stop"] > 0


def test_a_stale_state_hold_pauses_the_move_and_a_fresh_state_resumes_it():
    """A few late joint states brake the move; the next fresh one resumes it toward the command in force, with no
    new command. A command given during the pause is dropped (computed from stale data); a command timeout, a
    stop or an e-stop ends the pause for good."""
    goal = HOME + 0.3
    shield = make_shield(hold_after=0.004, stop_after=0.5, command_timeout=10.0)
    drive(shield, [goal] + [None] * 30)
    stamp, position = 0.031, shield._output.clone()
    for i in range(1, 30):  # the state stops coming: a hold after 4 ms; a command given meanwhile is dropped
        now = stamp + i * DT
        out = shield.filter(HOME - 0.3 if i == 10 else None, position, stamp, now)
        position = out.target
    assert out.mode == "hold" and shield.counts["stale_hold"] > 0
    braked = drive(shield, [None] * 3, start=stamp + 29 * DT)  # fresh again: moving toward the goal once more
    assert ((braked[-1] - braked[0]) * (goal - HOME)).sum() > 0
    resumed = drive(shield, [None] * 2000, start=stamp + 32 * DT)
    torch.testing.assert_close(resumed[-1], goal, atol=1e-6, rtol=0)

    timed_out = make_shield(hold_after=0.004, stop_after=0.5, command_timeout=0.05)
    drive(timed_out, [goal] + [None] * 30)
    for i in range(1, 30):
        out = timed_out.filter(None, timed_out._output, stamp, stamp + i * DT)
    after = drive(timed_out, [None] * 2000, start=stamp + 29 * DT)
    assert (after[-1] - goal).abs().max() > 0.05  # the timeout came first: it stays where the brake left it
    assert timed_out.counts["command_timeout"] > 0


@pytest.mark.parametrize("stamp", [None, float("nan"), 1.7e9])  # missing, broken, from another clock
def test_unusable_stamps_stop(stamp):
    shield = make_shield()
    assert shield.filter(HOME, HOME, stamp, 0.001).mode == "stop"


def test_non_finite_joint_state_stops():
    shield = make_shield()
    bad = HOME.clone()
    bad[0] = float("nan")
    assert shield.filter(HOME, bad, 0.001, 0.001).mode == "stop"


def test_command_timeout_holds_until_a_new_command():
    shield = make_shield(command_timeout=0.1)
    targets = drive(shield, [HOME + 0.5] + [None] * 400)
    assert abs(shield.counts["command_timeout"] - 300) <= 1  # from 0.1 s after the command to the end
    assert targets[-1].sub(targets[-2]).abs().max() == 0  # braked to a standstill short of the target
    assert (targets[-1] - (HOME + 0.5)).abs().max() > 0.01
    out = shield.filter(HOME, targets[-1], 0.402, 0.402)
    assert out.mode == "track" and out.info["safety/command_timeout"] == 0


def test_estop_latches_until_released_acknowledged_and_reset():
    shield = make_shield(command_timeout=10.0)
    moving = drive(shield, [HOME + 1.0] + [None] * 100)
    shield.estop(True)
    held = drive(shield, [HOME - 1.0] + [None] * 400, start=0.101)
    speed = held.diff(dim=0).abs().max(dim=1).values
    assert speed[0] > 0 and speed[-100:].max() == 0  # braked, then still
    assert (held[-1] - moving[-1]).abs().max() < 0.3  # stopped near where the press found it
    shield.estop(False)
    still = drive(shield, [HOME - 1.0] * 10, start=0.6)
    assert (still - held[-1]).abs().max() == 0  # released but latched
    shield.estop(True)
    with pytest.raises(ShieldResetError, match="e-stop"):
        shield.reset(held[-1], 0.62, 0.62)
    shield.estop(False)
    shield.acknowledge_estop()
    shield.reset(held[-1], 0.62, 0.62)
    resumed = drive(shield, [HOME] + [None] * 10, start=0.62)
    assert (resumed[-1] - held[-1]).abs().max() > 0
    assert shield.counts["estop"] == 411


def test_gripper_is_clamped_and_nan_holds():
    shield = make_shield(gripper_min_interval=0.0)
    assert shield.filter(None, HOME, 0.001, 0.001, gripper=0.5).gripper.item() == pytest.approx(0.04)
    assert shield.filter(None, HOME, 0.002, 0.002, gripper=float("nan")).gripper.item() == pytest.approx(0.04)
    assert shield.filter(None, HOME, 0.003, 0.003, gripper=-1.0).gripper.item() == 0.0
    assert shield.counts["gripper_limit"] == 2 and shield.counts["gripper_nan"] == 1


def test_gripper_keeps_its_setpoint_while_the_arm_holds():
    shield = make_shield(hold_after=0.002, stop_after=0.5, gripper_min_interval=0.0)
    assert shield.filter(None, HOME, 0.001, 0.001, gripper=0.0).gripper.item() == 0.0  # tracking: follows
    held = shield.filter(None, HOME, 0.001, 0.010, gripper=0.04)  # a 9 ms old state: the arm holds
    assert held.mode == "hold" and held.gripper.item() == 0.0
    assert shield.filter(None, HOME, 0.011, 0.011, gripper=0.04).gripper.item() == pytest.approx(0.04)


def test_corrections_are_logged_at_a_limited_rate(caplog):
    shield = make_shield(log_interval=1.0, command_timeout=10.0)
    bad = torch.full((7,), float("nan"), dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="robotrl.safety"):
        drive(shield, [bad] * 2500)
    nan_lines = [r for r in caplog.records if "nan" in r.getMessage()]
    assert len(nan_lines) == 3  # at 0.001, 1.001, 2.001 s
    assert shield.counts["nan"] == 2500


# ---------------------------------------------------------------- in simulation


def test_simulated_panda_stays_inside_under_hostile_commands():
    """Position actuators at 500 Hz tracking the shield's setpoints: the simulator's own joint positions,
    velocities and tool point stay inside the hard limits and the box."""
    model = mujoco.MjModel.from_xml_path(str(PANDA_XML))
    data = mujoco.MjData(model)
    period = model.opt.timestep
    data.qpos[:7] = HOME.numpy()
    data.ctrl[:7] = HOME.numpy()
    mujoco.mj_forward(model, data)
    config = ShieldConfig(
        control_period=period,
        velocity_scale=0.85,
        tracking_error=0.15,
        workspace_min=BOX_MIN,
        workspace_max=BOX_MAX,
        workspace_margin=0.03,
    )
    shield = Shield.from_spec(SPEC, config, PANDA_XML)
    shield.reset(HOME, 0.0, 0.0)
    site = model.site(SPEC.end_effector_site).id
    commands = hostile_sequence(3000, 25, torch.Generator().manual_seed(5))
    lower, upper, velocity = LOWER.numpy(), UPPER.numpy(), SPEC.velocity_limit.double().numpy()
    worst_joint = worst_speed = worst_box = -math.inf
    for i, command in enumerate(commands):
        now = (i + 1) * period
        data.ctrl[:7] = shield.filter(command, torch.from_numpy(data.qpos[:7].copy()), now, now).target.numpy()
        mujoco.mj_step(model, data)
        worst_joint = max(worst_joint, float(np.max(np.maximum(lower - data.qpos[:7], data.qpos[:7] - upper))))
        worst_speed = max(worst_speed, float(np.max(np.abs(data.qvel[:7]) - velocity)))
        ee = data.site_xpos[site]
        worst_box = max(worst_box, float(np.max(np.maximum(np.array(BOX_MIN) - ee, ee - np.array(BOX_MAX)))))
    assert worst_joint < 0 and worst_speed < 0 and worst_box < 0, (worst_joint, worst_speed, worst_box)
    assert shield.counts["workspace"] > 0 and shield.counts["position_limit"] > 0
    assert shield.counts["tracking_error"] > 0  # the wrist lags: re-seeds, and the box re-checked after them


# ---------------------------------------------------------------- tracking error


def lagging_arm(shield: Shield, steps: int, goal: torch.Tensor, blocked: range, gain: float = 10.0):
    """A position-controlled arm with a stiff catch-up: joint speed = gain * (setpoint - position), not
    limited by the shield (like a PD loop far from its setpoint), and stuck (speed 0) during `blocked` steps.
    Returns the measured joint speeds [T, n] and the setpoints [T, n]."""
    position, speeds, targets = shield._output.clone(), [], []
    for i in range(steps):
        now = (i + 1) * DT
        out = shield.filter(goal if i == 0 else None, position, now, now)
        speed = torch.zeros(7, dtype=torch.float64) if i in blocked else gain * (out.target - position)
        position = position + speed * DT
        speeds.append(speed)
        targets.append(out.target)
    return torch.stack(speeds), torch.stack(targets)


@pytest.mark.parametrize("tracking_error", [None, 0.15])
def test_a_lagging_arm_is_reseeded_and_never_sprints(tracking_error):
    """The arm is held back for 0.4 s while the setpoint runs on, then released. Without the check the
    whole lag is caught up at gain * lag, far above the velocity limit; with it the setpoint is re-seeded at
    the measured position whenever the lag passes the bound, so the catch-up stays below the limit."""
    shield = make_shield(command_timeout=10.0, tracking_error=tracking_error, workspace_min=None, workspace_max=None)
    goal = HOME.clone()
    goal[4] = HOME[4] + 2.5  # joint5 (a wrist joint) moves 2.5 rad
    speeds, targets = lagging_arm(shield, 6000, goal, blocked=range(100, 500))
    limit = SPEC.velocity_limit.double()
    if tracking_error is None:
        setpoint_speed = targets.diff(dim=0).abs() / DT
        assert (setpoint_speed <= shield.limits.velocity * (1 + 1e-6) + 1e-6).all()  # the setpoints kept it ...
        assert speeds[:, 4].abs().max() > 2 * limit[4]  # ... and the arm still sprinted: what the check stops
        assert shield.counts["tracking_error"] == 0
    else:
        assert (speeds.abs() <= limit).all(), speeds.abs().max(dim=0).values
        assert shield.counts["tracking_error"] > 0
        assert (targets[-1] - goal).abs().max() < 1e-6  # and it still arrives


def test_reseed_starts_from_the_measured_state():
    shield = make_shield(command_timeout=10.0, tracking_error=0.15)
    drive(shield, [HOME + 0.4] + [None] * 100)  # moving
    measured, now, out = shield._output.clone(), 0.101, None
    zero = torch.zeros(7, dtype=torch.float64)
    for _ in range(300):  # joint3 stops; the others follow their setpoints
        now += DT
        measured = torch.cat([shield._output[:2], measured[2:3], shield._output[3:]])
        before = shield._output.clone()
        out = shield.filter(None, measured, now, now, joint_velocity=zero)
        if out.info["safety/tracking_error"]:
            break
    assert out.info["safety/tracking_error"] == 1
    # the lag passed the bound in tracking_samples states in a row; the setpoint jumped the bound toward the
    # measurement, no further, and goes on from there at the given velocity (zero)
    settle = shield.limits.acceleration[2] * DT * DT
    assert abs(out.target[2] - measured[2]) <= shield.config.tracking_samples * shield.limits.max_step[2] + settle
    assert abs(out.target[2] - before[2]) <= 0.15 + settle
    assert torch.allclose(
        out.target[[0, 1, 3, 4, 5, 6]], measured[[0, 1, 3, 4, 5, 6]], atol=shield.limits.max_step.max()
    )
    within = shield.filter(None, out.target, now + DT, now + DT)  # tracking again: no correction
    assert within.info["safety/tracking_error"] == 0


def test_simulated_panda_wrist_does_not_outrun_its_limit_after_lagging():
    """MuJoCo Panda (12 Nm wrist): the arm is sent to an extreme pose and back home. Joint5 lags its setpoint
    by up to 0.4 rad against gravity and the upper arm's motion, then sprints back above its velocity limit
    when the setpoints come home; with the tracking-error check it never does."""
    model = mujoco.MjModel.from_xml_path(str(PANDA_XML))
    extreme = torch.tensor([-3.4, -2.26, 3.4, -3.57, 3.4, -0.52, -3.4], dtype=torch.float64)
    worst = {}
    for tracking_error in (None, 0.15):
        data = mujoco.MjData(model)
        period = model.opt.timestep
        data.qpos[:7] = HOME.numpy()
        data.ctrl[:7] = HOME.numpy()
        mujoco.mj_forward(model, data)
        config = ShieldConfig(
            control_period=period,
            velocity_scale=0.8,
            acceleration_scale=0.5,
            tracking_error=tracking_error,
            command_timeout=10.0,
        )
        shield = Shield.from_spec(SPEC, config)
        shield.reset(HOME, 0.0, 0.0)
        excess = -math.inf
        for i in range(2000):
            now = (i + 1) * period
            command = extreme if i == 0 else HOME if i == 1000 else None
            out = shield.filter(command, torch.from_numpy(data.qpos[:7].copy()), now, now)
            data.ctrl[:7] = out.target.numpy()
            mujoco.mj_step(model, data)
            excess = max(excess, float(np.max(np.abs(data.qvel[:7]) - SPEC.velocity_limit.double().numpy())))
        worst[tracking_error] = (excess, shield.counts["tracking_error"])
    assert worst[None][0] > 0.5  # measured: 1.08 rad/s above the limit without the check
    assert worst[0.15][0] < 0 and worst[0.15][1] > 0, worst


def test_site_positions_match_the_torch_forward_kinematics(tmp_path):
    path = tmp_path / "chain.xml"
    path.write_text(SYNTHETIC)  # hinges and a slide
    for chain, low, high in (
        (KinematicChain.from_mjcf(PANDA_XML, SPEC.end_effector_site, SPEC.joints), LOWER, UPPER),
        (KinematicChain.from_mjcf(path, "tip", ("j1", "j2", "j3", "j4")), -2 * torch.ones(4), 2 * torch.ones(4)),
    ):
        q = low + torch.rand(200, len(low), dtype=torch.float64) * (high - low)
        np.testing.assert_allclose(chain.site_positions(q.numpy()), chain.position(q).numpy(), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="joint positions"):
        chain.site_positions(np.zeros(4))


# ---------------------------------------------------------------- hostile review: brake, glitches, chatter


def panda_plant():
    model = mujoco.MjModel.from_xml_path(str(PANDA_XML))
    data = mujoco.MjData(model)
    data.qpos[:7] = HOME.numpy()
    data.ctrl[:7] = HOME.numpy()
    mujoco.mj_forward(model, data)
    return model, data


def test_the_setpoints_are_the_samples_of_the_checked_plan():
    """A move is planned and checked once, then followed: the setpoints are that trajectory's samples, also
    while other moves are planned (and not taken) from the states along it."""
    shield = make_shield(command_timeout=10.0)
    motion = shield.motion
    goal = HOME + torch.tensor([0.4, 0.3, -0.3, 0.2, 0.5, -0.4, 0.3], dtype=torch.float64)
    plan = motion.plan(goal)
    motion.follow(plan)
    for k in range(1, 400):
        motion.plan(HOME - 0.5)  # planned from here, never followed
        step = motion.step()
        expected = goal if k * DT >= plan.duration else torch.from_numpy(plan.state(k * DT)[0])
        assert torch.equal(step.position, expected), k


def test_the_output_never_leaves_the_box_whatever_the_motion_stage_planned():
    shield = make_shield(command_timeout=10.0)
    outside = HOME.clone()
    outside[1], outside[3] = 1.5, -0.3  # the tool point ends below the box floor
    shield.motion.follow(shield.motion.plan(outside))  # a plan nobody checked
    targets = drive(shield, [None] * 1500)
    assert shield.box.contains(shield.chain.position(targets), margin=0.0).all()
    assert shield.counts["workspace_guard"] == 1 and shield.at_rest


def chatter(steps: int, period: int, generator: torch.Generator, shield: Shield) -> list:
    """1 mrad of dither around a soft joint limit every control period, and a limit-to-limit yank every
    `period` periods (a policy stuck against a limit, then thrown across)."""
    lower, upper = shield.limits.lower, shield.limits.upper
    commands, base = [], HOME.clone()
    for i in range(steps):
        if i % period == 0:
            base = torch.where(torch.rand(7, generator=generator) < 0.5, upper, lower)
            commands.append(torch.where(base == upper, UPPER, LOWER))
        else:
            commands.append(base + (0.001 if i % 2 else -0.001))
    return commands


@pytest.mark.parametrize("seed", [0, 1])
def test_limit_chatter_with_yanks_and_holds_keeps_every_setpoint_in_the_box(seed):
    """The Panda in MuJoCo at 500 Hz: chatter at the soft limits, yanks across, and every 0.2 s a stale state
    or a silent policy for 20-60 ms (the hold brakes from full speed). Every setpoint sent and the tool point
    stay inside the box; every step within the per-step limit."""
    model, data = panda_plant()
    period = model.opt.timestep
    config = ShieldConfig(
        control_period=period, workspace_min=BOX_MIN, workspace_max=BOX_MAX, command_timeout=0.02, stop_after=1.0
    )
    shield = Shield.from_spec(SPEC, config, PANDA_XML)
    shield.reset(HOME, 0.0, 0.0)
    generator = torch.Generator().manual_seed(seed)
    commands = chatter(1500, 30, generator, shield)
    site = model.site(SPEC.end_effector_site).id
    targets, worst_box, stamp = [], -math.inf, 0.0
    for i, command in enumerate(commands):
        now = (i + 1) * period
        phase = i % 100
        stale = 40 <= phase < 40 + 10 * (seed + 1)  # no new joint state: a hold after two periods
        silent = 70 <= phase < 90  # no command for 40 ms > command_timeout: a hold
        if not stale:
            stamp = now
        out = shield.filter(None if silent else command, torch.from_numpy(data.qpos[:7].copy()), stamp, now)
        targets.append(out.target)
        data.ctrl[:7] = out.target.numpy()
        mujoco.mj_step(model, data)
        ee = data.site_xpos[site]
        worst_box = max(worst_box, float(np.max(np.maximum(np.array(BOX_MIN) - ee, ee - np.array(BOX_MAX)))))
    targets = torch.stack(targets)
    assert shield.box.contains(shield.chain.position(targets), margin=0.0).all()
    assert worst_box < 0, worst_box
    steps = torch.cat([targets[:1] - HOME, targets.diff(dim=0)])
    assert (steps.abs() <= shield.limits.max_step * (1 + 1e-9)).all()
    assert shield.counts["workspace"] > 0 and shield.counts["stale_hold"] > 0 and shield.counts["command_timeout"] > 0


def test_one_glitching_or_late_joint_state_never_jumps_the_setpoint():
    """The Panda in MuJoCo, re-seeds on (tracking_error 0.15), sent back and forth: every 50 periods one joint
    state is 0.3 rad off on a joint, and every 70 periods one arrives 150 ms late (its stamp says so). Before
    these were refused, each glitch re-seeded the setpoint onto the glitch: a jump of ~60 per-step limits."""
    model, data = panda_plant()
    period = model.opt.timestep
    config = ShieldConfig(control_period=period, tracking_error=0.15, command_timeout=10.0, velocity_scale=0.5)
    shield = Shield.from_spec(SPEC, config)
    shield.reset(HOME, 0.0, 0.0)
    history, targets = [], []
    away = HOME + torch.tensor([0.6, 0.4, -0.5, 0.5, 0.6, -0.5, 0.6], dtype=torch.float64)
    for i in range(3000):
        now = (i + 1) * period
        q = torch.from_numpy(data.qpos[:7].copy())
        history.append(q)
        measured, stamp = q, now
        if i % 50 == 25:
            measured = q.clone()
            measured[i % 7] += 0.3
        elif i % 70 == 35 and i > 100:
            measured, stamp = history[-75], now - 0.15
        command = (away if (i // 500) % 2 == 0 else HOME) if i % 500 == 0 else None
        out = shield.filter(command, measured, stamp, now)
        targets.append(out.target)
        data.ctrl[:7] = out.target.numpy()
        mujoco.mj_step(model, data)
    steps = torch.stack(targets).diff(dim=0).abs()
    assert (steps <= shield.limits.max_step * (1 + 1e-9)).all(), float((steps / shield.limits.max_step).max())
    assert shield.counts["state_glitch"] >= 50 and shield.counts["state_out_of_order"] >= 30
    assert shield.counts["tracking_error"] == 0


def test_a_joint_state_stamped_before_the_newest_is_refused_and_the_newest_ages():
    shield = make_shield(hold_after=0.01, stop_after=0.5)
    drive(shield, [HOME + 0.1] + [None] * 9)  # states stamped up to 0.010
    old = shield._output + 0.001
    out = shield.filter(None, old, 0.005, 0.011)  # 6 ms old but older than the newest: refused
    assert out.info["safety/state_out_of_order"] == 1 and out.mode == "track"
    out = shield.filter(None, old, 0.011, 0.012)  # newer: taken
    assert out.mode == "track" and out.info["safety/state_out_of_order"] == 0
    out = shield.filter(None, old, 0.009, 0.0225)  # refused again, and the newest (0.011) is 11.5 ms old
    assert out.info["safety/state_out_of_order"] == 1 and out.mode == "hold"


def test_now_must_never_go_back():
    shield = make_shield()
    shield.filter(None, HOME, 0.002, 0.002)
    with pytest.raises(ValueError, match=r"now went back in time: 0.001 after 0.002"):
        shield.filter(None, HOME, 0.002, 0.001)
    with pytest.raises(ValueError, match="went back"):
        shield.reset(HOME, 0.001, 0.001)


def test_a_gripper_toggled_every_period_changes_at_most_every_min_interval():
    shield = make_shield(command_timeout=10.0)
    values, now = [], 0.0
    for i in range(1500):
        now = (i + 1) * DT
        out = shield.filter(None, HOME, now, now, gripper=0.0 if i % 2 else 0.04)
        values.append(float(out.gripper))
    changes = int((np.diff(values) != 0).sum())
    assert changes <= 1.5 / shield.config.gripper_min_interval + 1 and changes >= 10
    assert shield.counts["gripper_rate"] > 500


def pushed_below_the_floor(shield: Shield, steps: int, now: float):
    """Joint states of an arm pushed down (joints 2 and 4, 0.5 rad/s) past the box floor from where the
    setpoint is, at rest; yields (now, measured)."""
    measured = shield._output.clone()
    push = torch.zeros(7, dtype=torch.float64)
    push[1], push[3] = 0.5 * DT, -0.5 * DT
    for _ in range(steps):
        now += DT
        measured = measured + push
        yield now, measured.clone()


def test_a_reseed_never_follows_an_arm_pushed_out_of_the_box_and_the_setpoint_still_moves_after():
    """Re-seeds on: a person pushes the arm down through the box floor. The re-seed toward it would put the
    setpoint outside the box (114.8 mm, and then froze it there); it is refused, and commands still move it."""
    shield = make_shield(command_timeout=10.0, tracking_error=0.15)
    start = HOME.clone()
    start[1], start[3] = 0.6, -1.6  # low over the table (z 0.166), inside the box
    shield.reset(start, 0.0, 0.0)
    assert shield.box.contains(shield.chain.position(start)).item()
    targets, now = [], 0.0
    for t, measured in pushed_below_the_floor(shield, 1500, 0.0):
        targets.append(shield.filter(None, measured, t, t).target)
        now = t
    assert not shield.box.contains(shield.chain.position(measured), margin=0.0).item()  # the arm is out
    targets = torch.stack(targets)
    assert shield.box.contains(shield.chain.position(targets), margin=0.0).all()
    assert shield.counts["tracking_error"] == 0 and shield.counts["workspace"] > 0
    for _ in range(2000):  # released, the arm springs back to its setpoint (0.5 rad/s), then tracks
        now += DT
        measured = measured + (targets[-1] - measured).clamp(-0.5 * DT, 0.5 * DT)
        shield.filter(None, measured, now, now)
    moved = drive(shield, [HOME] + [None] * 300, start=now)  # the setpoint is not frozen: it goes home
    assert (moved[-1] - targets[-1]).abs().max() > 0.1


def test_no_reseed_moves_the_setpoint_while_the_estop_is_latched():
    shield = make_shield(command_timeout=10.0, tracking_error=0.15, workspace_min=None, workspace_max=None)
    drive(shield, [None] * 5)
    shield.estop(True)
    held = shield._output.clone()
    moved = []
    for now, measured in pushed_below_the_floor(shield, 1000, 0.005):
        moved.append(shield.filter(None, measured, now, now).target)
    assert (torch.stack(moved) - held).abs().max() == 0  # at rest when pressed: not one step
    assert shield.counts["tracking_error"] == 0


def test_a_hold_whose_brake_would_leave_the_box_finishes_the_checked_move(monkeypatch):
    """The brake (ruckig's stop from the current state) is checked against the box like any move: when it
    would leave the box, a timeout hold follows the checked move to its end instead (inside, at rest)."""
    shield = make_shield(command_timeout=0.05)
    goal = HOME + torch.tensor([0.3, 0.2, 0.0, -0.2, 0.0, 0.2, 0.0], dtype=torch.float64)
    drive(shield, [goal] + [None] * 20)
    checked = shield.motion.following
    assert checked is not None and checked.target is not None
    outside = HOME.clone()
    outside[1], outside[3] = 1.5, -0.3  # a "brake" that would end below the floor
    monkeypatch.setattr(shield.motion, "brake_plan", lambda: shield.motion.plan(outside))
    targets = drive(shield, [None] * 1500, start=0.021)
    assert shield.counts["command_timeout"] > 0 and shield.counts["workspace"] > 0
    assert torch.equal(targets[-1], goal)  # the checked move, followed to its end
    assert shield.box.contains(shield.chain.position(targets), margin=0.0).all()
    assert shield.counts["workspace_guard"] == 0  # the brake check, not the last guard, kept it inside


def test_a_refused_reset_changes_nothing():
    shield = make_shield()
    shield.filter(None, HOME, 0.001, 1.0)  # a state 1 s old: stopped, latched
    assert shield.latched == "stale_stop"
    with pytest.raises(ShieldResetError, match="gripper"):
        shield.reset(HOME, 1.0, 1.0, gripper_position=float("nan"))
    assert shield.latched == "stale_stop"


def test_judge_state_is_the_rule_a_robot_env_applies_to_its_observations():
    shield = make_shield()
    drive(shield, [None] * 3)  # newest accepted: HOME at 0.003
    assert shield.judge_state(HOME, 0.003) is None
    assert shield.judge_state(HOME, 0.002) == "state_out_of_order"
    assert shield.judge_state(HOME + 0.3, 0.004) == "state_glitch"
    assert shield.judge_state(HOME + 0.001, 0.004) is None
