"""robotrl-learner's schema: the agent and task it trains, its server, its replay and the offline buffer's share.
Here, below the entry points, because a learner's run directory is also read by evaluation and deployment."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig

from robotrl.agents import AGENT_CONFIGS
from robotrl.config import WandbConfig, apply_backend, check_logger, strict_object
from robotrl.data.mixer import RatioSchedule
from robotrl.hil.config import HILConfig
from robotrl.runtime.transport.config import ServeConfig
from robotrl.tasks import TASK_CONFIGS


@dataclass
class LearnerHILConfig:
    """The learner's side of `hil.*` (robotrl/hil/config.py): the offline buffer and its share of each batch.
    The operator and a learned reward belong to the actor (robotrl/actor.py: ActorHILConfig)."""

    demos: list[str] = field(default_factory=list)  # recorded datasets (robotrl-record) for the offline buffer
    offline_ratio: float = 0.5  # share of each batch drawn from the offline buffer (RLPD: 0.5)
    offline_ratio_final: float | None = None  # if set, the share moves linearly to this value ...
    offline_ratio_steps: int = 0  # ... over this many env steps received
    offline_capacity: int = 200_000  # transitions the offline buffer keeps (demonstrations + interventions)
    # the actors' hil.reward_classifier, if they use one: the demonstrations' rewards become its verdicts, as
    # the actors' online steps are scored (otherwise the demos keep the rewards they were recorded with)
    reward_classifier: str | None = None
    # Offline-to-online: this many updates on the demonstrations alone before serving (Agent.pretrain_update), so
    # actors act with the cloned policy from their first step instead of random actions, which on a real arm is
    # what the demonstrations are for; online updates still wait for learning_starts. Done once per run directory.
    pretrain_updates: int = 0

    def validate(self) -> None:
        HILConfig(**dataclasses.asdict(self)).validate()

    def schedule(self) -> RatioSchedule:
        return RatioSchedule(self.offline_ratio, self.offline_ratio_final, self.offline_ratio_steps)


@dataclass
class LearnerConfig:
    agent: Any = MISSING
    task: Any = MISSING
    server: ServeConfig = field(default_factory=ServeConfig)
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    backend: str | None = None  # mujoco | genesis | mujoco_warp: the simulator, over task.backend (as robotrl-train)
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    replay_capacity: int = 1_000_000  # transitions per actor stream
    max_actors: int = 8  # distinct actor ids this learner takes (each gets a replay stream)
    max_batch_steps: int = 1000  # env steps per pushed batch, at most
    # env steps received (all actors) before the first online update; actors act randomly until then, unless the
    # learner pretrained on demos (hil.pretrain_updates)
    learning_starts: int = 1000
    # Hindsight relabelling (HER's "future" goals, robotrl/data/hindsight.py), as robotrl-train's her_ratio: the
    # share of sampled transitions or sequences, from every actor's stream and the offline buffer, that ask for a
    # goal their episode reached later. Goal-conditioned state tasks only; not with a learned reward.
    her_ratio: float = 0.0
    # env steps to train on: once received (all actors) and their updates made, the learner saves and stops, and its
    # actors, told at registration, stop too; 0: until stopped
    total_steps: int = 0
    weights_every: int = 100  # updates per published weights version
    log_interval: int = 1000  # env steps received
    checkpoint_interval: int = 10_000  # env steps received between checkpoints (bounds the write-ahead log)
    keep_checkpoints: int = 2
    hil: LearnerHILConfig = field(default_factory=LearnerHILConfig)  # demonstrations, offline share
    logger: str | None = None  # wandb: also log to Weights & Biases (`wandb.*`), as robotrl-train's `logger`
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self) -> None:
        self.server.validate()
        self.hil.validate()
        check_logger(self.logger)
        self.wandb.validate()
        for name in (
            "replay_capacity",
            "max_actors",
            "max_batch_steps",
            "weights_every",
            "log_interval",
            "checkpoint_interval",
            "keep_checkpoints",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("learning_starts", "total_steps", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.server.max_concurrent_calls <= self.max_actors:
            raise ValueError(
                f"server.max_concurrent_calls ({self.server.max_concurrent_calls}) must exceed max_actors "
                f"({self.max_actors}): each actor makes a call at a time, beside status calls"
            )
        if self.total_steps and self.learning_starts >= self.total_steps and not self.hil.pretrain_updates:
            raise ValueError(
                f"learning_starts ({self.learning_starts}) must be below total_steps ({self.total_steps}): the "
                "learner would stop before its first update (or pretrain first with hil.pretrain_updates)"
            )
        if not (math.isfinite(self.her_ratio) and 0.0 <= self.her_ratio <= 1.0):
            raise ValueError(f"her_ratio must be in [0, 1], got {self.her_ratio}")
        if hasattr(self.agent, "validate"):
            self.agent.validate()
            if self.agent.compile:
                raise ValueError(
                    "agent.compile=true is robotrl-train's: a learner's server threads write its replay on the GPU "
                    "while an update would be captured as a CUDA graph, which a capture does not allow"
                )
            if self.agent.updates_per_step is not None:
                raise ValueError(
                    f"agent.updates_per_step={self.agent.updates_per_step} counts vectorized steps of one process's "
                    "envs; a learner counts the env steps its actors send: set agent.utd_ratio and agent.update_every"
                )


def to_learner_config(cfg: DictConfig) -> LearnerConfig:
    """The validated dataclass form of a composed learner config (agent and task typed by their names)."""
    agent_name, task_name = cfg.agent.name, cfg.task.name
    if agent_name not in AGENT_CONFIGS:
        raise ValueError(f"unknown agent {agent_name!r}; available agents: {', '.join(sorted(AGENT_CONFIGS))}")
    if task_name not in TASK_CONFIGS:
        raise ValueError(f"unknown task {task_name!r}; available tasks: {', '.join(sorted(TASK_CONFIGS))}")
    apply_backend(cfg)
    obj = strict_object(LearnerConfig(agent=AGENT_CONFIGS[agent_name](), task=TASK_CONFIGS[task_name]()), cfg)
    obj.validate()
    return obj
