"""Hostile commands through the safety shield on a simulated Panda, against the same commands unshielded.

The Panda MJCF (tasks/assets/panda.xml, position actuators) is stepped once per control period (the
model's 2 ms timestep: 500 Hz); a "policy" sends a new joint-position command every `--policy-period`
control steps (20 Hz). Commands are hostile: uniform far beyond the limits, limit-to-limit sign flips
(some held for 2 s so the arm reaches its limits),
+-1e6, NaN and inf entries, small random walks, bursts at the control rate; on top, events: the policy
falling silent (command timeout), joint states going stale (hold, then a latched stop and a reset), e-stop
presses (latched, released, reset). Violations are read from the simulator's own state after every step:
- `joint_limit`: a joint's qpos beyond the spec's hard position limits;
- `velocity`: a joint's |qvel| above the spec's velocity limit;
- `workspace`: the end-effector site (site_xpos) outside the workspace box.
Each counts steps with at least one offending joint/axis; `worst_excess` is the largest signed excess over
each bound (negative: the closest the shielded robot came). A second shielded arm runs the same commands
through a shield without the box (`no_box_*`), so its joints are driven to their limits. The unshielded
reference sends the same commands straight to the actuators (non-finite entries replaced by the previous
command, so the simulation lives; MuJoCo clamps ctrl to the joint range) and ignores the events.
`violations` is the sum of `violations_by_kind`, which adds both shielded arms' counts per kind (goal: 0);
`boxed_*` and `no_box_*` split them by arm; `violation_ratio` is `violations` over the unshielded count. A
third shielded arm, an ablation not counted in `violations`, runs the no-box shield without its
tracking-error check (`no_tracking_check_violations_by_kind`). `filter_*_ms` time the boxed shield's
filter() per control step (all steps; `_new_command`: the steps where a command arrived, whose workspace
check costs the most), `sim_step_*_ms` the boxed arm's bare mj_step in the same loop, and
`filter_to_sim_step_ratio` divides the two means.

A second phase (`sensor_*` keys, same number of steps, one boxed arm) turns on the hostile inputs a
review found holes with: commands that chatter 1 mrad around the soft joint limits every period with a
limit-to-limit yank every 30 periods, alternating with the hostile commands above; joint states that glitch
(one sample 0.3 rad off on one joint), arrive 150 ms late (stamped when measured) or out of order (an older
sample after a newer one); two e-stop publishers, one pressing while the other says released and the
operator tries to acknowledge; a gripper toggled every control period. Its violations are the simulator's
(as above) plus `estop` (a control period in which the arm tracked, or an acknowledgement was accepted, while a
live publisher said pressed) and `gripper_rate` (gripper setpoint changes closer than the shield's
`gripper_min_interval`). `setpoint_jumps_over_limit` counts setpoints that moved further than the per-step
limit in one period, in both phases, except the deliberate ones: a reset restarts from the measured position,
and a tracking-error re-seed moves the setpoint at most `tracking_error` toward it (`reseed_jumps`,
`max_reseed_jump`). `violations` adds both phases.

The model's wrist actuators (12 Nm, kp 500) cannot hold joints 5-7 against gravity and the coupling of a
full-speed move of joints 1-4: a wrist joint falls up to a radian behind its setpoint and then, its
position loop saturated, sprints back several rad/s above its velocity limit although the setpoints never
exceed it. The shield's tracking-error check (`shield.tracking_error`) re-seeds the motion from the
measured state whenever a joint lags by more than the bound, so the lag, and the sprint, never build up;
with it the setpoints may use 90% of the velocity limits and all of the acceleration limits.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tasks" / "assets" / "panda.xml"
BOX_MIN = (0.15, -0.55, 0.10)
BOX_MAX = (0.80, 0.55, 0.95)
KINDS = ("joint_limit", "velocity", "workspace")


def extra(parser) -> None:
    parser.add_argument("--steps", type=int, default=None, help="control steps (default 10k quick, 100k full)")
    parser.add_argument("--policy-period", type=int, default=25, help="control steps per policy command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--velocity-scale", type=float, default=0.9, help="shield.velocity_scale (planned share)")
    parser.add_argument("--acceleration-scale", type=float, default=1.0)
    parser.add_argument("--tracking-error", type=float, default=0.15, help="rad; 0: the check off")
    parser.add_argument("--note", default=None, help="a remark stored with the figures (say, the machine was loaded)")


def hostile_commands(spec, steps: int, policy_period: int, seed: int):
    """The command for every control step (None: no new command), the gripper command, and the events."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lower, upper = spec.position_lower.double(), spec.position_upper.double()
    n = len(lower)
    commands: list = [None] * steps
    grippers: list = [None] * steps
    previous = spec.home.double()
    sticky, sticky_left = None, 0
    for step in range(0, steps, policy_period):
        kind = int(torch.randint(0, 8, (1,), generator=g))
        if sticky_left:  # an extreme command repeated for 2 s: the arm gets all the way to its limits
            sticky_left -= 1
            commands[step] = sticky
            continue
        if kind == 7 and torch.rand(1, generator=g) < 0.3:
            side = torch.rand(n, generator=g) < 0.5
            sticky, sticky_left = torch.where(side, upper + 0.5, lower - 0.5), 1000 // policy_period  # 2 s at 500 Hz
            commands[step] = sticky
            continue
        if kind == 0:  # uniform, well beyond the limits
            command = lower - 1 + torch.rand(n, generator=g, dtype=torch.float64) * (upper - lower + 2)
        elif kind == 1:  # limit to limit, flipping sides
            side = torch.rand(n, generator=g) < 0.5
            command = torch.where(side, upper + 0.5, lower - 0.5)
        elif kind == 2:  # sign flip of the last command
            command = -previous
        elif kind == 3:  # huge
            command = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * 1e6
        elif kind == 4:  # NaN and inf entries in an otherwise plausible command
            command = previous.clone()
            bad = torch.rand(n, generator=g) < 0.4
            values = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
            command[bad] = values[torch.randint(0, 3, (int(bad.sum()),), generator=g)]
        elif kind == 5:  # a burst: a new random command every control step of this policy period
            for k in range(step, min(step + policy_period, steps)):
                commands[k] = lower + torch.rand(n, generator=g, dtype=torch.float64) * (upper - lower)
            continue
        else:  # a plausible small move
            command = previous + torch.randn(n, generator=g, dtype=torch.float64) * 0.2
        commands[step] = command
        if bool(torch.isfinite(command).all()):
            previous = command
        grippers[step] = float(
            torch.tensor([float("nan"), -1.0, 0.02, 1.0])[int(torch.randint(0, 4, (1,), generator=g))]
        )
    events = []  # (start step, kind, duration in steps)
    for start in range(1000, steps - 1000, 1500):
        kind = ("silent", "stale", "estop")[int(torch.randint(0, 3, (1,), generator=g))]
        duration = int(torch.randint(50, 400, (1,), generator=g))
        events.append((start, kind, duration))
    return commands, grippers, events


def chatter_commands(lower, upper, hard_lower, hard_upper, steps: int, generator) -> list:
    """1 mrad of dither around the soft limits every period, a limit-to-limit yank every 30 periods."""
    import torch

    commands, base = [], lower
    for i in range(steps):
        if i % 30 == 0:
            side = torch.rand(len(lower), generator=generator) < 0.5
            base = torch.where(side, upper, lower)
            commands.append(torch.where(side, hard_upper, hard_lower))
        else:
            commands.append(base + (0.001 if i % 2 else -0.001))
    return commands


def hostile_sensor_inputs(spec, shield, steps: int, policy_period: int, seed: int):
    """Per control step: the command, how its joint state is corrupted (None, glitch, late, out_of_order), the
    gripper command; and the e-stop episodes (start, duration)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    hostile, hostile_grippers, _ = hostile_commands(spec, steps, policy_period, seed + 1)
    chatter = chatter_commands(
        shield.limits.lower, shield.limits.upper, spec.position_lower.double(), spec.position_upper.double(), steps, g
    )
    commands, grippers, corruption = [], [], []
    for step in range(steps):
        segment = (step // 3000) % 3  # chatter, hostile, hostile with a toggling gripper
        commands.append(chatter[step] if segment == 0 else hostile[step])
        grippers.append((0.0 if step % 2 else 0.04) if segment == 2 else hostile_grippers[step])
        u = float(torch.rand(1, generator=g))
        corruption.append(
            "glitch" if u < 1 / 50 else "late" if u < 1 / 50 + 1 / 70 else "out_of_order" if u < 0.05 else None
        )
    estops = [(start, int(torch.randint(100, 400, (1,), generator=g))) for start in range(1000, steps - 600, 2000)]
    return commands, grippers, corruption, estops


def run_sensors(args, steps: int) -> dict:
    """The second phase: hostile joint states, competing e-stop publishers, gripper toggling, limit chatter."""
    import mujoco
    import torch
    from robotrl.hardware.estop import EStopVotes

    from robotrl.safety import EStopLatchedError, Shield

    spec, model, period, site_id, gripper_actuator, spec_np = panda()
    shield = Shield.from_spec(spec, shield_config(args, period), MODEL)
    commands, grippers, corruption, estops = hostile_sensor_inputs(spec, shield, steps, args.policy_period, args.seed)
    data = mujoco.MjData(model)
    data.qpos[:7] = data.ctrl[:7] = spec.home.double().numpy()
    mujoco.mj_forward(model, data)
    shield.reset(torch.from_numpy(data.qpos[:7].copy()), 0.0, 0.0, gripper_position=0.0)
    button, dashboard = 1, 2  # two e-stop publishers, both live
    votes = EStopVotes()
    counts = dict.fromkeys((*KINDS, "estop", "gripper_rate"), 0)
    jumps = reseeds = refused_acks = 0
    max_reseed, max_jump_ratio = 0.0, 0.0
    history: list = []  # (joint positions, stamp) per step
    last_sent = shield._output.clone()
    gripper_changed_at, gripper_value = -float("inf"), 0.0  # the reset's measured opening is no command
    estop_at = dict(estops)
    pressed_at, pressing_until, restarting, reset_step = -1, -1, False, -1
    max_step = shield.limits.max_step * (1 + 1e-9)
    for step in range(steps):
        now = step * period
        q = torch.from_numpy(data.qpos[:7].copy())
        history.append((q, now))
        measured, stamp = q, now
        kind = corruption[step]
        if kind == "glitch":
            measured = q.clone()
            measured[step % 7] += 0.3 if step % 2 else -0.3
        elif kind == "late" and step >= 75:
            measured, stamp = history[-76]
        elif kind == "out_of_order" and step >= 3:
            measured, stamp = history[-3]
        if step in estop_at:  # the button presses; the dashboard says released; the operator tries to restart
            votes.record(button, True)
            shield.estop(True)
            pressed_at, pressing_until, restarting = step, step + estop_at[step], True
        if step == pressed_at + 20:
            votes.record(dashboard, False)  # the last message received says released
            shield.estop(votes.pressed({button, dashboard}))
        if step == pressing_until:
            votes.record(button, False)
            shield.estop(votes.pressed({button, dashboard}))
        pressed = votes.pressed({button, dashboard})
        if restarting and step % 50 == 0 and shield.latched and shield.at_rest:
            try:
                shield.acknowledge_estop()
                shield.reset(q, now, now)
                restarting, reset_step = False, step
                counts["estop"] += int(pressed)  # an acknowledgement taken while a publisher said pressed
            except EStopLatchedError:
                refused_acks += 1
        safe = shield.filter(commands[step], measured, stamp, now, gripper=grippers[step])
        counts["estop"] += int(pressed and safe.mode == "track" and not shield.at_rest)
        reseeded = bool(safe.info["safety/tracking_error"])
        jump = (safe.target - last_sent).abs()
        if reseeded:
            reseeds += 1
            max_reseed = max(max_reseed, float(jump.max()))
        elif step != reset_step and bool((jump > max_step).any()):
            jumps += 1
        max_jump_ratio = max(max_jump_ratio, float((jump / shield.limits.max_step).max()))
        last_sent = safe.target
        if safe.gripper is not None and float(safe.gripper) != gripper_value:
            counts["gripper_rate"] += int(now - gripper_changed_at < shield.config.gripper_min_interval - 1e-9)
            gripper_changed_at, gripper_value = now, float(safe.gripper)
            data.ctrl[gripper_actuator] = gripper_value
        data.ctrl[:7] = safe.target.numpy()
        mujoco.mj_step(model, data)
        for violation, happened in violations_of(data, spec_np, site_id).items():
            counts[violation] += int(happened)
    return {
        "sensor_steps": steps,
        "sensor_violations_by_kind": counts,
        "sensor_setpoint_jumps_over_limit": jumps,
        "reseed_jumps": reseeds,
        "max_reseed_jump": round(max_reseed, 6),
        "estop_acks_refused_while_pressed": refused_acks,
        "estop_episodes": len(estops),
        "sensor_corrections": {kind: n for kind, n in shield.counts.items() if n},
    }


def violations_of(data, spec_np, site_id) -> dict[str, bool]:
    import numpy as np

    lower, upper, velocity = spec_np
    qpos, qvel = data.qpos[:7], data.qvel[:7]
    ee = data.site_xpos[site_id]
    return {
        "joint_limit": bool(np.any(qpos < lower) or np.any(qpos > upper)),
        "velocity": bool(np.any(np.abs(qvel) > velocity)),
        "workspace": bool(np.any(ee < np.array(BOX_MIN)) or np.any(ee > np.array(BOX_MAX))),
    }


def panda():
    """The Panda's spec and MJCF model, its control period, end-effector site, gripper actuator and the
    (lower, upper, velocity) limits the violations are read against."""
    import mujoco

    from robotrl.core.robot_spec import load_robot_spec

    spec = load_robot_spec("panda")
    model = mujoco.MjModel.from_xml_path(str(MODEL))
    limits = tuple(x.double().numpy() for x in (spec.position_lower, spec.position_upper, spec.velocity_limit))
    site, gripper = model.site(spec.end_effector_site).id, model.actuator("gripper").id
    return spec, model, float(model.opt.timestep), site, gripper, limits


def shield_config(args, period: float):
    from robotrl.safety import ShieldConfig

    return ShieldConfig(
        control_period=period,
        position_margin=0.05,
        velocity_scale=args.velocity_scale,
        acceleration_scale=args.acceleration_scale,
        tracking_error=args.tracking_error or None,
        workspace_min=BOX_MIN,
        workspace_max=BOX_MAX,
        workspace_margin=0.03,
        hold_after=0.02,
        stop_after=0.2,
        command_timeout=0.3,
    )


def run(args) -> dict:
    import mujoco
    import numpy as np
    import torch

    from robotrl.safety import Shield, ShieldConfig

    spec, model, period, site_id, gripper_actuator, spec_np = panda()
    steps = args.steps or (10_000 if args.quick else 100_000)
    commands, grippers, events = hostile_commands(spec, steps, args.policy_period, args.seed)
    logging.getLogger("robotrl.safety").setLevel(logging.ERROR)  # corrections are counted, not printed
    config = shield_config(args, period)
    shield = Shield.from_spec(spec, config, MODEL)
    # the same shield without the box, so the joints are driven to their limits too
    joint_config = ShieldConfig(**{**config.__dict__, "workspace_min": None, "workspace_max": None})
    joint_shield = Shield.from_spec(spec, joint_config, MODEL)
    # ablation, not counted in `violations`: the no-box shield without the tracking-error check
    ablation_config = ShieldConfig(**{**joint_config.__dict__, "tracking_error": None})
    ablation_shield = Shield.from_spec(spec, ablation_config, MODEL)

    shielded, joint_shielded, unshielded = mujoco.MjData(model), mujoco.MjData(model), mujoco.MjData(model)
    ablation = mujoco.MjData(model)
    for data in (shielded, joint_shielded, unshielded, ablation):
        data.qpos[:7] = spec.home.double().numpy()
        data.ctrl[:7] = spec.home.double().numpy()
        mujoco.mj_forward(model, data)
    pairs = ((shield, shielded), (joint_shield, joint_shielded), (ablation_shield, ablation))
    for each, data in pairs:
        each.reset(torch.from_numpy(data.qpos[:7].copy()), 0.0, 0.0, gripper_position=0.0)

    names = ("shielded", "joint_shielded", "unshielded", "ablation")
    counts = {name: dict.fromkeys(KINDS, 0) for name in names}
    worst = {name: dict.fromkeys(KINDS, -float("inf")) for name in names[:2]}
    latencies, with_command = np.empty(steps), np.zeros(steps, dtype=bool)
    sim_times = np.empty(steps)  # the bare simulator step of the boxed arm, timed in the same loop
    event_at = {start: (kind, duration) for start, kind, duration in events}
    active_event, event_end, frozen_stamp = None, -1, 0.0
    last_sent = [each._output.clone() for each, _ in pairs]
    max_step, jumps = shield.limits.max_step * (1 + 1e-9), 0  # setpoint moves beyond the per-step limit
    start_time = time.perf_counter()
    for step in range(steps):
        now = step * period
        if step in event_at:
            active_event, duration = event_at[step]
            event_end = step + duration
            frozen_stamp = now
            if active_event == "estop":
                for each, _ in pairs:
                    each.estop(True)
        if active_event is not None and step == event_end:
            if active_event == "estop":
                for each, _ in pairs:
                    each.estop(False)
            active_event = None
        command = None if active_event == "silent" else commands[step]
        stamp = frozen_stamp if active_event == "stale" else now
        for index, (each, data) in enumerate(pairs):
            restarted = False
            if active_event is None and each.latched and each.at_rest:
                each.acknowledge_estop()  # the operator's restart permission (a no-op after a stale stop)
                each.reset(torch.from_numpy(data.qpos[:7].copy()), now, now)
                restarted = True
            t0 = time.perf_counter()
            safe = each.filter(command, torch.from_numpy(data.qpos[:7].copy()), stamp, now, gripper=grippers[step])
            jump = (safe.target - last_sent[index]).abs()
            last_sent[index] = safe.target
            if index < 2 and not restarted and not safe.info["safety/tracking_error"]:
                jumps += int(bool((jump > max_step).any()))
            if each is shield:
                latencies[step] = time.perf_counter() - t0
                with_command[step] = command is not None
            data.ctrl[:7] = safe.target.numpy()
            if safe.gripper is not None:
                data.ctrl[gripper_actuator] = float(safe.gripper)

        if commands[step] is not None:
            raw = commands[step].numpy()
            unshielded.ctrl[:7] = np.where(np.isfinite(raw), raw, unshielded.ctrl[:7])
        if grippers[step] is not None and np.isfinite(grippers[step]):
            unshielded.ctrl[gripper_actuator] = grippers[step]

        for name, data in zip(names, (shielded, joint_shielded, unshielded, ablation), strict=True):
            t0 = time.perf_counter()
            mujoco.mj_step(model, data)
            if data is shielded:
                sim_times[step] = time.perf_counter() - t0
            for kind, violated in violations_of(data, spec_np, site_id).items():
                counts[name][kind] += int(violated)
        _track_worst(worst["shielded"], shielded, spec_np, site_id)
        _track_worst(worst["joint_shielded"], joint_shielded, spec_np, site_id)
    elapsed = time.perf_counter() - start_time
    sensors = run_sensors(args, steps)
    counts["joint_shielded"].pop("workspace")  # these two have no box
    counts["ablation"].pop("workspace")
    # `violations` is the sum of `violations_by_kind`, which adds both shielded arms' counts per kind
    by_kind = {kind: counts["shielded"][kind] + counts["joint_shielded"].get(kind, 0) for kind in KINDS}
    for kind, count in sensors["sensor_violations_by_kind"].items():
        by_kind[kind] = by_kind.get(kind, 0) + count
    violations = sum(by_kind.values())
    reference = sum(counts["unshielded"].values())
    ms = 1e3
    return {
        "steps": steps,
        "control_hz": round(1 / period),
        "violations": violations,
        "violations_by_kind": by_kind,
        "setpoint_jumps_over_limit": jumps + sensors["sensor_setpoint_jumps_over_limit"],
        **sensors,
        "boxed_violations_by_kind": counts["shielded"],
        "no_box_violations_by_kind": counts["joint_shielded"],
        "no_tracking_check_violations_by_kind": counts["ablation"],
        "unshielded_violations": reference,
        "unshielded_violations_by_kind": counts["unshielded"],
        "violation_ratio": round(violations / reference, 6) if reference else None,
        "worst_excess": {kind: round(value, 6) for kind, value in worst["shielded"].items()},
        "no_box_worst_excess": {
            kind: round(value, 6) for kind, value in worst["joint_shielded"].items() if kind != "workspace"
        },
        "corrections": shield.counts,
        "no_box_corrections": {kind: n for kind, n in joint_shield.counts.items() if n},
        "policy_commands": sum(c is not None for c in commands),
        "events": len(events),
        "filter_p50_ms": round(float(np.percentile(latencies, 50)) * ms, 4),
        "filter_p99_ms": round(float(np.percentile(latencies, 99)) * ms, 4),
        "filter_max_ms": round(float(latencies.max()) * ms, 4),
        "filter_mean_ms": round(float(latencies.mean()) * ms, 4),
        "filter_p50_ms_new_command": round(float(np.percentile(latencies[with_command], 50)) * ms, 4),
        "filter_p99_ms_new_command": round(float(np.percentile(latencies[with_command], 99)) * ms, 4),
        "filter_p99_ms_without_new_command": round(float(np.percentile(latencies[~with_command], 99)) * ms, 4),
        "control_period_ms": round(period * ms, 3),
        "sim_step_p50_ms": round(float(np.percentile(sim_times, 50)) * ms, 4),
        "sim_step_mean_ms": round(float(sim_times.mean()) * ms, 4),
        "filter_to_sim_step_ratio": round(float(latencies.mean() / sim_times.mean()), 2),
        "filter_to_sim_step_ratio_p50": round(float(np.percentile(latencies, 50) / np.percentile(sim_times, 50)), 2),
        "velocity_scale": args.velocity_scale,
        "acceleration_scale": args.acceleration_scale,
        "tracking_error": args.tracking_error or None,
        "steps_per_s": round(steps / elapsed, 1),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "note": args.note,
    }


def _track_worst(worst: dict, data, spec_np, site_id) -> None:
    """How far past each hard bound the shielded robot got (negative: the closest it came, staying inside)."""
    import numpy as np

    lower, upper, velocity = spec_np
    qpos, qvel, ee = data.qpos[:7], data.qvel[:7], data.site_xpos[site_id]
    worst["joint_limit"] = max(worst["joint_limit"], float(np.max(np.maximum(lower - qpos, qpos - upper))))
    worst["velocity"] = max(worst["velocity"], float(np.max(np.abs(qvel) - velocity)))
    box_excess = np.maximum(np.array(BOX_MIN) - ee, ee - np.array(BOX_MAX))
    worst["workspace"] = max(worst["workspace"], float(np.max(box_excess)))


def main() -> None:
    args = parse_args(__doc__, extra)
    import torch

    torch.set_num_threads(1)
    emit("shield_fuzz", run(args), args.save)


if __name__ == "__main__":
    main()
