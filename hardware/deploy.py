"""`robotrl-deploy run=<run dir> hardware=sim_twin`: a trained policy on a robot, through the bridge and shield.

    robotrl-sim-twin robot=panda &                                     # or a real robot's driver
    robotrl-deploy run=runs/reach hardware=sim_twin episodes=3 +goal.target=[0.5,0.1,0.3]  # or drawn
    robotrl-deploy run=runs/reach hardware=panda duration=60 record=/data/session1
    robotrl-deploy policy=runs/reach/bundles/step_000100000_onnx hardware=panda   # an exported bundle

`policy=<bundle>` (robotrl-export's, docs/sim2real.md) runs the bundle's graph (onnxruntime; torch for a pt2
program) instead of the run's checkpoint: its files are checked against the manifest's sha256 and its deploy spec
against the graph before a robot env exists (robotrl/core/policy_bundle.py), then everything below applies to it
unchanged.

The run's deploy spec (its deploy_spec.json, robotrl/core/deploy_spec.py, written when the run started) gives
the controller settings (control kind, step sizes, relative_frame, gripper, episode length) and every
observation entry with where a robot gets it; the robot env (hardware/robot_env.py) produces the same keys and
shapes, and nothing simulated is built (hardware/deployment.py loads the run; a run from before deploy specs
gets one derived from its config.yaml once). A spec the robot config cannot serve (another robot, a control kind
or camera it lacks, objects not tracked) is refused by entry before anything moves. Goals come from `goal`
(fixed values; `relative_goal` may name extra `goal - ee_pos` entries); goals the task draws per episode
(reach's target, push's goal around the puck) and not given are drawn at each reset as simulation draws them,
and tracked objects are waited for in the task's start regions (`hardware.scene_timeout`). The policy runs
deterministically at the hardware config's policy rate; an exception in it, or a NaN action, sends nothing new
(the shield holds). `record=<dir>` writes the session's joint states, commands and e-stop messages to a rosbag2
bag (MCAP storage, ROS 2 CDR) that `ros2 bag` reads, and what the policy saw and did at each step (its deploy spec,
episode starts and ends, every observation entry, camera frames as sensor_msgs/Image, with `record_compressed=true`
also as PNG sensor_msgs/CompressedImage, every action; hardware/bag_recording.py, topics in hardware/bag_dataset.py),
which `robotrl-bag-to-dataset` turns into an episode dataset.
A JSON summary (steps, shield corrections by kind, observation ages) is printed last.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from robotrl.hardware.bag_recording import BagRecorder, PolicyStepRecorder
from robotrl.hardware.deployment import load_bundle_policy, load_deploy_spec, load_policy
from robotrl.hardware.robot_env import RobotEnv, RobotEnvConfig, SceneResetError
from robotrl.hardware.robot_observation import ObjectPart
from robotrl.tasks import task_functions

from robotrl.cli_errors import exits_on_error, reports_errors
from robotrl.config import strict_object
from robotrl.core.deploy_spec import DeploySpec
from robotrl.core.env import EnvCancelled
from robotrl.core.policy_bundle import read_manifest
from robotrl.core.robot_spec import load_robot_spec
from robotrl.runtime.run_config import run_config_file

log = logging.getLogger(__name__)

__all__ = [
    "BagRecorder",
    "DeployConfig",
    "PolicyStepRecorder",
    "load_deploy_spec",
    "load_policy",
    "make_robot_env",
    "run",
]

NO_POLICY = "give the policy to deploy as run=<run dir> or as policy=<bundle dir>, one of them"


@dataclass
class DeployConfig:
    run: str | None = None  # a robotrl-train or robotrl-learner run directory (config.yaml and checkpoints/)
    policy: str | None = None  # or a policy bundle directory (robotrl-export's): onnxruntime, or torch for pt2
    hardware: RobotEnvConfig = field(default_factory=RobotEnvConfig)
    episodes: int = 1
    duration: float | None = None  # seconds; stops the session (mid-episode) when it passes
    episode_steps: int | None = None  # None: the trained task's
    goal: dict[str, list[float]] = field(default_factory=dict)  # e.g. +goal.target=[0.5,0.0,0.3]
    relative_goal: dict[str, str] = field(default_factory=dict)  # e.g. +relative_goal.to_target=target
    device: str = "cpu"
    record: str | None = None  # rosbag2 directory to create (MCAP)
    record_compressed: bool = False  # also write each camera frame as PNG (sensor_msgs/CompressedImage; OpenCV)

    def validate(self) -> None:
        if (self.run is None) == (self.policy is None):
            raise ValueError(f"{NO_POLICY}: got run={self.run!r}, policy={self.policy!r}")
        if self.policy is not None and self.device != "cpu":
            raise ValueError(f"device={self.device!r}: a policy bundle runs on the CPU (onnxruntime, or torch for pt2)")
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be > 0 seconds or null, got {self.duration}")
        if self.episode_steps is not None and self.episode_steps < 1:
            raise ValueError(f"episode_steps must be >= 1, got {self.episode_steps}")
        if self.record is not None and Path(self.record).exists():
            raise FileExistsError(f"record={self.record!r} exists already; give a new directory")
        if self.record_compressed and self.record is None:
            raise ValueError("record_compressed=true compresses the recorded camera frames: give record=<dir> too")


def _goal_sampler(draw, names: list[str]):
    """The robot env's goal sampler, {object: position [3]} -> {goal: value}, from the task's batched draw."""

    def sample(objects: dict[str, np.ndarray], generator: torch.Generator) -> dict[str, np.ndarray]:
        batch = {name: torch.as_tensor(at, dtype=torch.float32).reshape(1, 3) for name, at in objects.items()}
        goals = draw(1, batch, generator)
        return {key: goals[key][0].numpy() for key in names}

    return sample


def check_hardware(spec: DeploySpec, hw: RobotEnvConfig) -> None:
    """ValueError naming the entry where the robot config `hw` cannot run a policy of `spec`: another robot, a
    control kind or gripper it does not offer, joint entries of another size, a camera it lacks. Checked before
    a robot env exists, so nothing has moved."""
    if hw.robot != spec.robot:
        raise ValueError(f"the policy was trained for robot {spec.robot!r}, hardware.robot is {hw.robot!r}")
    robot = load_robot_spec(hw.robot)
    if spec.control == "ee_delta" and robot.end_effector_site is None:
        raise ValueError(f"the policy acts with control=ee_delta; robot {hw.robot!r} does not offer it (no tool point)")
    grips = [k for k, e in spec.entries("joint_state").items() if e.of == "gripper"]
    if (spec.gripper_action or grips) and (robot.gripper is None or not hw.gripper_controller):
        uses = "moves the gripper (gripper_action)" if spec.gripper_action else f"observes {grips}"
        raise ValueError(
            f"the policy {uses}; robot {hw.robot!r} has no gripper or hardware.gripper_controller is empty"
        )
    n = len(robot.joints)
    for key, entry in spec.entries("joint_state").items():
        if entry.of != "gripper" and entry.shape != (n,):
            raise ValueError(f"observations.{key} holds {list(entry.shape)} joint values; robot {hw.robot!r} has {n}")
    arm_dim = 3 if spec.control == "ee_delta" else n
    if spec.action_dim != arm_dim + int(spec.gripper_action):
        raise ValueError(
            f"the policy acts in {spec.action_dim} dimensions; {spec.control} on robot {hw.robot!r} takes "
            f"{arm_dim + int(spec.gripper_action)}"
        )
    lacking = [camera for camera in spec.cameras if camera not in hw.cameras]
    if lacking:
        keys = sorted(k for k, e in spec.entries("camera").items() if e.of in lacking)
        raise ValueError(
            f"the policy observes {keys} from cameras {lacking}, which hardware.cameras {list(hw.cameras)} lacks: "
            f"add them (hardware.cameras=[{','.join([*hw.cameras, *lacking])}], on {hw.camera_topic})"
        )


def warn_on_crops(spec: DeploySpec, hw: RobotEnvConfig) -> None:
    """Log a warning for each camera whose crop on the robot (`hardware.camera_crops`) is not the one the policy
    trained with (`task.camera_crops`, in the spec's task config): it would see another part of the picture."""
    trained = spec.task_config.get("camera_crops") or {}
    for camera in spec.cameras:
        want, have = trained.get(camera), hw.camera_crops.get(camera)
        same = (want is None and have is None) or (
            want is not None
            and have is not None
            and len(want) == len(have)
            and all(math.isclose(float(a), float(b), abs_tol=1e-6) for a, b in zip(want, have, strict=True))
        )
        if not same:
            log.warning(
                "camera %s: the policy was trained on crop %s (task.camera_crops), hardware.camera_crops gives %s: "
                "the policy sees another part of the picture than in training",
                camera,
                list(want) if want is not None else "none (the whole frame)",
                list(have) if have is not None else "none (the whole frame)",
            )


def make_robot_env(
    hw: RobotEnvConfig,
    spec: DeploySpec,
    goal: dict[str, list[float]] | None = None,
    relative_goal: dict[str, str] | None = None,
    episode_steps: int | None = None,
    goal_option: str = "goal",
) -> RobotEnv:
    """The robot env for a policy of `spec`: its controller, and its observation keys and shapes (those a robot
    measures, the goals given or drawn). Anything the robot config cannot give is refused by name before the
    robot env is built (`check_hardware`, `_robot_env_args`)."""
    check_hardware(spec, hw)
    if spec.policy_rate_hz is not None and not math.isclose(hw.policy_rate_hz, spec.policy_rate_hz):
        log.warning(
            "the policy acted at %g Hz in training; hardware.policy_rate_hz is %g",
            spec.policy_rate_hz,
            hw.policy_rate_hz,
        )
    if spec.cameras:  # only the cameras the policy observes are listened to
        warn_on_crops(spec, hw)
        hw = dataclasses.replace(
            hw,
            cameras=list(spec.cameras),
            image_size=spec.image_size,
            camera_sources={k: v for k, v in hw.camera_sources.items() if k in spec.cameras},
            camera_crops={k: v for k, v in hw.camera_crops.items() if k in spec.cameras},
        )
    args = _robot_env_args(spec, hw, goal or {}, relative_goal or {}, goal_option)
    env = RobotEnv(
        hw,
        control=spec.control,
        max_ee_step=spec.max_ee_step,
        max_joint_step=spec.max_joint_step,
        relative_frame=spec.relative_frame,
        gripper_action=spec.gripper_action,
        gripper_hold=spec.gripper_hold,
        gripper_obs="gripper" in spec.observations,
        episode_steps=episode_steps or spec.episode_steps,
        frame_stack=spec.frame_stack,
        observe=list(spec.observations),
        start_regions={name: [list(low), list(high)] for name, (low, high) in spec.start_regions.items()},
        **args,
    )
    try:  # what the robot env built against the spec: a backstop for the checks above
        spaces = env.observation_space.spaces
        missing = sorted(set(spec.observations) - set(spaces))
        if missing:
            raise ValueError(f"the policy observes {missing}, which the robot env does not give")
        wrong = {
            k: (tuple(spaces[k].shape), e.shape) for k, e in spec.observations.items() if spaces[k].shape != e.shape
        }
        if wrong:
            raise ValueError(f"observation shapes (robot, policy) differ: {wrong}")
        if env.action_dim != spec.action_dim:
            raise ValueError(f"the policy acts in {spec.action_dim} dimensions, the robot env in {env.action_dim}")
    except Exception:
        env.close()
        raise
    return env


def _robot_env_args(
    spec: DeploySpec, hw: RobotEnvConfig, given: dict[str, list[float]], relative: dict[str, str], goal_option: str
) -> dict[str, Any]:
    """RobotEnv's goal, relative_goal, held, held_relative and goal_sampler for `spec` on `hw`, or ValueError
    naming the entries the robot cannot give and how to give them."""
    observations = spec.observations
    needed_goals = spec.goal_shapes()
    given = {k: list(v) for k, v in given.items()}
    # goals the task draws per episode that are not given: the robot env draws them at each reset (zeros until
    # it has drawn its first)
    drawn = [k for k in spec.drawn_goals if k not in given and k in needed_goals]
    goals = {**{k: [0.0] * math.prod(needed_goals[k]) for k in drawn}, **given}
    relative = dict(relative)
    for key, entry in spec.entries("goal_minus_tool").items():
        if key not in relative and key not in goals and entry.goal in goals:
            relative[key] = entry.goal
    unused = set(goals) - set(needed_goals) - {base for key, base in relative.items() if key in observations}
    extra = sorted(unused | (set(relative) - set(observations)))
    if extra:
        raise ValueError(f"the policy does not observe {extra}; remove them from {goal_option}")
    held_relative = {
        key: [entry.goal, entry.of] for key, entry in spec.entries("goal_minus_held").items() if entry.goal in goals
    }
    points = {e.of for e in spec.entries("held_point").values()} | {point for _, point in held_relative.values()}
    held = {point: list(spec.held[point]) for point in sorted(points)}

    objects: list[str] = []  # to track
    fixed: dict[str, int] = {}  # goals to give
    unmeasured: list[str] = []
    missing: list[str] = []
    state_keys: dict[str, str] = {}  # role -> the entry that gives it (the task's names: arm_qpos, hand_qpos, ...)
    object_parts: dict[str, ObjectPart] = {}
    robot = load_robot_spec(hw.robot)
    for key, entry in observations.items():
        need_object = need_goal = None
        if entry.source == "joint_state" and entry.of == "gripper":
            if key != "gripper":
                unmeasured.append(key)
        elif entry.source in ("joint_state", "kinematics"):
            role = "tool_point" if entry.of == "tool_point" else entry.of
            offered = {
                "tool_point": robot.end_effector_site is not None,
                "fingertips": bool(robot.fingertip_sites and robot.palm_site),
            }.get(role, True)
            if not offered or role in state_keys:
                unmeasured.append(key)
            else:
                state_keys[role] = key
        elif entry.source == "simulation":
            unmeasured.append(key)
        elif entry.source == "goal":
            need_goal = None if key in goals else key
        elif entry.source == "goal_minus_tool":
            need_goal = None if key in relative else entry.goal
        elif entry.source == "goal_minus_held":
            need_goal = None if entry.goal in goals else entry.goal
        elif entry.source == "object":
            if entry.part == "from_palm" and robot.palm_site is None:
                unmeasured.append(key)
            object_parts[key] = ObjectPart(entry.of, entry.part, entry.goal)
            need_object = None if entry.of in hw.objects else entry.of
            need_goal = entry.goal if entry.goal is not None and entry.goal not in goals else None
        if need_object or need_goal:
            missing.append(key)
        if need_object and need_object not in objects:
            objects.append(need_object)
        if need_goal:
            fixed[need_goal] = math.prod(needed_goals[need_goal])
    if unmeasured or missing:
        hint = _how_to_give(sorted(unmeasured), objects, fixed, hw, goal_option)
        raise ValueError(
            f"the policy observes {sorted({*unmeasured, *missing})}, which the robot does not measure: {hint}"
        )
    return {
        "goal": goals,
        "relative_goal": relative,
        "held": held,
        "held_relative": held_relative,
        "goal_sampler": _goal_sampler(task_functions(spec).draw_goals, drawn) if drawn else None,
        "state_keys": state_keys,
        "object_parts": object_parts,
    }


def _how_to_give(
    unmeasured: list[str], objects: list[str], fixed: dict[str, int], hw: RobotEnvConfig, goal_option: str
) -> str:
    """What to add: tracked objects for an object's entries, fixed values for goals (and the goal an entry is
    measured against); or which entries a robot cannot give at all (a fixed value for state that moves would be
    a wrong observation)."""
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
        # four values are an orientation: a unit quaternion, w first as everywhere in robotrl
        values = {
            key: ",".join("xyz"[:size] if size <= 3 else "wxyz") if size <= 4 else "..." for key, size in fixed.items()
        }
        hints.append("give " + " ".join(f"+{goal_option}.{k}=[{v}]" for k, v in values.items()))
        named_twice = sorted(set(fixed) & set(hw.objects))
        if named_twice:
            hints.append(
                f"the policy reads {named_twice} as goals, not tracked objects: remove them from hardware.objects"
            )
    return "; ".join(hints) or f"check hardware.objects {list(hw.objects)} and {goal_option} (a goal has 1-3 values)"


def run(cfg: DeployConfig, stop: threading.Event | None = None) -> dict[str, Any]:
    """Deploy `cfg.run`'s policy for `cfg.episodes` episodes (or until `cfg.duration` or `stop`); the summary."""
    from robotrl.hardware.ros2.msgs import Bool, Float64MultiArray, JointState, PoseStamped  # lazy: extra ros

    cfg.validate()
    stop = stop or threading.Event()
    if cfg.policy is not None:  # checked whole (hashes, spec against graph) before the robot env exists
        agent, spec, checkpoint = load_bundle_policy(cfg.policy)
    else:
        agent, spec, checkpoint = load_policy(cfg.run, cfg.device)
    env = make_robot_env(cfg.hardware, spec, cfg.goal, cfg.relative_goal, cfg.episode_steps)
    recorder = steps_log = None
    summary: dict[str, Any] = {"checkpoint": checkpoint, "control": spec.control}
    if cfg.policy is not None:
        summary["bundle"] = str(cfg.policy)
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
            # what the policy saw and did, for robotrl-bag-to-dataset
            steps_log = PolicyStepRecorder(recorder, spec, checkpoint, cfg.record_compressed)
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
            if steps_log is not None:
                steps_log.start(episodes, obs)
            while True:
                try:
                    batch = {k: torch.as_tensor(v).unsqueeze(0).to(device) for k, v in obs.items()}
                    with torch.no_grad():
                        action = agent.act(batch, deterministic=True)[0].cpu().numpy()
                except Exception:
                    policy_errors += 1
                    log.exception("deploy: the policy raised; the robot holds (no new command)")
                    action = np.full(env.action_dim, np.nan)
                obs, _, terminated, truncated, info = env.step(action)
                if steps_log is not None:
                    steps_log.step(action, obs, info)
                steps += 1
                agent.advance_evaluation(torch.tensor([terminated or truncated]))
                out_of_time = cfg.duration is not None and time.monotonic() - start >= cfg.duration
                if terminated or truncated or out_of_time or stop.is_set():
                    break
            if steps_log is not None and (terminated or truncated):  # not when stopped mid-episode
                steps_log.end(terminated, truncated)
            episodes += 1
            if cfg.duration is not None and time.monotonic() - start >= cfg.duration:
                break
    finally:
        env.close()
        if steps_log is not None:
            steps_log.close()
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
        if steps_log is not None:
            summary["record"].update(steps_log.timing(), dropped_steps=steps_log.dropped, write_errors=steps_log.failed)
    return summary


def _round(value: float) -> float:
    return round(float(value), 3) if math.isfinite(value) else float(value)


def _output_root(run: str | None, policy: str | None) -> str:
    """Where Hydra's output directory goes (deploy.yaml): under the run directory, or the bundle's. Neither given:
    an error, before Hydra creates anything."""
    if run is None and policy is None:
        raise ValueError(NO_POLICY)
    return run if run is not None else policy


def register_config() -> None:
    """Registers `deploy_schema` with Hydra, and the resolver deploy.yaml's output directory uses (done by main;
    tools that compose the config call it)."""
    ConfigStore.instance().store(name="deploy_schema", node=DeployConfig)
    OmegaConf.register_new_resolver("deploy_output_root", _output_root, replace=True)


def _check_policy_before_hydra(argv: list[str]) -> None:
    """Hydra creates its output directory under the run or the bundle before the task starts: a `run=` that is
    not a run directory, a `policy=` that is not a bundle, both or (Hydra's own options aside) neither given, fails
    first, so that nothing is created at a mistyped path."""
    given = {}
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key.lstrip("+") in ("run", "policy"):
            given[key.lstrip("+")] = value
    if len(given) > 1:
        raise ValueError(f"{NO_POLICY}: got both")
    # --help, --cfg job, ... need neither; with hydra.run.dir given nothing is created under a run or bundle, and
    # the config's own check names what is missing after the schema has refused any mistyped key
    explicit_output = any(arg.startswith("hydra.run.dir=") for arg in argv[1:])
    if not given and not explicit_output and not any(arg.startswith("-") for arg in argv[1:]):
        raise ValueError(NO_POLICY)
    if "run" in given:
        run_config_file(given["run"])
    elif "policy" in given:
        read_manifest(given["policy"])


def main() -> None:
    with exits_on_error("robotrl-deploy"):
        _check_policy_before_hydra(sys.argv)
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
