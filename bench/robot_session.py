"""A lab session on the simulated twin, everything over ROS 2 (Cyclone DDS on loopback) through the robot env and the
shield, as it would run against a real robot's drivers; each figure against the same thing in simulation, measured in
the same run.

- `record_episodes_per_min`: robotrl-record on the twin (hardware=sim_twin, teleop=joy) with a scripted person at a
  pad: a thread that watches the twin's scene (the true cube and tool, as a person sees them), asks pick's expert
  what to do, and publishes it as joy_node would (sticks past their deadzone, A toggling the gripper, Start once
  the cube is up). Episodes kept per minute of session; `record_kept` of `record_episodes`.
- `pick_success_twin`: pick's scripted expert fed the robot env's observation (tasks/expert.py; the cube tracked),
  judged by the twin's physics (the cube lifted `LIFT_HEIGHT` and still at the fingers). Goal >= 0.9 over 20
  episodes; `pick_success_sim` the same expert in simulation, `pick_twin_over_sim` their ratio.
- `peg_impedance_success_twin`: peg_insert's expert through `hardware.command=cartesian_pose` and the twin's
  Cartesian impedance controller, judged by the twin's physics (the tip `INSERT_DEPTH` into the hole). Goal >= 0.9
  over 20; `peg_success_sim` and `peg_twin_over_sim` beside it.
- `hand_success_ratio_twin`: null: hand_reorient has no reference policy (scripted or saved) to deploy on the hand
  twin yet; the hand itself runs on the twin (tests/test_robot_hand.py).
- `gripper_cmd_p99_ms`: from the robot env publishing a gripper command to the twin receiving it (both clocks are
  this process's), over the pick episodes. Goal <= 5 ms.
- `shield_violations`: counted from the twin's own state at every control period of every episode above: a joint
  beyond its hard limit or faster than its velocity limit, a finger beyond its range, the tool point more than
  `BOX_SLACK` outside the shield's workspace box. Goal 0.

    python bench/robot_session.py [--quick] [--episodes 20] [--save]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

RATE_HZ = 500.0  # the twin's and the robot env's control rate, as configs/hardware/sim_twin.yaml
BOX = {"workspace_min": [0.1, -0.6, 0.0], "workspace_max": [0.8, 0.6, 0.9]}  # the fingers reach the table
BOX_SLACK = 0.01  # m the tool may be outside the box (the box bounds setpoints; a compliant arm overshoots a little)
VELOCITY_SLACK = 1.05  # a joint at its velocity limit reads a little past it in a noisy finite difference


def extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=None, help="episodes per figure (20; --quick 3)")
    parser.add_argument("--domain", type=int, default=140, help="first ROS 2 domain id (three are used)")
    parser.add_argument("--note", default="", help="added to the JSON's note (what else ran on the machine)")


class Twin:
    """robotrl-sim-twin in a thread, its state audited every control period (`SafetyAudit`)."""

    def __init__(self, domain_id: int, **cfg):
        from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

        self.gripper_received: list[float] = []  # wall time each gripper command arrived
        self.twin = SimTwin(
            SimTwinConfig(rate_hz=RATE_HZ, domain_id=domain_id, report_interval=0, **cfg),
            on_command=self._on_command,
        )
        self.audit = SafetyAudit(self.twin)
        self.thread = threading.Thread(target=self.twin.run, daemon=True)

    def _on_command(self, kind: str, msg, received: float) -> None:
        if kind == "gripper":
            self.gripper_received.append(received)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.twin.stop()
        self.thread.join(timeout=5)
        self.twin.close()


class SafetyAudit:
    """Counts what a safe session never does, read from the twin's own state each time it publishes a joint state."""

    def __init__(self, twin):
        import mujoco
        from robotrl.hardware.sim_twin import load_robot_spec

        spec = load_robot_spec(twin.cfg.robot)
        model = twin.model
        joints = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name) for name in spec.joints]
        self.qpos, self.qvel = model.jnt_qposadr[joints], model.jnt_dofadr[joints]
        self.lower, self.upper = spec.position_lower.double().numpy(), spec.position_upper.double().numpy()
        self.speed = spec.velocity_limit.double().numpy() * VELOCITY_SLACK
        self.site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, spec.end_effector_site)
        self.fingers = []
        if spec.gripper is not None:
            ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name) for name in spec.gripper.joints]
            self.fingers = model.jnt_qposadr[ids]
            self.finger_range = sorted((spec.gripper.open, spec.gripper.closed))
        self.box_low, self.box_high = np.array(BOX["workspace_min"]), np.array(BOX["workspace_max"])
        self.counts = {"joint_limit": 0, "joint_speed": 0, "finger_range": 0, "workspace": 0}
        self.periods = 0
        self.active = False  # audited only while an episode runs (not while a person resets the scene)
        publish = twin.publish_joint_state

        def audited() -> None:
            if self.active:
                self.check(twin.data)
            publish()

        twin.publish_joint_state = audited

    def check(self, data) -> None:
        self.periods += 1
        q, qd = data.qpos[self.qpos], data.qvel[self.qvel]
        self.counts["joint_limit"] += int(((q < self.lower - 1e-3) | (q > self.upper + 1e-3)).any())
        self.counts["joint_speed"] += int((np.abs(qd) > self.speed).any())
        if len(self.fingers):
            fingers = data.qpos[self.fingers]
            low, high = self.finger_range
            self.counts["finger_range"] += int(((fingers < low - 1e-3) | (fingers > high + 1e-3)).any())
        tool = data.site_xpos[self.site]
        outside = np.maximum(self.box_low - tool, 0) + np.maximum(tool - self.box_high, 0)
        self.counts["workspace"] += int(np.linalg.norm(outside) > BOX_SLACK)


def hardware(domain_id: int, **changes):
    from robotrl.hardware.robot_env import RobotEnvConfig

    cfg = RobotEnvConfig(domain_id=domain_id, control_rate_hz=RATE_HZ, reset_timeout=20.0, **changes)
    cfg.shield = dict(BOX)
    cfg.scene_reset_topic, cfg.scene_timeout, cfg.scene_settle = "/scene/reset", 10.0, 0.2
    return cfg


def sim_success(task: str, episodes: int, seed: int) -> float:
    """The scripted expert's success rate in simulation, one episode per env."""
    import torch
    from robotrl.tasks import make_env
    from robotrl.tasks.configs import ArmTaskConfig

    env = make_env(ArmTaskConfig(name=task), num_envs=episodes)
    try:
        env.reset(seed=seed)
        won = torch.zeros(episodes, dtype=torch.bool)
        done = torch.zeros(episodes, dtype=torch.bool)
        while not done.all():
            result = env.step(env.task.expert_action())
            won |= result.success & ~done
            done |= result.terminated | result.truncated
        return float(won.float().mean())
    finally:
        env.close()


def expert_episodes(env, expert_class, task_cfg, episodes: int, audit: SafetyAudit, done) -> tuple[int, list[int]]:
    """(successes, steps of each success) of the task's expert fed the robot env's observation for `episodes`
    episodes, each judged by `done()` from the twin's physics after every step; the audit runs while they do."""
    import torch

    successes, steps = 0, []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        expert = expert_class(task_cfg.max_ee_step, 1)
        audit.active = True
        for step in range(task_cfg.episode_steps or 100):
            state = {key: torch.as_tensor(obs[key]).unsqueeze(0) for key in expert_class.reads}
            obs, *_ = env.step(expert.motion(state)[0].numpy())
            if done():
                successes += 1
                steps.append(step + 1)
                break
        audit.active = False
    return successes, steps


def pick_on_twin(episodes: int, domain_id: int) -> dict:
    from robotrl.hardware.deploy import make_robot_env
    from robotrl.hardware.sim_twin import ASSETS
    from robotrl.tasks import deploy_spec_for
    from robotrl.tasks.configs import ArmTaskConfig
    from robotrl.tasks.panda_pick_cube import CUBE_HALF, LIFT_HEIGHT, PickExpert

    pick = ArmTaskConfig(name="panda_pick_cube")
    with Twin(domain_id, model=str(ASSETS / "panda_pick_cube.xml"), objects=["cube"]) as twin:
        env = make_robot_env(hardware(domain_id, objects=["cube"]), deploy_spec_for(pick))
        sent: list[float] = []
        publisher = env.link.gripper_pub

        class Timed:  # the gripper's publisher, stamping each command as it goes out
            def publish(self, message):
                sent.append(time.time())
                publisher.publish(message)

        env.link.gripper_pub = Timed()
        body, tool = twin.twin._object_bodies["cube"], twin.audit.site

        def lifted() -> bool:
            cube, site = twin.twin.data.xpos[body], twin.twin.data.site_xpos[tool]
            return cube[2] - CUBE_HALF >= LIFT_HEIGHT and np.linalg.norm(cube - site) < 0.03

        try:
            successes, steps = expert_episodes(env, PickExpert, pick, episodes, twin.audit, lifted)
        finally:
            env.close()
        received = twin.gripper_received
        pairs = min(len(sent), len(received))  # reliable and in order on one topic: the i-th sent is the i-th heard
        latency = np.array(received[:pairs]) - np.array(sent[:pairs])
        return {
            "pick_success_twin": successes / episodes,
            "pick_steps_twin": round(float(np.mean(steps)), 1) if steps else None,
            "gripper_cmd_p99_ms": round(float(np.percentile(latency, 99)) * 1e3, 3) if pairs else None,
            "gripper_cmd_p50_ms": round(float(np.percentile(latency, 50)) * 1e3, 3) if pairs else None,
            "gripper_commands": pairs,
            "audit": twin.audit,
        }


def peg_on_twin(episodes: int, domain_id: int) -> dict:
    import mujoco
    from robotrl.hardware.deploy import make_robot_env
    from robotrl.hardware.sim_twin import ASSETS
    from robotrl.tasks import deploy_spec_for
    from robotrl.tasks.configs import ArmTaskConfig
    from robotrl.tasks.panda_peg_insert import HOLE_HALF_WIDTH, INSERT_DEPTH, PegExpert

    peg = ArmTaskConfig(name="panda_peg_insert")
    hole = np.array([0.5, 0.0, 0.04])  # the scene's hole: its rim's centre
    with Twin(domain_id, model=str(ASSETS / "panda_peg_insert.xml")) as twin:
        cfg = hardware(domain_id, command="cartesian_pose")
        env = make_robot_env(cfg, deploy_spec_for(peg), {"hole": hole.tolist()})
        tip_site = mujoco.mj_name2id(twin.twin.model, mujoco.mjtObj.mjOBJ_SITE, "peg_tip")

        def inserted() -> bool:
            tip = twin.twin.data.site_xpos[tip_site]
            return hole[2] - tip[2] >= INSERT_DEPTH and np.linalg.norm(tip[:2] - hole[:2]) < HOLE_HALF_WIDTH

        try:
            successes, steps = expert_episodes(env, PegExpert, peg, episodes, twin.audit, inserted)
        finally:
            env.close()
        return {
            "peg_impedance_success_twin": successes / episodes,
            "peg_steps_twin": round(float(np.mean(steps)), 1) if steps else None,
            "audit": twin.audit,
        }


class JoyPerson(threading.Thread):
    """A person at a pad, scripted: watches the twin's scene, asks pick's expert what to do and publishes it as joy_node
    does (axes negated from SDL's, triggers resting at 1), 20 Hz: sticks for x and y, the triggers for z, A toggling
    the gripper when the expert wants it the other way, Start held briefly once the cube is up and in hand."""

    DEADZONE = 0.1  # the joy teleop's (hardware/teleop/ros_topics.py): a stick is pushed past it

    def __init__(self, twin, domain_id: int):
        super().__init__(daemon=True)
        from robotrl.hardware.ros2.bridge import make_bridge
        from robotrl.hardware.ros2.msgs import Joy
        from robotrl.tasks.configs import ArmTaskConfig
        from robotrl.tasks.panda_pick_cube import PickExpert

        self.twin, self.Joy = twin, Joy
        self.bridge = make_bridge("dds", domain_id=domain_id)
        self.publisher = self.bridge.publisher("/joy", Joy, "sensor_data")
        self.expert = PickExpert(ArmTaskConfig(name="panda_pick_cube").max_ee_step, 1)
        self.closed = False  # the pad's gripper toggle, as the teleop keeps it (starts open)
        self.stop = threading.Event()

    def _stick(self, value: float) -> float:
        """The stick position whose deadzone-rescaled reading is `value`."""
        if abs(value) < 1e-3:
            return 0.0
        return float(np.sign(value) * (self.DEADZONE + abs(value) * (1.0 - self.DEADZONE)))

    def run(self) -> None:
        import torch
        from robotrl.tasks.panda_pick_cube import CUBE_HALF, LIFT_HEIGHT

        data, body, site = self.twin.twin.data, self.twin.twin._object_bodies["cube"], self.twin.audit.site
        toggle_hold = start_hold = 0
        while not self.stop.is_set():
            cube, tool = data.xpos[body].copy(), data.site_xpos[site].copy()
            if np.linalg.norm(cube[:2] - tool[:2]) > 0.05 and tool[2] > 0.3:
                self.expert.reset(torch.zeros(1, dtype=torch.long))  # at home: a new episode, start over
            state = {"cube_pos": torch.from_numpy(cube[None]).float(), "ee_pos": torch.from_numpy(tool[None]).float()}
            motion = self.expert.motion(state)[0].numpy()
            wants_closed = motion[3] > 0
            buttons = [0] * 11
            if wants_closed != self.closed and toggle_hold == 0:
                toggle_hold, self.closed = 2, wants_closed  # a press held for two messages, then released
            if toggle_hold > 0:
                buttons[0], toggle_hold = int(toggle_hold > 1), toggle_hold - 1
            lifted = cube[2] - CUBE_HALF >= LIFT_HEIGHT and np.linalg.norm(cube - tool) < 0.03
            if lifted and start_hold == 0:
                start_hold = 4
            if start_hold > 0:
                buttons[7], start_hold = int(start_hold > 2), start_hold - 1
            z = motion[2]
            axes = [
                self._stick(motion[1]),  # left stick x (joy: left positive): +y
                self._stick(motion[0]),  # left stick y (joy: up positive): +x
                1.0 - 2.0 * abs(self._stick(min(z, 0.0))),  # left trigger: down
                0.0,
                0.0,
                1.0 - 2.0 * abs(self._stick(max(z, 0.0))),  # right trigger: up
            ]
            self.publisher.publish(self.Joy(axes=[float(a) for a in axes], buttons=buttons))
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=5)
        self.bridge.close()


def record_on_twin(episodes: int, domain_id: int, out: Path) -> dict:
    from robotrl.hardware.sim_twin import ASSETS
    from robotrl.tasks.configs import ArmTaskConfig

    from robotrl.record import RecordConfig, record

    pick = ArmTaskConfig(name="panda_pick_cube")
    with Twin(domain_id, model=str(ASSETS / "panda_pick_cube.xml"), objects=["cube"]) as twin:
        person = JoyPerson(twin, domain_id)
        person.start()
        twin.audit.active = True  # the scene resets between episodes are the twin's own: audited throughout
        try:
            cfg = RecordConfig(
                task=pick,
                teleop="joy",
                teleop_domain_id=domain_id,
                episodes=episodes,
                max_attempts=2 * episodes,
                hardware=hardware(domain_id, objects=["cube"]),
            )
            start = time.monotonic()
            summary = record(cfg, out)
            minutes = (time.monotonic() - start) / 60.0
        finally:
            person.close()
    return {
        "record_episodes_per_min": round(summary["kept_now"] / minutes, 2),
        "record_kept": summary["kept_now"],
        "record_episodes": summary["attempts"],
        "record_stopped": summary["stopped"],
        "audit": twin.audit,
    }


def run(args: argparse.Namespace) -> dict:
    import os
    import tempfile

    episodes = args.episodes or (3 if args.quick else 20)
    load_before = os.getloadavg()[0]
    figures: dict = {"episodes": episodes, "rate_hz": RATE_HZ}
    audits = []
    pick = pick_on_twin(episodes, args.domain)
    audits.append(pick.pop("audit"))
    figures.update(pick)
    figures["pick_success_sim"] = sim_success("panda_pick_cube", episodes, seed=0)
    figures["pick_twin_over_sim"] = round(figures["pick_success_twin"] / max(figures["pick_success_sim"], 1e-9), 3)
    peg = peg_on_twin(episodes, args.domain + 1)
    audits.append(peg.pop("audit"))
    figures.update(peg)
    figures["peg_success_sim"] = sim_success("panda_peg_insert", episodes, seed=0)
    figures["peg_twin_over_sim"] = round(
        figures["peg_impedance_success_twin"] / max(figures["peg_success_sim"], 1e-9), 3
    )
    with tempfile.TemporaryDirectory() as scratch:
        recorded = record_on_twin(episodes, args.domain + 2, Path(scratch) / "demos")
    audits.append(recorded.pop("audit"))
    figures.update(recorded)
    figures["hand_success_ratio_twin"] = None
    counts = {kind: sum(audit.counts[kind] for audit in audits) for kind in audits[0].counts}
    figures["shield_violations"] = sum(counts.values())
    figures["shield_violations_by_kind"] = counts
    figures["audited_periods"] = sum(audit.periods for audit in audits)
    figures["goals_met"] = {
        "pick_success_twin>=0.9": figures["pick_success_twin"] >= 0.9,
        "peg_impedance_success_twin>=0.9": figures["peg_impedance_success_twin"] >= 0.9,
        "gripper_cmd_p99_ms<=5": figures["gripper_cmd_p99_ms"] is not None and figures["gripper_cmd_p99_ms"] <= 5,
        "shield_violations==0": figures["shield_violations"] == 0,
    }
    load_after = os.getloadavg()[0]
    figures["note"] = (
        f"2 CPUs, 1-minute load {load_before:.2f} before and {load_after:.2f} after; hand_success_ratio_twin: no "
        "reference hand_reorient policy yet" + (f"; {args.note}" if args.note else "")
    )
    figures["quick"] = bool(args.quick)
    return figures


def main() -> None:
    from common import emit, parse_args

    args = parse_args(__doc__, extra)
    emit("robot_session", run(args), args.save)


if __name__ == "__main__":
    main()
