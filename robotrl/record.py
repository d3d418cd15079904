"""`robotrl-record`: record demonstrations into an episode dataset (docs/dataset.md).

robotrl-record task=panda_pick_cube teleop=keyboard episodes=20           # a person drives, in a terminal
robotrl-record task=panda_pick_cube teleop=spacemouse out=datasets/pick   # or a SpaceMouse / gamepad
robotrl-record task=panda_pick_cube teleop=joy teleop_domain_id=3          # a pad through joy_node, over ROS 2
robotrl-record task=panda_pick_cube teleop=scripted episodes=10 task.obs=state+pixels   # the task's expert

Every step the operator's device (or the scripted expert) commands the robot; each recorded step is
flagged as the operator's (`intervention`). A device session runs at `rate_hz` (the task's 25 Hz control
rate by default) so a person sees the robot move in real time; the scripted expert runs as fast as the
simulation goes. Keys of the keyboard device: see robotrl/hardware/teleop/keyboard.py; its "reset" event
ends (and keeps) the episode, "failure" ends it marked as failed, "quit" stops without keeping the
episode in progress. A device that disconnects ends the session, keeping the episodes already saved.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from robotrl.cli_errors import reports_errors
from robotrl.config import register_configs, strict_object
from robotrl.data.dataset import EpisodeDataset, EpisodeRecorder
from robotrl.hil.config import ROS_OPERATORS
from robotrl.hil.scripted_operator import expert_of, world_to_action_of
from robotrl.hil.teleop import command_to_action, make_teleop
from robotrl.tasks import TASK_CONFIGS, make_env

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


class Stop(Exception):
    """The operator ended the session (quit, or the device is gone)."""


class Driver:
    """Who commands the robot each step: a teleop device or the task's scripted expert."""

    def __init__(self, cfg: RecordConfig, env):
        self.cfg, self.env = cfg, env
        self.device = None
        if cfg.teleop == "scripted":
            self.expert = expert_of(env)
            self.generator = torch.Generator().manual_seed(cfg.seed)
        else:
            options = {"domain_id": cfg.teleop_domain_id} if cfg.teleop in ROS_OPERATORS else {}
            if cfg.teleop in ROS_OPERATORS and cfg.teleop_topic:
                options["topic"] = cfg.teleop_topic
            self.device = make_teleop(cfg.teleop, **options)
            self.to_action_frame = world_to_action_of(env)  # the device moves in world axes

    def action(self) -> tuple[torch.Tensor, frozenset[str]]:
        """([1, A] action, events of this step)."""
        if self.device is None:
            return self._expert_action(self.cfg.noise), frozenset()
        command = self.device.poll()
        if not command.connected:
            raise Stop(f"teleop device {self.cfg.teleop} disconnected")
        action = command_to_action(command, self.env.action_dim, self.cfg.gain).unsqueeze(0)
        if self.to_action_frame is not None:
            action = self.to_action_frame(action)
        return action, command.events

    def _expert_action(self, noise: float) -> torch.Tensor:
        action = self.expert()
        if noise:
            action = action + noise * torch.randn(action.shape, generator=self.generator)
        return action.clamp(-1.0, 1.0)

    def disturb(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The observation a recorded episode starts from: `obs` (just reset), or, with disturb_steps, the one
        after a draw of 0..disturb_steps noisy expert steps; an episode that ends during them is replaced by
        the next, disturbed afresh."""
        while self.cfg.disturb_steps:
            steps = int(torch.randint(self.cfg.disturb_steps + 1, (1,), generator=self.generator))
            for _ in range(steps):
                result = self.env.step(self._expert_action(self.cfg.disturb_noise))
                obs = result.obs  # the next episode's first observation where this one ended
                if (result.terminated | result.truncated).any():
                    break
            else:
                return obs
        return obs

    def close(self) -> None:
        if self.device is not None:
            self.device.close()


def record(cfg: RecordConfig, out: Path) -> dict[str, Any]:
    cfg.validate()
    env = make_env(cfg.task, num_envs=1)
    metadata = {"task": cfg.task.name, "source": "scripted" if cfg.teleop == "scripted" else "teleop"}
    # the reward kind travels with the dataset: demos recorded dense and trained sparse would outscore every
    # online step (robotrl.hil.setup.load_demos refuses the mix)
    reward = getattr(cfg.task, "reward", None)
    dataset_metadata = {"task": cfg.task.name, **({"reward": reward} if reward is not None else {})}
    dataset = EpisodeDataset.create(out, env.obs_spec, env.action_dim, dataset_metadata, exist_ok=True)
    recorder = EpisodeRecorder(1, {**metadata, "device": cfg.teleop})
    driver = Driver(cfg, env)
    rate = cfg.rate_hz if cfg.rate_hz is not None else (None if cfg.teleop == "scripted" else 25.0)
    attempts_left = cfg.max_attempts or 10 * cfg.episodes
    kept = attempts = 0
    reason = "done"
    recorder.start(driver.disturb(env.reset(seed=cfg.seed)))
    next_tick = time.monotonic()
    try:
        while kept < cfg.episodes and attempts < attempts_left:
            action, events = driver.action()
            if "quit" in events:
                raise Stop("the operator quit")
            result = env.step(action)
            result.intervened, result.action = torch.ones(1, dtype=torch.bool), action
            if {"reset", "failure", "success"} & events and not (result.terminated | result.truncated).any():
                result.truncated = torch.ones(1, dtype=torch.bool)  # the operator ends the episode here
                result.obs = env.reset()
            finished = recorder.step(action, result)
            if finished and cfg.disturb_steps:
                recorder.start(driver.disturb(result.obs))
            for episode in finished:
                attempts += 1
                wanted = episode.success_any if cfg.keep == "success" else "failure" not in events
                if wanted:
                    dataset.append(episode)
                    kept += 1
                log.info(
                    "episode %d: %d steps, success=%s, %s (%d/%d)",
                    attempts,
                    len(episode),
                    episode.success_any,
                    "kept" if wanted else "dropped",
                    kept,
                    cfg.episodes,
                )
            if rate:
                next_tick += 1.0 / rate
                time.sleep(max(0.0, next_tick - time.monotonic()))
    except Stop as stop:
        reason = str(stop)
        log.warning("%s: stopping; the episode in progress is not saved", reason)
    finally:
        driver.close()
        env.close()
    summary = {"dataset": str(out), "episodes": len(dataset), "kept_now": kept, "attempts": attempts, "stopped": reason}
    return summary


register_configs()
ConfigStore.instance().store(name="record_schema", node=RecordConfig)


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="record")
@reports_errors("robotrl-record")
def _hydra_main(cfg: DictConfig) -> None:
    obj: RecordConfig = strict_object(RecordConfig(task=TASK_CONFIGS[cfg.task.name]()), cfg)
    out = Path(obj.out) if obj.out else Path("datasets") / f"{obj.task.name}_{obj.teleop}"
    print(json.dumps(record(obj, out)))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
