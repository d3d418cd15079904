"""`robotrl-actor`: acts in the env beside the robot, streams transitions to a learner, takes its weights.

robotrl-actor task=panda_reach learner.address=gpu-box:50051 actor_id=arm1
robotrl-actor task=gym task.env_id=Pendulum-v1 num_envs=4 learner.tls_ca=ca.pem   # token: $ROBOTRL_TOKEN
robotrl-actor task=panda_pick_cube hil.operator=spacemouse      # a person corrects the policy (HIL-SERL)

The actor needs only the task and the learner's address: at registration the learner sends the agent's
config and observation spec, and the actor builds the same agent. Its control loop never waits on the
network (robotrl/runtime/transport/sender.py does that on its own thread): while the learner is away it
keeps acting with the weights it has, queues batches in a bounded outbox and resends them when the
learner is back. In simulation it waits instead while the learner has more than `max_steps_ahead` env steps (1000
by default) not yet trained on, so the learner's utd_ratio holds; on a robot it never waits.

With `hil.operator` (scripted, keyboard, spacemouse, gamepad) the env is wrapped for takeover exactly as the
single-process loop wraps it (robotrl/hil/setup.py: wrap_for_hil; a learned reward with
`hil.reward_classifier`): the transitions carry the executed (operator's) actions and the `intervened`
flags, and the learner copies the intervened steps into its offline buffer.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from robotrl.agents import AGENT_CONFIGS, make_agent
from robotrl.cli_errors import reports_errors
from robotrl.config import apply_backend, register_configs, strict_object
from robotrl.core.env import EnvCancelled, StepResult, VecEnv
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.robot_vec_env import ActorRobotConfig, make_robot_vec_env
from robotrl.hil.config import HILConfig
from robotrl.hil.intervention import InterventionEnv
from robotrl.hil.scripted_operator import ScriptedOperatorConfig
from robotrl.hil.setup import ends_at_success, env_task, wrap_for_hil
from robotrl.runtime.assembly import (
    EpisodeStats,
    add_actuation,
    add_randomization,
    add_sensing,
    make_training_env,
    resolve_device,
)
from robotrl.runtime.metrics import MetricsWriter
from robotrl.runtime.run_config import save_run_config
from robotrl.runtime.transport.client import LearnerClient
from robotrl.runtime.transport.config import ConnectConfig
from robotrl.runtime.transport.protocol import ACTOR_ID, new_session, task_settings
from robotrl.runtime.transport.sender import Outbox, Sender, register_until_accepted
from robotrl.runtime.transport.weights import actor_owned, load_policy_state
from robotrl.runtime.transport.wire import WireError, spec_from_json
from robotrl.sim2real.actuation import ActuationConfig
from robotrl.sim2real.randomization import RandomizationConfig
from robotrl.sim2real.sensing import SensingConfig
from robotrl.tasks import TASK_CONFIGS

log = logging.getLogger(__name__)


def actor_seed(seed: int, actor_id: str) -> int:
    """The seed of one actor's env resets and exploration: `seed` mixed with its id, so actors launched with
    the same settings (the default seed) do not send the learner the same episodes. Stable across runs."""
    return (seed * 1_000_003 + zlib.crc32(actor_id.encode())) % 2**31


@dataclass
class ActorHILConfig:
    """The actor's side of `hil.*` (robotrl/hil/config.py): who takes over, and a learned reward. The
    demonstrations and the offline share belong to the learner (robotrl/runtime/learner_config.py: LearnerHILConfig)."""

    # who takes over: none | scripted (the task's expert) | keyboard | spacemouse | gamepad | joy | twist (a pad or a
    # SpaceMouse through joy_node or spacenav_node, over ROS 2)
    operator: str = "none"
    on_disconnect: str = "resume"  # a teleop device that disconnects: resume (the policy acts) | stop the episode
    teleop_gain: float = 1.0  # scales the device's command before it is clipped to [-1, 1]
    teleop_topic: str | None = None  # joy and twist: the topic (null: /joy, /spacenav/twist)
    teleop_domain_id: int = 0  # joy and twist: the ROS 2 domain their messages come on (a robot's may differ)
    scripted: ScriptedOperatorConfig = field(default_factory=ScriptedOperatorConfig)
    reward_classifier: str | None = None  # a robotrl-train-classifier output dir: its verdict is reward and success

    def validate(self) -> None:
        HILConfig(**dataclasses.asdict(self) | {"scripted": self.scripted}).validate()


@dataclass
class ActorConfig:
    task: Any = MISSING
    learner: ConnectConfig = field(default_factory=ConnectConfig)
    actor_id: str = "actor0"  # one per actor process feeding the same learner
    num_envs: int = 1
    seed: int = 1  # with actor_id (actor_seed): actors started with the same seed still explore differently
    backend: str | None = None  # mujoco | genesis | mujoco_warp: the simulator, over task.backend (as robotrl-train)
    device: str = "cpu"  # where the policy runs
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    batch_steps: int = 50  # env steps per pushed batch (each of num_envs transitions)
    outbox_batches: int = 1000  # unacknowledged batches kept while the learner is away; beyond, the oldest go
    total_steps: int = 0  # env steps to take, then stop; 0: until stopped (or the learner has its total_steps)
    control_hz: float = 0.0  # pace of the control loop; 0: as fast as the env steps (a robot env paces itself)
    # Simulation only: hold the next step while the learner has more than this many env steps (every actor's, with
    # this one's not yet delivered) whose updates it has not made, so agent.utd_ratio holds as in robotrl-train
    # (Reverb's samples-per-insert limiter, kept at the actor; unpaced, panda_reach fell from 0.9 to 0.2 success,
    # bench/actor_learner_parity.py). 0: never wait, as a robot's control loop must not. null: 1000 (at least two
    # pushed batches) in simulation, 0 on hardware (`pacing`).
    max_steps_ahead: int | None = None
    connect_timeout_s: float = 0.0  # how long to wait for the first registration; 0: forever
    flush_s: float = 10.0  # at exit, how long queued batches may take to be acknowledged
    log_interval: int = 1000
    hil: ActorHILConfig = field(default_factory=ActorHILConfig)  # the operator's takeover, a learned reward
    # A robot instead of the simulated task: hardware=sim_twin|panda (configs/hardware, RobotEnvConfig);
    # the task still gives the controller and observation layout the learner's agent expects.
    hardware: Any = None
    robot: ActorRobotConfig = field(default_factory=ActorRobotConfig)  # goals and reward on the robot
    # Simulation only, as robotrl-train's (docs/sim2real.md): physics randomization (randomization=none|default|
    # wide|hand), an actuator model (actuation.*) and a sensor model (sensing.*) for this actor's envs, drawn from
    # its own seed (actor_seed), so actors feeding one learner meet different physics. The learner's own envs (for
    # its spec) stay nominal.
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    actuation: ActuationConfig = field(default_factory=ActuationConfig)
    sensing: SensingConfig = field(default_factory=SensingConfig)

    @property
    def pacing(self) -> int:
        """max_steps_ahead, resolved: null gives 0 on hardware and in simulation 1000, or two pushed batches."""
        if self.max_steps_ahead is not None:
            return self.max_steps_ahead
        return 0 if self.hardware is not None else max(1000, 2 * self.batch_steps * self.num_envs)

    def validate(self) -> None:
        self.learner.validate()
        self.hil.validate()
        self.robot.validate()
        self.randomization.validate()
        if self.randomization.privileged:
            raise ValueError(
                "randomization.privileged=true is robotrl-train's (its learner would need the entry too): set it false"
            )
        self.actuation.validate()
        self.sensing.validate()
        if getattr(self.task, "name", None) == "gym" and self.randomization.terms:
            raise ValueError(
                f"randomization={self.randomization.name} changes a built-in task's simulated physics; task=gym runs "
                "a gymnasium env whose model robotrl does not own: set randomization=none"
            )
        if self.hardware is not None:
            self.hardware.validate()
            modelled = [
                key
                for key, on in (
                    (f"randomization={self.randomization.name}", bool(self.randomization.terms)),
                    ("actuation.*", self.actuation.enabled),
                    ("sensing.*", self.sensing.enabled),
                )
                if on
            ]
            if modelled:
                raise ValueError(
                    f"{', '.join(modelled)} model a simulated robot; with hardware={self.hardware.robot} the robot's "
                    "own physics, actuators and sensors act: leave them off"
                )
            if self.num_envs != 1:
                raise ValueError(
                    f"num_envs must be 1 with hardware={self.hardware.robot} (one robot), got {self.num_envs}"
                )
            if self.hil.operator == "scripted":
                raise ValueError("hil.operator=scripted needs the simulator's expert; on a robot use a teleop device")
            if self.robot.reward == "operator":
                raise ValueError(
                    "robot.reward=operator leaves every reward 0 (a person's success marks are robotrl-record's): "
                    "an actor learns from robot.reward=task or a reward classifier"
                )
        for name in ("num_envs", "batch_steps", "outbox_batches", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("total_steps", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_steps_ahead is not None and self.max_steps_ahead < 0:
            raise ValueError(f"max_steps_ahead must be >= 0 or null, got {self.max_steps_ahead}")
        if self.max_steps_ahead:
            if self.hardware is not None:
                raise ValueError(
                    f"max_steps_ahead={self.max_steps_ahead} holds steps while the learner catches up; a robot's "
                    f"control loop never waits on the learner: leave it 0 with hardware={self.hardware.robot}"
                )
            batch = self.batch_steps * self.num_envs
            if self.max_steps_ahead < batch:
                raise ValueError(
                    f"max_steps_ahead={self.max_steps_ahead} is below one pushed batch (batch_steps * num_envs = "
                    f"{batch} env steps), which the learner cannot train on before it arrives; raise it, or lower "
                    "batch_steps or num_envs"
                )
        for name in ("control_hz", "connect_timeout_s", "flush_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not ACTOR_ID.fullmatch(self.actor_id):
            raise ValueError(f"actor_id must be 1-64 letters, digits, '_' or '-', got {self.actor_id!r}")


# ---- stepping, reusable by any loop that acts ------------------------------------------------------------


class EnvStepper:
    """The exploring actor's env step, as the training loop takes it: uniform random actions in warm-up, the
    agent's otherwise; the actor's exploration clock advanced after the env stepped; the step returned as a
    transition (obs.<key>, next_obs.<key>, action, reward, terminated, truncated, intervened) whose action is
    the one executed (an operator's, where an intervention wrapper replaced it)."""

    def __init__(self, env: VecEnv, agent, seed: int):
        self.env, self.agent = env, agent
        self.obs = env.reset(seed=seed)
        agent.reset_exploration(env.num_envs)  # every env starts an episode here

    def step(self, random_action: bool) -> tuple[dict[str, torch.Tensor], StepResult]:
        env = self.env
        if random_action:
            action = torch.rand(env.num_envs, env.action_dim) * 2.0 - 1.0
        else:
            action = self.agent.act({k: v.to(self.agent.device) for k, v in self.obs.items()}).cpu()
            if not torch.isfinite(action).all():
                raise FloatingPointError("the policy produced a non-finite action (diverged weights?)")
        result = env.step(action)
        self.agent.advance_exploration(result.terminated | result.truncated)
        executed = action if result.action is None else result.action.to(torch.float32)
        intervened = torch.zeros(env.num_envs, dtype=torch.bool) if result.intervened is None else result.intervened
        transition = {f"obs.{k}": v for k, v in self.obs.items()}
        transition.update({f"next_obs.{k}": v for k, v in result.next_obs.items()})
        transition.update(
            action=executed,
            reward=result.reward.to(torch.float32),
            terminated=result.terminated,
            truncated=result.truncated,
            intervened=intervened.to(torch.bool),
        )
        self.obs = result.obs
        return transition, result


class TransitionBatcher:
    """Stacks single steps ([E, ...] entries) into a batch of N steps ([N, E, ...])."""

    def __init__(self, steps: int):
        self.steps = steps
        self._rows: list[dict[str, torch.Tensor]] = []

    def add(self, transition: dict[str, torch.Tensor]) -> bool:
        """Append a step; True once the batch is full."""
        self._rows.append(transition)
        return len(self._rows) >= self.steps

    def __len__(self) -> int:
        """Steps held, not yet popped."""
        return len(self._rows)

    def pop(self) -> dict[str, torch.Tensor] | None:
        if not self._rows:
            return None
        rows, self._rows = self._rows, []
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


# ---- the actor process -----------------------------------------------------------------------------------


def agent_config_from_json(value: dict[str, Any]):
    """The agent's config dataclass from the learner's JSON, type-checked (unknown keys name themselves)."""
    name = value.get("name") if isinstance(value, dict) else None
    if name not in AGENT_CONFIGS:
        raise WireError(f"the learner trains agent {name!r}, which this robotrl does not know")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AGENT_CONFIGS[name]), value))
    cfg.validate()
    return cfg


class Actor:
    """Registers with the learner, builds its agent and env, then acts until stopped (see the module doc).

    `make_env(agent_cfg)` overrides how the env is built (an intervention wrapper, a robot); by default it is
    the task's env, frame-stacked as the learner's agent expects."""

    def __init__(
        self,
        cfg: ActorConfig,
        run_dir: Path | None = None,
        make_env: Callable[[Any], VecEnv] | None = None,
        token: str | None = None,
    ):
        cfg.validate()
        self.cfg, self.run_dir, self.token = cfg, run_dir, token
        self._make_env = make_env
        # an env the caller builds may drive a robot: it is paced only when max_steps_ahead is set
        self.pacing = cfg.pacing if make_env is None or cfg.max_steps_ahead is not None else 0
        self.session = new_session()
        self.env_step = 0
        self.episodes = 0
        self.interventions = 0  # intervened transitions (the operator's actions were executed)
        self.weights_version: int | None = None
        self.weights_loaded = 0  # weights versions loaded so far
        self.random_env_steps = 0  # env steps taken with uniform random actions (warm-up, or no weights yet)
        self.paced_s = 0.0  # seconds held by max_steps_ahead, waiting for the learner's updates
        self.learner_done = False  # stopped because the learner had received its total_steps
        self.sender: Sender | None = None
        self.outbox = Outbox(cfg.outbox_batches)

    @property
    def connected(self) -> bool:
        return self.sender is not None and self.sender.connected

    def _registration(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "actor_id": cfg.actor_id,
            "session": self.session,
            "num_envs": cfg.num_envs,
            "task": cfg.task.name,
            "task_settings": task_settings(cfg.task),
            "learned_reward": bool(cfg.hil.reward_classifier),
        }

    def _connect(self, stop: threading.Event):
        """Register (waiting for the learner), then build the agent and env the learner's reply describes."""
        cfg = self.cfg
        registration = self._registration()

        def connect() -> LearnerClient:
            return LearnerClient(cfg.learner, self.token)

        client, reply = register_until_accepted(connect, registration, cfg.connect_timeout_s, stop)
        agent_cfg = agent_config_from_json(reply["agent"])
        learner_spec, action_dim = spec_from_json(reply["obs_spec"]), int(reply["action_dim"])
        if cfg.batch_steps > int(reply["max_batch_steps"]):
            raise ValueError(
                f"batch_steps={cfg.batch_steps} exceeds the learner's max_batch_steps={reply['max_batch_steps']}"
            )
        if self.pacing and "untrained_steps" not in reply:
            raise ValueError(
                f"max_steps_ahead={self.pacing}: the learner does not report its untrained steps (an older "
                "robotrl-learner), so this actor could not be paced; update the learner or set max_steps_ahead=0"
            )
        if self._make_env is not None:
            env = self._make_env(agent_cfg)
        elif cfg.hardware is not None:
            try:
                env = make_robot_vec_env(
                    cfg.task, agent_cfg.frame_stack, cfg.hardware, cfg.robot, bool(cfg.hil.reward_classifier), stop
                )
            except BaseException:
                client.close()
                raise
        else:
            task = env_task(cfg.task, cfg.hil)  # with a learned reward, its verdict ends episodes
            env = make_training_env(SimpleNamespace(task=task, agent=agent_cfg), cfg.num_envs)
            seed = actor_seed(cfg.seed, cfg.actor_id)
            log_path = self.run_dir / "randomization.jsonl" if self.run_dir is not None else None
            try:
                add_randomization(env, cfg.randomization, seed, log_path)
                add_actuation(env, cfg.actuation, seed)
                env = add_sensing(env, cfg.sensing, seed)
            except BaseException:
                env.close()
                client.close()
                raise
        try:
            # the operator's takeover and a learned reward, as the loop's env
            env = wrap_for_hil(env, cfg.hil, ends_at_success(cfg.task))
        except BaseException:
            env.close()
            client.close()
            raise
        if dict(env.obs_spec) != learner_spec or env.action_dim != action_dim:
            env.close()
            client.close()
            raise ValueError(
                f"this actor's env ({cfg.task.name}) observes {dict(env.obs_spec)} with {env.action_dim} actions; the "
                f"learner expects {learner_spec} with {action_dim}: run the same task config on both"
            )
        agent = make_agent(agent_cfg, env.obs_spec, env.action_dim, resolve_device(cfg.device))
        template = {k: v for k, v in agent.state_dict().items() if not actor_owned(k)}
        self.sender = Sender(connect, client, registration, reply, self.outbox, template).start()
        self.random_steps = int(reply["random_steps"])
        log.info("registered with the learner at %s as %r (%s)", cfg.learner.address, cfg.actor_id, agent_cfg.name)
        return env, agent

    def run(self, stop: threading.Event | None = None) -> dict[str, Any]:
        """Act until `total_steps`, until the learner has received its own total_steps, or until `stop` is set;
        returns a summary."""
        cfg = self.cfg
        stop = stop or threading.Event()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        seed = actor_seed(cfg.seed, cfg.actor_id)
        torch.manual_seed(seed)
        env, agent = self._connect(stop)
        sender = self.sender
        batcher = TransitionBatcher(cfg.batch_steps)
        episodes = EpisodeStats(cfg.num_envs)
        writer = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            writer = MetricsWriter(self.run_dir)
        period = 1.0 / cfg.control_hz if cfg.control_hz else 0.0
        try:
            stepper = None
            try:
                stepper = EnvStepper(env, agent, seed=seed)
            except EnvCancelled:  # stopped while a robot's first reset waited for its scene: the loops end at once
                stop.set()
            if self.random_steps == 0:  # the learner pretrained: not one random step while its weights are in flight
                while self.weights_version is None and not stop.is_set():
                    if sender.fatal is not None:
                        raise sender.fatal
                    if not self._load_new_weights(agent):
                        time.sleep(0.01)
            next_tick = time.monotonic()
            while not stop.is_set() and not (cfg.total_steps and self.env_step >= cfg.total_steps):
                if sender.fatal is not None:
                    raise sender.fatal
                if sender.learner_total_steps and sender.learner_env_steps >= sender.learner_total_steps:
                    self.learner_done = True  # more steps would be stored, never trained on
                    log.info("the learner has its total_steps=%d env steps: stopping", sender.learner_total_steps)
                    break
                self._load_new_weights(agent)
                if self.pacing:
                    self._wait_for_learner(len(batcher) * cfg.num_envs, stop)
                warm_up = max(self.env_step, sender.learner_env_steps) < self.random_steps
                random_action = self.weights_version is None or warm_up
                try:
                    transition, result = stepper.step(random_action=random_action)
                except EnvCancelled:  # stopped while a robot's reset waited for its scene
                    break
                self.random_env_steps += cfg.num_envs if random_action else 0
                self.episodes += episodes.record(result.reward, result.success, result.terminated | result.truncated)
                self.interventions += int(transition["intervened"].sum())
                prev, self.env_step = self.env_step, self.env_step + cfg.num_envs
                sender.actor_env_step = self.env_step
                if batcher.add(transition):
                    self.outbox.put(batcher.pop(), cfg.batch_steps * cfg.num_envs, self.env_step)
                if writer is not None and self.env_step // cfg.log_interval > prev // cfg.log_interval:
                    scalars = {**episodes.flush(env.has_success), **self._scalars()}
                    if isinstance(env, InterventionEnv):  # interventions per episode, rate, the operator's own
                        scalars.update({f"hil/{k}": v for k, v in env.flush_stats().items()})
                    writer.write(self.env_step, scalars)
                if period:
                    next_tick = max(next_tick + period, time.monotonic() - period)
                    time.sleep(max(0.0, next_tick - time.monotonic()))
        finally:
            rest = batcher.pop()
            if rest is not None:
                steps = rest["reward"].shape[0]
                self.outbox.put(rest, steps * cfg.num_envs, self.env_step)
            sender.stop(flush_s=cfg.flush_s if sender.fatal is None else 0.0)
            env.close()
            if writer is not None:
                writer.close()
        return self.summary()

    def _wait_for_learner(self, batched: int, stop: threading.Event) -> None:
        """max_steps_ahead: wait while the learner's untrained steps, with this actor's `batched` and queued ones it
        has not received, exceed it. A lost learner ends the wait (the actor acts on, as without pacing)."""
        sender, outbox, started = self.sender, self.outbox, None
        while not stop.is_set() and sender.connected and sender.fatal is None:
            if sender.learner_untrained_steps + outbox.env_steps + batched <= self.pacing:
                break
            started = started or time.monotonic()
            outbox.want_progress()  # one progress call per wait: each takes the lock the learner samples under
            time.sleep(0.02)
        if started is not None:
            self.paced_s += time.monotonic() - started

    def _load_new_weights(self, agent) -> bool:
        """Load the newest weights the sender received since the last look, if any; True if it did."""
        new = self.sender.take_weights()
        if new is None:
            return False
        load_policy_state(agent, new[0])
        self.weights_version = new[1]
        self.weights_loaded += 1
        return True

    def _scalars(self) -> dict[str, float]:
        sender = self.sender
        return {
            "actor/weights_version": float(-1 if self.weights_version is None else self.weights_version),
            "actor/connected": float(sender.connected),
            "actor/outbox_batches": float(len(self.outbox)),
            "actor/acked_env_steps": float(sender.acked_env_steps),
            "actor/dropped_env_steps": float(self.outbox.dropped_env_steps),
        }

    def summary(self) -> dict[str, Any]:
        sender = self.sender
        return {
            "env_steps": self.env_step,
            "episodes": self.episodes,
            "interventions": self.interventions,
            "weights_version": self.weights_version,
            "weights_loaded": self.weights_loaded,
            "random_env_steps": self.random_env_steps,
            "paced_s": round(self.paced_s, 3),
            "learner_done": self.learner_done,
            "acked_env_steps": sender.acked_env_steps if sender else 0,
            "dropped_env_steps": self.outbox.dropped_env_steps,
            "unacked_batches": len(self.outbox),
            "reconnects": sender.reconnects if sender else 0,
        }


# ---- Hydra entry point -----------------------------------------------------------------------------------

register_configs()
ConfigStore.instance().store(name="actor_schema", node=ActorConfig)


def to_actor_config(cfg: DictConfig) -> ActorConfig:
    """The validated dataclass form of a composed actor config (the task typed by its name's schema)."""
    task_name = cfg.task.name
    if task_name not in TASK_CONFIGS:
        raise ValueError(f"unknown task {task_name!r}; available tasks: {', '.join(sorted(TASK_CONFIGS))}")
    apply_backend(cfg)
    hardware = None
    if cfg.get("hardware") is not None:
        hardware = RobotEnvConfig()
    obj = strict_object(ActorConfig(task=TASK_CONFIGS[task_name](), hardware=hardware), cfg)
    obj.validate()
    return obj


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    actor_cfg = to_actor_config(cfg)
    save_run_config(cfg, run_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    summary = Actor(actor_cfg, run_dir).run(stop)
    log.info("actor done: %s", summary)
    return summary


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="actor")
@reports_errors("robotrl-actor")
def _hydra_main(cfg: DictConfig) -> None:
    run(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
