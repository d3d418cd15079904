"""What the programs build a run from: the device, seeding, the task's env with its frame stack, the replay
(its memory check, hindsight relabelling, the online/offline mix) and episode statistics. robotrl-train,
-eval, -actor, -learner, -record and -deploy share these; runtime/loop.py keeps the training loop itself."""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from robotrl.config import TrainConfig
from robotrl.core.durable import write_atomic
from robotrl.core.memory import check_fits
from robotrl.core.spec import PRIVILEGED, TensorSpec, pixel_keys
from robotrl.data.frame_replay import replay_buffer_for
from robotrl.data.hindsight import Hindsight
from robotrl.data.mixer import MixedReplay, RatioSchedule
from robotrl.data.replay import ReplayBuffer
from robotrl.hil.scripted_operator import find_task
from robotrl.hil.setup import ends_at_success
from robotrl.runtime.frame_stack import FrameStack
from robotrl.sim2real.actuation import ActuationConfig, DelayedActuation
from robotrl.sim2real.privileged import PrivilegedObs
from robotrl.sim2real.randomization import PhysicsRandomizer, RandomizationConfig, RandomizationTargets
from robotrl.sim2real.sensing import SensingConfig, SensorModel
from robotrl.tasks import make_env
from robotrl.tasks.arm_task import TaskVecEnv


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but no CUDA device is available")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002  (seeds code outside robotrl that uses it)
    torch.manual_seed(seed)


@dataclass
class EpisodeStats:
    """Running returns of the envs' current episodes and the finished ones since the last log."""

    num_envs: int
    returns: torch.Tensor = field(init=False)
    lengths: torch.Tensor = field(init=False)
    successes: torch.Tensor = field(init=False)
    finished: list[tuple[float, int, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.returns = torch.zeros(self.num_envs)
        self.lengths = torch.zeros(self.num_envs, dtype=torch.long)
        self.successes = torch.zeros(self.num_envs, dtype=torch.bool)

    def record(self, reward: torch.Tensor, success: torch.Tensor, done: torch.Tensor) -> int:
        """Account one step; returns how many episodes ended."""
        self.returns += reward
        self.lengths += 1
        self.successes |= success
        if not done.any():
            return 0
        for i in done.nonzero().flatten().tolist():
            self.finished.append((float(self.returns[i]), int(self.lengths[i]), bool(self.successes[i])))
        self.returns[done] = 0.0
        self.lengths[done] = 0
        self.successes[done] = False
        return int(done.sum())

    def flush(self, has_success: bool) -> dict[str, float]:
        if not self.finished:
            return {}
        rets, lens, succ = zip(*self.finished, strict=True)
        self.finished.clear()
        out = {"train/episode_return": float(np.mean(rets)), "train/episode_length": float(np.mean(lens))}
        if has_success:
            out["train/success"] = float(np.mean(succ))
        return out


def make_training_env(cfg: TrainConfig, num_envs: int, render: bool = False, task=None):
    """The task's env (`task`, or the config's); its pixel observations frame-stacked when the agent stacks
    frames."""
    env = make_env(task if task is not None else cfg.task, num_envs=num_envs, render=render)
    frame_stack = cfg.agent.frame_stack
    return FrameStack(env, frame_stack) if frame_stack > 1 and pixel_keys(env.obs_spec) else env


def _simulated_task_env(env) -> TaskVecEnv | None:
    """The built-in simulated task's env under any wrappers (each keeps the env it wraps in `.env`), or None."""
    sim = env
    while sim is not None and not isinstance(sim, TaskVecEnv):
        sim = sim.__dict__.get("env")
    return sim


def _task_vec_env(env, what: str) -> TaskVecEnv:
    """The built-in simulated task's env under any wrappers; refused, naming `what`, where there is none."""
    sim = _simulated_task_env(env)
    if sim is None:
        raise ValueError(
            f"{what}: {env.name!r} is not a built-in simulated task, whose physics robotrl owns; a gymnasium env or "
            "a robot has its own"
        )
    return sim


def add_randomization(env, cfg: RandomizationConfig, seed: int, log: Path | None = None) -> PhysicsRandomizer | None:
    """Randomize the physics of `env`'s simulated task (under any wrappers) as `cfg` says, drawing from `seed`,
    each draw written to `log`; None where `cfg` has no terms. Refused for an env without a built-in task."""
    cfg.validate()
    if not cfg.terms:
        return None
    sim = _task_vec_env(env, f"randomization={cfg.name}")
    randomizer = PhysicsRandomizer(cfg, sim.task.backend, RandomizationTargets.of_task(sim.task), seed, log)
    sim.add_events(randomizer)
    return randomizer


PRIVILEGED_FILE = "privileged.json"  # a run's record of its critic's privileged entry: the names of its columns


def add_privileged(env, randomizer: PhysicsRandomizer | None, run_dir: Path) -> PrivilegedObs:
    """`env` with the drawn physics as a privileged observation entry (randomization.privileged), its columns' names
    written to `run_dir`: evaluation and export rebuild the critic's input size from them."""
    if randomizer is None:
        raise ValueError("randomization.privileged=true needs a randomization preset with terms")
    wrapped = PrivilegedObs(env, randomizer)
    write_atomic(Path(run_dir) / PRIVILEGED_FILE, json.dumps({"names": wrapped.names}, indent=1).encode())
    return wrapped


def privileged_entry(run_dir: Path) -> dict[str, TensorSpec]:
    """The privileged entry the run's critic was trained with (PRIVILEGED_FILE), or {} for a run without one."""
    path = Path(run_dir) / PRIVILEGED_FILE
    if not path.is_file():
        return {}
    return {PRIVILEGED: TensorSpec((len(json.loads(path.read_text())["names"]),))}


def add_actuation(env, cfg: ActuationConfig, seed: int) -> DelayedActuation | None:
    """Put an actuator model (command latency, a low-pass filter) between `env`'s simulated task and its
    actuators; None where `cfg` changes nothing. A task with a model overlay (`task.model_overlay`) adds the
    identified command latency to both ends of `cfg`'s range: the robot's latency is the least drawn, and
    `latency_max` is how much later a command may come than on the identified robot."""
    cfg.validate()
    sim = _simulated_task_env(env)
    overlay = sim.task.model_overlay if sim is not None else None
    if overlay is not None and overlay.command_latency > 0:
        shift = round(overlay.command_latency / sim.task.backend.physics_dt)
        cfg = dataclasses.replace(cfg, latency_min=cfg.latency_min + shift, latency_max=cfg.latency_max + shift)
    if not cfg.enabled:
        return None
    sim = _task_vec_env(env, "actuation")
    actuation = DelayedActuation(cfg, sim.task, seed)
    sim.set_actuation(actuation)
    return actuation


def add_sensing(env, cfg: SensingConfig, seed: int):
    """`env` with a sensor model over its simulated task's observations (delay, drops, bias, noise); `env` itself
    where `cfg` changes nothing."""
    cfg.validate()
    if not cfg.enabled:
        return env
    task = _task_vec_env(env, "sensing").task
    return SensorModel(env, task.observation_entries(task.robot), cfg, seed, task.episode_steps)


def make_replay(cfg: TrainConfig, env, n_step: int, device: torch.device) -> ReplayBuffer | MixedReplay:
    """The run's replay: a FrameReplay (each frame stored once) for pixel observations, else a plain
    ReplayBuffer; with demonstrations or an operator, that buffer online mixed with an offline one."""
    check_replay_fits(cfg, env, n_step, device)
    hindsight = make_hindsight(cfg, env)
    online = _buffer(cfg, env, cfg.replay_capacity, cfg.num_envs, n_step, device, hindsight)
    if not cfg.hil.mixes_offline:
        return online
    # demonstrations and corrections are relabelled alike
    offline = _buffer(cfg, env, cfg.hil.offline_capacity, 1, n_step, device, hindsight)
    hil = cfg.hil
    return MixedReplay(
        online, offline, RatioSchedule(hil.offline_ratio, hil.offline_ratio_final, hil.offline_ratio_steps)
    )


def make_hindsight(cfg: TrainConfig, env) -> Hindsight | None:
    """The run's goal relabelling (`her_ratio` > 0), from its task's GoalSpec; None when off. Refused where
    a relabelled reward could not be computed: a task without a goal, pixels, a learned reward. `cfg` is a
    TrainConfig or robotrl-learner's LearnerConfig (both carry her_ratio, task and hil.reward_classifier)."""
    if cfg.her_ratio == 0:
        return None
    task = find_task(env)
    if task is None or not hasattr(task, "goal_spec"):
        raise ValueError(
            f"her_ratio={cfg.her_ratio}: task {env.name!r} has no goal to relabel (goal-conditioned tasks "
            "define goal_spec(): panda_reach, panda_push, and gymnasium goal envs such as FetchReach-v4); "
            "set her_ratio=0"
        )
    if pixel_keys(env.obs_spec):
        raise ValueError(f"her_ratio={cfg.her_ratio}: hindsight relabelling needs state observations, not pixels")
    if cfg.hil.reward_classifier:
        raise ValueError(
            f"her_ratio={cfg.her_ratio}: a learned reward (hil.reward_classifier) cannot be recomputed for "
            "another goal; set her_ratio=0"
        )
    return Hindsight(task.goal_spec(), cfg.her_ratio, task.episode_steps, ends_at_success(cfg.task))


def check_replay_fits(cfg: TrainConfig, env, n_step: int, device: torch.device) -> None:
    """MemoryError naming the capacity settings where the run's replay would not fit on `device` with what the run
    can store: min(replay_capacity, total_steps) transitions online, the offline buffer full. The buffers are
    sized on the meta device; without this an oversized replay met the OOM killer hours into a run."""
    meta = torch.device("meta")
    buffer = _buffer(cfg, env, cfg.replay_capacity, cfg.num_envs, n_step, meta)
    online = buffer.committed_bytes(min(cfg.replay_capacity, cfg.total_steps), device)
    per_transition = buffer.committed_bytes(cfg.replay_capacity, device) / cfg.replay_capacity
    sizes = {f"replay_capacity={cfg.replay_capacity}": online}
    if cfg.hil.mixes_offline:
        offline = _buffer(cfg, env, cfg.hil.offline_capacity, 1, n_step, meta)
        sizes[f"hil.offline_capacity={cfg.hil.offline_capacity}"] = offline.committed_bytes(
            cfg.hil.offline_capacity, device
        )

    def advice(free: int) -> str:
        room = free - sum(sizes.values()) + online  # what the online buffer may have beside the offline one
        return (
            f"lower replay_capacity ({per_transition:.0f} bytes a transition: about {room // per_transition:,.0f} fit)"
        )

    check_fits("the replay", sizes, device, advice)


def _buffer(cfg: TrainConfig, env, capacity: int, num_envs: int, n_step: int, device, hindsight=None) -> ReplayBuffer:
    return replay_buffer_for(
        env.obs_spec,
        env.action_dim,
        capacity,
        num_envs,
        frame_stack_of(env),
        n_step,
        cfg.agent.replay_gamma,
        device,
        hindsight,
    )


def frame_stack_of(env) -> int:
    """The frames per stacked observation `env` produces (the replay stores what the env stacks)."""
    while env is not None:
        if isinstance(env, FrameStack):
            return env.k
        env = env.__dict__.get("env")
    return 1
