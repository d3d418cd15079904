"""Structured configs for the entry points, registered with Hydra's ConfigStore.

Each group option in configs/ starts from one of these schemas, so an unknown key or a value of the
wrong type fails at start-up with the key's name instead of surfacing mid-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from robotrl.agents import AGENT_CONFIGS
from robotrl.agents.schedule import UpdateSchedule
from robotrl.core.policy_bundle import FORMATS as BUNDLE_FORMATS
from robotrl.hil.config import HILConfig
from robotrl.sim2real.actuation import ActuationConfig
from robotrl.sim2real.randomization import RandomizationConfig
from robotrl.sim2real.sensing import SensingConfig
from robotrl.tasks import TASK_CONFIGS
from robotrl.tasks.configs import BACKENDS

LOGGERS = ("wandb",)  # experiment trackers a run may log to beside metrics.csv and TensorBoard
WANDB_MODES = ("offline", "online")


@dataclass
class WandbConfig:
    """Weights & Biases settings, read where `logger=wandb` (robotrl/runtime/tracking.py)."""

    project: str = "robotrl"
    entity: str | None = None  # a W&B team or user; null: the logged-in account's default
    # offline (the default) needs no account and no network: `wandb sync <run dir>/wandb/offline-run-*` uploads
    # later; online streams to W&B as the run goes (after `wandb login`)
    mode: str = "offline"
    group: str | None = None  # shown together in W&B, e.g. a sweep's seeds
    tags: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if not self.project:
            raise ValueError(f"wandb.project must name a W&B project, got {self.project!r}")
        if self.mode not in WANDB_MODES:
            raise ValueError(f"wandb.mode must be one of {', '.join(WANDB_MODES)}, got {self.mode!r}")


def check_logger(logger: str | None) -> None:
    if logger is not None and logger not in LOGGERS:
        raise ValueError(
            f"logger must be null (metrics.csv and TensorBoard only) or one of {', '.join(LOGGERS)}, got {logger!r}"
        )


@dataclass
class TrainConfig:
    agent: Any = MISSING
    task: Any = MISSING
    seed: int = 1
    total_steps: int = 100_000
    learning_starts: int = 5_000  # uniform random actions before the first update
    num_envs: int = 1
    # The simulator of a built-in task: mujoco | genesis | mujoco_warp. Given, it wins over `task.backend` (and sets
    # it); null (the default) keeps `task.backend` (mujoco unless the task config says otherwise).
    backend: str | None = None
    replay_capacity: int = 1_000_000
    # Hindsight relabelling (HER's "future" goals): the share of sampled transitions or sequences that ask
    # for a goal their episode reached later, rewards and success recomputed (robotrl/data/hindsight.py).
    # 0 (the default) is off; 0.8 is HER's 4 relabelled goals per real one. Goal-conditioned tasks only.
    her_ratio: float = 0.0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    log_interval: int = 1_000
    eval_interval: int = 10_000
    eval_episodes: int = 10
    # Envs the periodic evaluation runs at once, each one episode per round (eval_episodes a multiple of it): with
    # thousands of training envs on a GPU, 256 evaluation episodes take one episode's time. 1: one env, episodes in
    # turn, the first filmed (video).
    eval_envs: int = 1
    checkpoint_interval: int = 10_000
    checkpoint_replay: bool = True
    keep_checkpoints: int = 2
    video: bool = True
    progress: bool = True
    resume: str | None = None  # a run directory to continue
    hil: HILConfig = field(default_factory=HILConfig)  # demonstrations, takeover corrections, learned reward
    # Physics randomization of the training envs (randomization=none|default|wide|hand, configs/randomization/);
    # evaluation runs the nominal model. Built-in simulated tasks only.
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    # An actuator model between the training envs' commands and their actuators: latency in physics substeps, a
    # low-pass filter (robotrl/sim2real/actuation.py); off by default. Built-in simulated tasks only.
    actuation: ActuationConfig = field(default_factory=ActuationConfig)
    # A sensor model over the training envs' observations: delay in control steps, dropped messages, bias and noise
    # on joint states and tracked objects (robotrl/sim2real/sensing.py); off by default. Built-in tasks only.
    sensing: SensingConfig = field(default_factory=SensingConfig)
    # An experiment tracker beside metrics.csv and TensorBoard, which every run writes: wandb (Weights & Biases,
    # the tracking extra, set under `wandb.*`) or null. A plain key rather than a config group, so that
    # `logger=wandb` also applies as an override on resume.
    logger: str | None = None
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self) -> None:
        for name in (
            "total_steps",
            "num_envs",
            "replay_capacity",
            "log_interval",
            "eval_interval",
            "eval_episodes",
            "eval_envs",
            "checkpoint_interval",
            "keep_checkpoints",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("learning_starts", "threads", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.learning_starts >= self.total_steps:
            raise ValueError(
                f"learning_starts ({self.learning_starts}) must be below total_steps ({self.total_steps}): "
                "the run would end before its first update"
            )
        if not (math.isfinite(self.her_ratio) and 0.0 <= self.her_ratio <= 1.0):
            raise ValueError(f"her_ratio must be in [0, 1], got {self.her_ratio}")
        if self.eval_envs > 1 and self.eval_episodes % self.eval_envs:
            raise ValueError(
                f"eval_episodes ({self.eval_episodes}) must be a multiple of eval_envs ({self.eval_envs}): each env "
                "runs one episode per round"
            )
        _check_device(self.device)
        _check_backend("backend", self.backend, self.task)
        if self.backend is not None:
            self.task.backend = self.backend  # the top-level key wins, as in apply_backend
        if _has_backend(self.task):
            _check_backend("task.backend", self.task.backend, self.task)
        self.hil.validate()
        self.randomization.validate()
        if self.randomization.privileged and self.hil.demos:
            raise ValueError(
                "randomization.privileged=true gives the critic the physics each episode ran with, which recorded "
                f"demonstrations (hil.demos={self.hil.demos!r}) do not carry: train without one or the other"
            )
        self.actuation.validate()
        self.sensing.validate()
        if getattr(self.task, "name", None) == "gym":
            if self.randomization.terms:
                raise ValueError(
                    f"randomization={self.randomization.name} changes a built-in task's simulated physics; task=gym "
                    "runs a gymnasium env whose model robotrl does not own: set randomization=none"
                )
            if self.actuation.enabled:
                raise ValueError("actuation.* models a built-in task's actuators; task=gym has its own: leave it off")
            if self.sensing.enabled:
                raise ValueError("sensing.* models a built-in task's sensors; task=gym has its own: leave it off")
        check_logger(self.logger)
        self.wandb.validate()
        if hasattr(self.agent, "validate"):
            self.agent.validate()  # agent.* settings fail here, before any env is built
            UpdateSchedule.of(self.agent, self.learning_starts, self.num_envs).check(self.total_steps)


@dataclass
class EvalConfig:
    run: str = MISSING  # the run directory to evaluate: robotrl-train's or robotrl-learner's
    episodes: int = 10
    seed: int = 12345
    video: bool = True
    deterministic: bool = True
    device: str = "auto"
    backend: str | None = None  # mujoco | genesis | mujoco_warp: evaluate on this simulator; null: the run's own
    # Evaluate under changed physics, actuators or sensors (docs/sim2real.md), drawn from `seed`: a preset
    # (randomization=default), or one fixed corner, e.g. +randomization.terms.heavy={param:body_mass,target:object,
    # low:1.3,high:1.3}; actuation.latency_min=10 actuation.latency_max=10 for 20 ms of command latency
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    actuation: ActuationConfig = field(default_factory=ActuationConfig)
    sensing: SensingConfig = field(default_factory=SensingConfig)

    def validate(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        _check_device(self.device)
        self.randomization.validate()
        self.actuation.validate()
        self.sensing.validate()


@dataclass
class ExportConfig:
    run: str = MISSING  # the run directory whose policy to export: robotrl-train's or robotrl-learner's
    format: str = "onnx"  # the bundle's graph format (robotrl/core/policy_bundle.py: FORMATS)
    out: str | None = None  # the bundle directory to write (must not exist); null: <run>/bundles/<checkpoint>_<format>
    checkpoint: str | None = None  # a checkpoint's directory name under <run>/checkpoints; null: the latest

    def validate(self) -> None:
        if self.format not in BUNDLE_FORMATS:
            raise ValueError(f"format must be one of {', '.join(BUNDLE_FORMATS)}, got {self.format!r}")


def _check_device(device: str) -> None:
    if device != "auto" and not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")


def _has_backend(task: Any) -> bool:
    return "backend" in task if isinstance(task, DictConfig) else hasattr(task, "backend")


def _check_backend(key: str, value: str | None, task: Any) -> None:
    if value is None:
        return
    if value not in BACKENDS:
        raise ValueError(f"{key} must be one of {', '.join(BACKENDS)}, got {value!r}")
    if not _has_backend(task):
        raise ValueError(
            f"{key}={value}: task={task.name} has no simulator backend to choose (the built-in tasks have: "
            f"{', '.join(BACKENDS)})"
        )


def apply_backend(cfg: DictConfig) -> DictConfig:
    """Give the top-level `backend`, where set, to `task.backend` (the top-level key wins); checks both."""
    backend = cfg.get("backend")
    _check_backend("backend", backend, cfg.task)
    if backend is not None:
        cfg.task.backend = backend
    if _has_backend(cfg.task):
        _check_backend("task.backend", cfg.task.backend, cfg.task)
    return cfg


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(name="export_schema", node=ExportConfig)
    for name, node in AGENT_CONFIGS.items():
        cs.store(group="schema/agent", name=name, node=node)
    for name, node in TASK_CONFIGS.items():
        cs.store(group="schema/task", name=name, node=node)


def plain_values(cfg: DictConfig) -> DictConfig:
    """`cfg`'s values without its types, to merge into a schema. Hydra lets `+key=value` add a key to a typed
    node, and a merge of typed nodes keeps it; a merge of the plain values rejects every key the schema
    lacks, naming it."""
    return OmegaConf.create(OmegaConf.to_container(cfg))


def strict_object(schema: Any, cfg: DictConfig) -> Any:
    """`cfg` as the dataclass `schema` (a class, or an instance whose `Any` fields hold the schemas that the
    config's names select), every key checked against it."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), plain_values(cfg)))


def typed_train_config(cfg: DictConfig | dict) -> DictConfig:
    """Re-type a train config (composed by Hydra, or plain, e.g. loaded from YAML) against the schemas its
    names select; a key they lack fails, naming it."""
    plain = plain_values(cfg) if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    agent_name, task_name = plain.agent.name, plain.task.name
    if agent_name not in AGENT_CONFIGS:
        raise ValueError(f"unknown agent {agent_name!r}; available agents: {', '.join(sorted(AGENT_CONFIGS))}")
    if task_name not in TASK_CONFIGS:
        raise ValueError(f"unknown task {task_name!r}; available tasks: {', '.join(sorted(TASK_CONFIGS))}")
    schema = OmegaConf.structured(TrainConfig(agent=AGENT_CONFIGS[agent_name](), task=TASK_CONFIGS[task_name]()))
    return apply_backend(OmegaConf.merge(schema, plain))


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """The validated dataclass form of a composed config (agent and task become their dataclasses)."""
    obj = OmegaConf.to_object(typed_train_config(cfg))
    obj.validate()
    return obj
