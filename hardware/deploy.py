"""`robotrl-deploy run=<run dir> hardware=sim_twin`: a trained policy on a robot, through the bridge and shield.

    robotrl-sim-twin robot=panda &                                     # or a real robot's driver
    robotrl-deploy run=runs/reach hardware=sim_twin episodes=3 +goal.target=[0.5,0.1,0.3]  # or drawn
    robotrl-deploy run=runs/reach hardware=panda duration=60 record=/data/session1

The run's config names the simulated task the policy was trained on; its controller settings (control
kind, step sizes, relative_frame, gripper, episode length) and observation layout are taken from it, and
the robot env (hardware/robot_env.py) produces the same observation keys and shapes. Task entries a robot
cannot measure come from `goal` (fixed values) and `relative_goal` (`goal - ee_pos`; `to_target` is
inferred from `target`); goals the task draws per episode (reach's target, push's goal around the puck)
and not given are drawn at each reset as simulation draws them, and tracked objects are waited for in the
task's start regions (`hardware.scene_timeout`). The policy runs deterministically at the hardware config's
policy rate; an exception in it, or a NaN action, sends nothing new (the shield holds). `record=<dir>`
writes the session's joint states, commands and e-stop messages to a rosbag2 bag (MCAP storage, ROS 2 CDR)
that `ros2 bag` reads.
A JSON summary (steps, shield corrections by kind, observation ages) is printed last.
"""

from __future__ import annotations

import json
import logging
import math
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from robotrl.hardware.estop import subscribe_estop
from robotrl.hardware.robot_env import RobotEnv, RobotEnvConfig, SceneResetError, object_entries

from robotrl.core.env import EnvCancelled

log = logging.getLogger(__name__)

# Observation entries that are a goal minus the tool point, by the goal they are relative to.
KNOWN_RELATIVE = {"to_target": "target"}
# Entries that are a goal minus a point held by the tool (facts["held"]): entry -> (goal, held point).
HELD_RELATIVE = {"tip_to_hole": ("hole", "peg_tip")}
# Entries the simulated tasks hold fixed through an episode (a goal), so a fixed value on a robot is right.
TASK_GOALS = ("target", "hole", "goal")


@dataclass
class DeployConfig:
    run: str = "???"  # a robotrl-train or robotrl-learner run directory (config.yaml and checkpoints/)
    hardware: RobotEnvConfig = field(default_factory=RobotEnvConfig)
    episodes: int = 1
    duration: float | None = None  # seconds; stops the session (mid-episode) when it passes
    episode_steps: int | None = None  # None: the trained task's
    goal: dict[str, list[float]] = field(default_factory=dict)  # e.g. +goal.target=[0.5,0.0,0.3]
    relative_goal: dict[str, str] = field(default_factory=dict)  # e.g. +relative_goal.to_target=target
    device: str = "cpu"
    record: str | None = None  # rosbag2 directory to create (MCAP)

    def validate(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0 seconds or null, got {self.duration}")
        if self.episode_steps is not None and self.episode_steps < 1:
            raise ValueError(f"episode_steps must be >= 1, got {self.episode_steps}")
        if self.record is not None and Path(self.record).exists():
            raise FileExistsError(f"record={self.record!r} exists already; give a new directory")


class BagRecorder:
    """Writes every message of some bridge topics to a rosbag2 bag with MCAP storage, as ROS 2 CDR (the bytes
    our messages put on the wire). Messages are written from the bridge's receive thread, under a lock.
    `estop_topic` is heard as the robot env hears it (`subscribe_estop`: latched and default-QoS publishers)."""

    def __init__(self, bridge, path: str | Path, topics: dict[str, tuple[type, str]], estop_topic: str | None = None):
        from robotrl.hardware.ros2.msgs import ros_type_name
        from rosbags.rosbag2 import StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        typestore = get_typestore(Stores.ROS2_HUMBLE)
        self._lock = threading.Lock()
        self._closed = False
        self.counts: dict[str, int] = {}
        self._subscriptions = []
        for topic, (msg_type, qos) in topics.items():
            connection = self._writer.add_connection(topic, ros_type_name(msg_type), typestore=typestore)
            self.counts[topic] = 0
            self._subscriptions.append(bridge.subscription(topic, msg_type, qos, self._writer_for(topic, connection)))
        if estop_topic:
            from robotrl.hardware.ros2.msgs import Bool

            connection = self._writer.add_connection(estop_topic, ros_type_name(Bool), typestore=typestore)
            self.counts[estop_topic] = 0
            write = self._writer_for(estop_topic, connection)
            self._subscriptions += subscribe_estop(bridge, estop_topic, lambda received: write(received.msg))

    def _writer_for(self, topic: str, connection):
        def write(msg) -> None:
            data = msg.serialize()
            with self._lock:
                if self._closed:
                    return
                self._writer.write(connection, time.time_ns(), data)
                self.counts[topic] += 1

        return write

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()


def load_policy(run: str | Path, device: str = "cpu"):
    """(agent, train config, the simulated env's observation spec and action dim, task facts) of a run."""
    from robotrl.agents import make_agent
    from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
    from robotrl.runtime.loop import resolve_device
    from robotrl.runtime.run_config import load_run_config

    run_dir = Path(run)
    train_cfg = load_run_config(run_dir)  # robotrl-train's run, or robotrl-learner's (a fine-tuning session)
    facts, obs_spec, action_dim = task_facts(train_cfg)
    agent = make_agent(train_cfg.agent, obs_spec, action_dim, resolve_device(device))
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    load_checkpoint(ckpt, agent, replay=None, restore_rng=False)
    agent.eval()
    return agent, train_cfg, obs_spec, action_dim, {**facts, "checkpoint": ckpt.name}


def task_facts(train_cfg) -> tuple[dict[str, Any], dict, int]:
    """(controller facts, observation spec, action dim) of the simulated task `train_cfg` (a train or actor
    config: `.task` and `.agent`) names, read from one env of it."""
    from robotrl.runtime.loop import frame_stack_of, make_training_env

    env = make_training_env(train_cfg, num_envs=1)
    try:
        inner = env
        while not hasattr(inner, "task") and hasattr(inner, "env"):  # under FrameStack and other wrappers
            inner = inner.env
        task = getattr(inner, "task", None)
        if task is None or not hasattr(task, "controller"):
            raise ValueError(f"task {train_cfg.task.name!r} is not a simulated arm task; a robot runs those")
        facts = {
            "frame_stack": frame_stack_of(env),
            "control": task.controller.kind,
            "max_ee_step": task.cfg.max_ee_step,
            "max_joint_step": task.cfg.max_joint_step,
            "relative_frame": bool(task.controller.relative_frame),
            "gripper_action": bool(task.has_gripper),
            # a task that never commands its gripper keeps it shut (the actuator's target stays 0: closed)
            "gripper_hold": (
                float(task.robot.gripper.closed) if task.robot.gripper is not None and not task.has_gripper else None
            ),
            "episode_steps": task.episode_steps,
            "robot": task.robot.name,
            "cameras": [k.removeprefix("pixels_") for k in env.obs_spec if k.startswith("pixels_")],
            "image_size": train_cfg.task.image_size,
            # the task's reward and success from observation entries alone (None: it needs more, e.g. contacts)
            "score": task.score if getattr(task, "score_reads", ()) else None,
            "score_reads": list(getattr(task, "score_reads", ())),
            # points fixed to the tool, as offsets in its frame measured in the scene (peg_insert's peg tip)
            "held": _held_offsets(env, task),
            # where a person puts the objects back between episodes (the boxes reset_scene starts them in),
            # and the goals drawn per episode as reset_scene draws them (around those objects where it does)
            "start_regions": {name: [low.tolist(), high.tolist()] for name, (low, high) in task.start_regions.items()},
            "drawn_goals": list(task.drawn_goals),
            "draw_goals": task.draw_goals if task.drawn_goals else None,
        }
        return facts, dict(env.obs_spec), env.action_dim
    finally:
        env.close()


def _goal_sampler(draw, names: list[str]):
    """The robot env's goal sampler, {object: position [3]} -> {goal: value}, from the task's batched draw."""

    def sample(objects: dict[str, np.ndarray], generator: torch.Generator) -> dict[str, np.ndarray]:
        batch = {name: torch.as_tensor(at, dtype=torch.float32).reshape(1, 3) for name, at in objects.items()}
        goals = draw(1, batch, generator)
        return {key: goals[key][0].numpy() for key in names}

    return sample


def _held_offsets(env, task) -> dict[str, list[float]]:
    """The task's held sites in the tool point's frame, measured after a reset has put the scene in place."""
    if not getattr(task, "held_sites", ()):
        return {}
    env.reset(seed=0)
    return {site: [round(float(v), 6) for v in offset[0]] for site, offset in task.held_offsets().items()}


def make_robot_env(
    hw: RobotEnvConfig,
    obs_spec: dict,
    action_dim: int,
    facts: dict,
    goal: dict[str, list[float]] | None = None,
    relative_goal: dict[str, str] | None = None,
    episode_steps: int | None = None,
    goal_option: str = "goal",
) -> RobotEnv:
    """The robot env for a policy: the trained task's controller, and its observation keys and shapes
    (those a robot measures, the goals given); anything missing is an error naming it."""
    if hw.robot != facts["robot"]:
        raise ValueError(f"the policy was trained for robot {facts['robot']!r}, hardware.robot is {hw.robot!r}")
    if facts["cameras"]:
        hw.cameras, hw.image_size = facts["cameras"], facts["image_size"]
    given = {k: list(v) for k, v in (goal or {}).items()}
    # goals the task draws per episode that are not given and the policy observes: the robot env draws them at
    # each reset (zeros until it has drawn its first)
    drawn = [k for k in facts.get("drawn_goals", []) if k not in given and k in obs_spec]
    goal = {**{k: [0.0] * obs_spec[k].shape[0] for k in drawn}, **given}
    relative = dict(relative_goal or {})
    for key, base in KNOWN_RELATIVE.items():
        if key in obs_spec and key not in relative and key not in goal and base in goal:
            relative[key] = base
    by_objects = object_entries(hw.objects, {k: (len(v),) for k, v in goal.items()})
    object_goals = {what for key, (_, what) in by_objects.items() if key in obs_spec and what in goal}
    unused_goals = set(goal) - set(obs_spec) - {base for key, base in relative.items() if key in obs_spec}
    held = {k: v for k, v in facts.get("held", {}).items() if k in obs_spec}
    held_relative = {
        key: list(pair)
        for key, pair in HELD_RELATIVE.items()
        if key in obs_spec and pair[0] in goal and pair[1] in held
    }
    unused_goals -= object_goals | {goal_name for goal_name, _ in held_relative.values()}
    extra = sorted(unused_goals | (set(relative) - set(obs_spec)))
    if extra:
        raise ValueError(f"the policy does not observe {extra}; remove them from {goal_option}")
    env = RobotEnv(
        hw,
        control=facts["control"],
        max_ee_step=facts["max_ee_step"],
        max_joint_step=facts["max_joint_step"],
        relative_frame=facts.get("relative_frame", False),
        gripper_action=facts["gripper_action"],
        gripper_hold=facts.get("gripper_hold"),
        held=held,
        held_relative=held_relative,
        gripper_obs="gripper" in obs_spec,
        goal=goal,
        relative_goal=relative,
        episode_steps=episode_steps or facts["episode_steps"],
        frame_stack=facts.get("frame_stack", 1),
        observe=list(obs_spec),
        start_regions=facts.get("start_regions", {}),
        goal_sampler=_goal_sampler(facts["draw_goals"], drawn) if drawn else None,
    )
    try:
        spaces = env.observation_space.spaces
        missing = sorted(set(obs_spec) - set(spaces))
        if missing:
            raise ValueError(
                f"the policy observes {missing}, which the robot does not measure: "
                + _how_to_give(missing, obs_spec, hw, goal, goal_option)
            )
        wrong = {k: (tuple(spaces[k].shape), tuple(s.shape)) for k, s in obs_spec.items() if spaces[k].shape != s.shape}
        if wrong:
            raise ValueError(f"observation shapes (robot, policy) differ: {wrong}")
        if env.action_dim != action_dim:
            raise ValueError(f"the policy acts in {action_dim} dimensions, the robot env in {env.action_dim}")
    except Exception:
        env.close()
        raise
    return env


def _object_named(key: str) -> str | None:
    """The tracked object an entry would be named after (cube_pos, cube_quat, to_cube, puck_to_goal), or None;
    goal-relative entries (to_target, tip_to_hole) are told apart by the caller first."""
    for pattern in (r"(\w+)_(?:pos|quat)", r"to_(\w+)", r"(\w+?)_to_\w+"):
        match = re.fullmatch(pattern, key)
        if match:
            return match.group(1)
    return None


def _how_to_give(missing: list[str], obs_spec: dict, hw: RobotEnvConfig, goal: dict, goal_option: str) -> str:
    """What to add for `missing` observation entries: tracked objects for an object's entries, fixed values
    for the goals a task holds through an episode (and the goal an entry is measured against), and which
    entries a robot cannot give at all (a fixed value for an entry that moves would be a wrong observation)."""
    objects: list[str] = []
    fixed: dict[str, int] = {}
    unmeasured: list[str] = []
    for key in missing:
        name = _object_named(key)
        if key in KNOWN_RELATIVE:
            fixed[KNOWN_RELATIVE[key]] = obs_spec[key].shape[0]
        elif key in HELD_RELATIVE:
            fixed[HELD_RELATIVE[key][0]] = obs_spec[key].shape[0]
        elif key in TASK_GOALS:
            fixed[key] = obs_spec[key].shape[0]
        elif name is None:
            unmeasured.append(key)
        else:
            if name not in hw.objects and name not in objects:
                objects.append(name)
            against = re.fullmatch(rf"{name}_to_(\w+)", key)
            if against and against.group(1) not in goal:
                fixed[against.group(1)] = obs_spec[key].shape[0]
    if unmeasured:
        return f"a robot does not measure {unmeasured} (state that moves, not a goal): this policy cannot run on it"
    hints = []
    if objects:
        topics = ", ".join(hw.object_topic.format(name=name) for name in objects)
        hints.append(
            f"track {objects} with hardware.objects=[{','.join([*hw.objects, *objects])}] "
            f"(a geometry_msgs/PoseStamped each, in the arm's base frame, on {topics})"
        )
    if fixed:
        values = {key: ",".join("xyzw"[:size]) if size <= 4 else "..." for key, size in fixed.items()}
        hints.append("give " + " ".join(f"+{goal_option}.{k}=[{v}]" for k, v in values.items()))
        named_twice = sorted(set(fixed) & set(hw.objects))
        if named_twice:
            hints.append(
                f"the policy reads {named_twice} as goals, not tracked objects: remove them from hardware.objects"
            )
    return "; ".join(hints) or f"check hardware.objects {list(hw.objects)} and {goal_option} (a goal has 1-3 values)"


def run(cfg: DeployConfig, stop: threading.Event | None = None) -> dict[str, Any]:
    """Deploy `cfg.run`'s policy for `cfg.episodes` episodes (or until `cfg.duration` or `stop`); the summary."""
    from robotrl.hardware.ros2.msgs import Bool, Float64MultiArray, JointState, PoseStamped

    cfg.validate()
    stop = stop or threading.Event()
    agent, _, obs_spec, action_dim, facts = load_policy(cfg.run, cfg.device)
    env = make_robot_env(cfg.hardware, obs_spec, action_dim, facts, cfg.goal, cfg.relative_goal, cfg.episode_steps)
    recorder = None
    summary: dict[str, Any] = {"checkpoint": facts["checkpoint"], "control": facts["control"]}
    steps = episodes = policy_errors = 0
    start = time.monotonic()
    try:
        if cfg.record is not None:
            topics = {
                env.topics["joint_states"]: (JointState, env.cfg.state_qos),
                env.topics["commands"]: (Float64MultiArray, env.cfg.command_qos),
            }
            if "gripper" in env.topics:
                topics[env.topics["gripper"]] = (Float64MultiArray, env.cfg.command_qos)
            if "estop_ack" in env.topics:
                topics[env.topics["estop_ack"]] = (Bool, "default")
            if "scene_reset" in env.topics:  # when the session asked for the scene to be put back
                topics[env.topics["scene_reset"]] = (Bool, "default")
            for name in env.tracked_objects:  # the poses the policy saw
                topics[env.topics[f"object/{name}"]] = (PoseStamped, "sensor_data")
            recorder = BagRecorder(env.bridge, cfg.record, topics, env.topics.get("estop"))
        device = agent.device
        agent.reset_evaluation(1)
        while episodes < cfg.episodes and not stop.is_set():
            try:
                obs, _ = env.reset(options={"cancel": stop})
            except EnvCancelled:  # Ctrl-C while waiting for the scene
                break
            except SceneResetError as error:  # nobody put the objects back: the session ends, its summary kept
                log.error("deploy: %s", error)
                summary["ended"] = str(error)
                break
            while True:
                try:
                    batch = {k: torch.as_tensor(v).unsqueeze(0).to(device) for k, v in obs.items()}
                    with torch.no_grad():
                        action = agent.act(batch, deterministic=True)[0].cpu().numpy()
                except Exception:
                    policy_errors += 1
                    log.exception("deploy: the policy raised; the robot holds (no new command)")
                    action = np.full(env.action_dim, np.nan)
                obs, _, terminated, truncated, _info = env.step(action)
                steps += 1
                agent.advance_evaluation(torch.tensor([terminated or truncated]))
                out_of_time = cfg.duration is not None and time.monotonic() - start >= cfg.duration
                if terminated or truncated or out_of_time or stop.is_set():
                    break
            episodes += 1
            if cfg.duration is not None and time.monotonic() - start >= cfg.duration:
                break
    finally:
        env.close()
        if recorder is not None:
            recorder.close()
    ages = np.asarray(env.ages) * 1e3
    summary.update(
        episodes=episodes,
        steps=steps,
        seconds=round(time.monotonic() - start, 3),
        policy_errors=policy_errors,
        shield_corrections={k.removeprefix("safety/"): v for k, v in sorted(env.totals.items())},
        observation_age_ms={
            "p50": _round(np.percentile(ages, 50)) if ages.size else None,
            "p99": _round(np.percentile(ages, 99)) if ages.size else None,
            "max": _round(ages.max()) if ages.size else None,
        },
        watchdog={
            "joint_state_period_ms": _round(env.state_period * 1e3) if env.state_period else None,
            "hold_after_ms": _round(env.shield.config.hold_after_s * 1e3),
            "oldest_state_tracked_ms": _round(env.max_tracked_state_age * 1e3),
            "stalls": len(env.stall_reactions),  # times the joint states stopped long enough to hold
        },
        **{k: v for k, v in sorted(env.stats.items())},
    )
    if recorder is not None:
        summary["record"] = {"path": str(recorder.path), "messages": recorder.counts}
    return summary


def _round(value: float) -> float:
    return round(float(value), 3) if math.isfinite(value) else float(value)


def register_config() -> None:
    """Registers `deploy_schema` with Hydra (done by main; tools that compose the config call it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="deploy_schema", node=DeployConfig)


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    from robotrl.cli_errors import reports_errors
    from robotrl.config import strict_object

    register_config()

    @hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="deploy")
    @reports_errors("robotrl-deploy")
    def _hydra_main(cfg: DictConfig) -> None:
        deploy_cfg: DeployConfig = strict_object(DeployConfig, cfg)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        print(json.dumps({"deploy": run(deploy_cfg, stop)}), flush=True)

    _hydra_main()


if __name__ == "__main__":
    main()
