"""`robotrl-record`: record demonstrations into an episode dataset (docs/dataset.md).

robotrl-record task=panda_pick_cube teleop=keyboard episodes=20           # a person drives, in a terminal
robotrl-record task=panda_pick_cube teleop=spacemouse out=datasets/pick   # or a SpaceMouse / gamepad
robotrl-record task=panda_pick_cube teleop=joy teleop_domain_id=3          # a pad through joy_node, over ROS 2
robotrl-record task=panda_pick_cube teleop=scripted episodes=10 task.obs=state+pixels   # the task's expert
robotrl-record hardware=sim_twin task=panda_pick_cube teleop=joy +hardware.objects=[cube]  # on a robot

Every step the operator's device (or the scripted expert) commands the robot; each recorded step is
flagged as the operator's (`intervention`). A device session runs at `rate_hz` (the task's 25 Hz control
rate by default) so a person sees the robot move in real time; the scripted expert runs as fast as the
simulation goes. Keys of the keyboard device: see robotrl/hardware/teleop/keyboard.py; its "reset" event
ends (and keeps) the episode, "failure" ends it marked as failed, "quit" stops without keeping the
episode in progress. A device that disconnects ends the session, keeping the episodes already saved.

On a robot (`hardware=sim_twin|panda`, configs/hardware) the episodes run through the robot env and its shield
exactly as a deployed policy's (hardware/robot_vec_env.py), camera frames included where the task observes
pixels, and the robot env paces them at `hardware.policy_rate_hz`. A task that scores itself from what it
observes (reach, push with its puck tracked, peg) scores the episodes; one that cannot (pick: its reward needs the
fingers' contacts) is scored by the operator: the "success" key or button marks the step that succeeded and ends
the episode (`robot.reward=operator`), and those success frames train the reward classifier unchanged
(robotrl-train-classifier). The scripted expert drives a robot from its observation alone (tasks/expert.py), and
marks success where it judges the task done. An episode the robot cut short with a stale observation is dropped
(its steps did not run as recorded); a robot lost mid-session (no fresh joint state at a reset) ends the session.

The dataset only ever holds whole episodes (each is written, then the index naming it, both atomically): Ctrl-C,
a lost robot or a disconnected device drop the episode in progress and keep the rest. Recording again into the
same `out` resumes the dataset (its observation layout and task must match).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from robotrl.cli_errors import reports_errors
from robotrl.config import register_configs, strict_object
from robotrl.core.env import Obs
from robotrl.data.dataset import EpisodeDataset, EpisodeRecorder
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.robot_vec_env import ActorRobotConfig, RobotVecEnv, make_robot_vec_env, robot_deploy_spec
from robotrl.hil.config import ROS_OPERATORS
from robotrl.hil.scripted_operator import expert_of, world_to_action_of
from robotrl.hil.teleop import command_to_action, make_teleop
from robotrl.safety import ShieldResetError
from robotrl.tasks import TASK_CONFIGS, make_env, task_class
from robotrl.tasks.expert import Expert

log = logging.getLogger(__name__)
TELEOP_KINDS = ("keyboard", "spacemouse", "gamepad", "joy", "twist", "scripted")
KEEP = ("all", "success")


@dataclass
class RecordConfig:
    task: Any = MISSING
    # keyboard | spacemouse | gamepad (plugged in here) | joy | twist (a pad or SpaceMouse through joy_node or
    # spacenav_node, over ROS 2) | scripted (the task's expert)
    teleop: str = "keyboard"
    teleop_topic: str | None = None  # joy and twist: the topic (null: /joy, /spacenav/twist)
    teleop_domain_id: int = 0  # joy and twist: the ROS 2 domain
    episodes: int = 20  # episodes to keep
    out: str | None = None  # dataset directory; None: datasets/<task>_<teleop>; appended to if it exists
    seed: int = 0
    keep: str = "all"  # all | success (only successful episodes are saved)
    rate_hz: float | None = None  # None: 25 for a device, unthrottled for the scripted expert
    gain: float = 1.0  # device command scale
    noise: float = 0.0  # scripted: std of Gaussian noise added to the expert's actions (diverse demos)
    # scripted: each episode first runs a uniform draw of 0..disturb_steps steps of the expert with
    # disturb_noise added, unrecorded; the demo starts where they left the scene. Its steps are then clean
    # expert actions taken from off-course states: recoveries with the expert's own labels (DART, Laskey et
    # al. 2017), which `noise` cannot give (it records the noisy actions it executes).
    disturb_steps: int = 0
    disturb_noise: float = 1.0
    max_attempts: int | None = None  # stop after this many episodes even if fewer were kept (None: 10x episodes)
    # A robot instead of the simulated task: hardware=sim_twin|panda (configs/hardware, RobotEnvConfig)
    hardware: Any = None
    # on a robot: the episodes' goals (robot.goal, robot.goal_range), the learner's deploy spec where the task holds
    # a point measured in simulation (peg), and the reward: auto is the task's own where it scores itself, else
    # the operator's success mark (hardware/robot_vec_env.py)
    robot: ActorRobotConfig = field(default_factory=ActorRobotConfig)

    def validate(self) -> None:
        if self.teleop not in TELEOP_KINDS:
            raise ValueError(f"teleop must be one of {', '.join(TELEOP_KINDS)}, got {self.teleop!r}")
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if not 0 <= self.teleop_domain_id <= 232:
            raise ValueError(f"teleop_domain_id must be a ROS 2 domain id in 0..232, got {self.teleop_domain_id}")
        if self.keep not in KEEP:
            raise ValueError(f"keep must be one of {', '.join(KEEP)}, got {self.keep!r}")
        if self.rate_hz is not None and not self.rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {self.rate_hz}")
        if not self.gain > 0:
            raise ValueError(f"gain must be > 0, got {self.gain}")
        if not self.noise >= 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if isinstance(self.disturb_steps, bool) or not isinstance(self.disturb_steps, int) or self.disturb_steps < 0:
            raise ValueError(f"disturb_steps must be an int >= 0, got {self.disturb_steps!r}")
        if not self.disturb_noise >= 0:
            raise ValueError(f"disturb_noise must be >= 0, got {self.disturb_noise}")
        if self.disturb_steps and self.teleop != "scripted":
            raise ValueError(
                f"disturb_steps needs teleop=scripted (the expert drives the disturbance), got {self.teleop!r}"
            )
        if self.hardware is not None:
            self.hardware.validate()
            self.robot.validate()
            if self.rate_hz is not None:
                raise ValueError(
                    f"rate_hz={self.rate_hz}: on a robot the robot env paces the steps; set "
                    "hardware.policy_rate_hz instead"
                )
            if self.robot.reward == "classifier":
                raise ValueError("robot.reward=classifier: recording collects the classifier's frames, it runs none")


class Stop(Exception):
    """The operator ended the session (quit, or the device is gone)."""


class Driver:
    """Who commands the robot each step: a teleop device or the task's scripted expert."""

    def __init__(self, cfg: RecordConfig, env, robot: RobotVecEnv | None):
        self.cfg, self.env = cfg, env
        self.device = None
        self.robot_expert: Expert | None = None  # on a robot: the task's expert, fed the robot's observation
        self.judges = False  # the scripted expert marks success (on a robot where the operator scores)
        if cfg.teleop == "scripted":
            self.generator = torch.Generator().manual_seed(cfg.seed)
            if robot is None:
                self.simulated_expert = expert_of(env)  # reads the simulator's state
            else:
                self.robot_expert = self._robot_expert(robot)
                self.judges = robot.reward_cfg.kind == "operator"
        else:
            options = {"domain_id": cfg.teleop_domain_id} if cfg.teleop in ROS_OPERATORS else {}
            if cfg.teleop in ROS_OPERATORS and cfg.teleop_topic:
                options["topic"] = cfg.teleop_topic
            self.device = make_teleop(cfg.teleop, **options)
            self.to_action_frame = world_to_action_of(env)  # the device moves in world axes

    def _robot_expert(self, robot: RobotVecEnv) -> Expert:
        expert_class = task_class(self.cfg.task.name).expert_class
        if expert_class is None:
            raise ValueError(f"teleop=scripted: task {self.cfg.task.name!r} has no scripted expert")
        missing = expert_class.missing_entries(robot.obs_spec)
        if missing:
            raise ValueError(f"teleop=scripted: the task's expert reads {missing}, which this robot does not observe")
        return expert_class(self.cfg.task.max_ee_step, 1)

    def episode_started(self) -> None:
        """A new episode starts: the robot's expert forgets its phases (a simulated task resets its own)."""
        if self.robot_expert is not None:
            self.robot_expert.reset(torch.zeros(1, dtype=torch.long))

    def action(self, obs: Obs) -> tuple[torch.Tensor, frozenset[str]]:
        """([1, A] action, events of this step) at observation `obs`. A scripted expert that judges success marks
        it as a person at the robot would, by what it sees."""
        if self.device is None:
            done = self.judges and bool(self.robot_expert.judges_success(obs)[0])
            return self._expert_action(obs, self.cfg.noise), frozenset({"success"} if done else ())
        command = self.device.poll()
        if not command.connected:
            raise Stop(f"teleop device {self.cfg.teleop} disconnected")
        action = command_to_action(command, self.env.action_dim, self.cfg.gain).unsqueeze(0)
        if self.to_action_frame is not None:
            action = self.to_action_frame(action)
        return action, command.events

    def _expert_action(self, obs: Obs, noise: float) -> torch.Tensor:
        if self.robot_expert is None:
            action = self.simulated_expert()
        else:
            action = self.env.world_to_action(self.robot_expert.motion(obs))
        if noise:
            action = action + noise * torch.randn(action.shape, generator=self.generator)
        return action.clamp(-1.0, 1.0)

    def disturb(self, obs: Obs) -> Obs:
        """The observation a recorded episode starts from: `obs` (just reset), or, with disturb_steps, the one
        after a draw of 0..disturb_steps noisy expert steps; an episode that ends during them is replaced by
        the next, disturbed afresh."""
        self.episode_started()
        while self.cfg.disturb_steps:
            steps = int(torch.randint(self.cfg.disturb_steps + 1, (1,), generator=self.generator))
            for _ in range(steps):
                result = self.env.step(self._expert_action(obs, self.cfg.disturb_noise))
                obs = result.obs  # the next episode's first observation where this one ended
                if (result.terminated | result.truncated).any():
                    self.episode_started()
                    break
            else:
                return obs
        return obs

    def close(self) -> None:
        if self.device is not None:
            self.device.close()


class RobotLost(Exception):
    """The robot stopped answering (no fresh joint state, home not reached, the shield not restartable)."""


def make_record_env(cfg: RecordConfig, stop: threading.Event) -> tuple[Any, RobotVecEnv | None]:
    """(the env episodes are recorded in, the robot env when it is a robot). On a robot, `stop` ends a reset's wait
    for the scene (a person putting the objects back: it waits as long as that takes)."""
    if cfg.hardware is None:
        return make_env(cfg.task, num_envs=1), None
    robot = cfg.robot
    if robot.reward == "auto":  # the task's own score where it has one a robot can run, else the operator's mark
        spec = robot_deploy_spec(cfg.task, 1, robot)
        robot = replace(robot, reward="task" if spec.scores_from_observations else "operator")
    env = make_robot_vec_env(cfg.task, 1, cfg.hardware, robot, classifier=False, stop=stop)
    return env, env


def record(cfg: RecordConfig, out: Path) -> dict[str, Any]:
    cfg.validate()
    stop = threading.Event()
    env, robot = make_record_env(cfg, stop)
    try:
        return _record(cfg, out, env, robot)
    finally:
        stop.set()
        env.close()


def _record(cfg: RecordConfig, out: Path, env, robot: RobotVecEnv | None) -> dict[str, Any]:
    source = "scripted" if cfg.teleop == "scripted" else "teleop"
    metadata = {"task": cfg.task.name, "source": source, **({"robot": cfg.hardware.robot} if robot else {})}
    # the reward kind travels with the dataset: demos recorded dense and trained sparse would outscore every
    # online step (robotrl.hil.setup.load_demos refuses the mix); on a robot the operator's marks score pick
    operator_scored = robot is not None and robot.reward_cfg.kind == "operator"
    reward = "operator" if operator_scored else getattr(cfg.task, "reward", None)
    dataset_metadata = {"task": cfg.task.name, **({"reward": reward} if reward is not None else {})}
    dataset = EpisodeDataset.create(out, env.obs_spec, env.action_dim, dataset_metadata, exist_ok=True)
    recorder = EpisodeRecorder(1, {**metadata, "device": cfg.teleop})
    driver = Driver(cfg, env, robot)
    rate = cfg.rate_hz if cfg.rate_hz is not None else (None if cfg.teleop == "scripted" or robot else 25.0)
    attempts_left = cfg.max_attempts or 10 * cfg.episodes
    kept = attempts = stale = 0
    reason = "done"
    try:
        obs = driver.disturb(_robot_call(lambda: env.reset(seed=cfg.seed)))
        recorder.start(obs)
        next_tick = time.monotonic()
        while kept < cfg.episodes and attempts < attempts_left:
            action, events = driver.action(obs)
            if "quit" in events:
                raise Stop("the operator quit")
            stale_before = robot.stale_episodes if robot is not None else 0
            result = _robot_call(lambda a=action: env.step(a))
            cut_short = robot is not None and robot.stale_episodes > stale_before
            result.intervened, result.action = torch.ones(1, dtype=torch.bool), action
            if operator_scored and "success" in events and not cut_short:
                result.success = torch.ones(1, dtype=torch.bool)  # the frame after this step shows success
            ended_here = {"reset", "failure", "success"} & events and not (result.terminated | result.truncated).any()
            if ended_here:  # the operator ends the episode; the env resets below if another one follows
                result.truncated = torch.ones(1, dtype=torch.bool)
                result.obs = result.next_obs
            obs = result.obs
            finished = recorder.step(action, result)
            for episode in finished:
                attempts += 1
                stale += cut_short
                wanted = not cut_short and (episode.success_any if cfg.keep == "success" else "failure" not in events)
                if wanted:
                    dataset.append(episode)
                    kept += 1
                log.info(
                    "episode %d: %d steps, success=%s, %s (%d/%d)",
                    attempts,
                    len(episode),
                    episode.success_any,
                    "kept" if wanted else ("dropped: a stale observation cut it short" if cut_short else "dropped"),
                    kept,
                    cfg.episodes,
                )
            if finished and kept < cfg.episodes and attempts < attempts_left:
                if ended_here:  # not after the last episode: a robot would home and wait for the scene for nothing
                    obs = _robot_call(env.reset)
                obs = driver.disturb(obs)
                if cfg.disturb_steps or ended_here:
                    recorder.start(obs)
            if rate:
                next_tick += 1.0 / rate
                time.sleep(max(0.0, next_tick - time.monotonic()))
    except (Stop, RobotLost) as stop:
        reason = str(stop)
        log.warning("%s: stopping; the episode in progress is not saved", reason)
    except KeyboardInterrupt:
        reason = "interrupted"
        log.warning("interrupted: stopping; the episode in progress is not saved")
    finally:
        driver.close()
    summary = {"dataset": str(out), "episodes": len(dataset), "kept_now": kept, "attempts": attempts, "stopped": reason}
    if robot is not None:
        summary["dropped_stale"] = stale
    return summary


def _robot_call(call: Callable[[], Any]) -> Any:
    """`call()`, a robot that stops answering raised as RobotLost (a simulated env raises neither)."""
    try:
        return call()
    except (TimeoutError, ShieldResetError) as error:
        raise RobotLost(f"the robot is lost: {error}") from error


register_configs()
ConfigStore.instance().store(name="record_schema", node=RecordConfig)


def to_record_config(cfg: DictConfig) -> RecordConfig:
    """The typed config of a composed `record` config (unknown keys refused by name), validated."""
    hardware = RobotEnvConfig() if cfg.get("hardware") is not None else None
    obj: RecordConfig = strict_object(RecordConfig(task=TASK_CONFIGS[cfg.task.name](), hardware=hardware), cfg)
    obj.validate()
    return obj


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="record")
@reports_errors("robotrl-record")
def _hydra_main(cfg: DictConfig) -> None:
    obj = to_record_config(cfg)
    out = Path(obj.out) if obj.out else Path("datasets") / f"{obj.task.name}_{obj.teleop}"
    print(json.dumps(record(obj, out)))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
