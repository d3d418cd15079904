"""The single-process training loop: env -> agent.act -> replay -> agent.update, with logging,
evaluation, checkpoints and resume. Every arrow of the data flow is one line in `train`.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from robotrl.agents import make_agent
from robotrl.config import TrainConfig
from robotrl.core.durable import write_atomic
from robotrl.core.memory import check_fits
from robotrl.core.spec import pixel_keys
from robotrl.data.frame_replay import replay_buffer_for
from robotrl.data.hindsight import Hindsight
from robotrl.data.mixer import MixedReplay, RatioSchedule, sample_offline
from robotrl.data.replay import ReplayBuffer
from robotrl.hil.intervention import InterventionEnv
from robotrl.hil.scripted_operator import find_task
from robotrl.hil.setup import ends_at_success, env_task, load_demos, wrap_for_hil
from robotrl.runtime.allocator import retain_freed_memory
from robotrl.runtime.checkpoint import kept_checkpoint_note, latest_checkpoint, load_checkpoint, save_checkpoint
from robotrl.runtime.evaluate import evaluate
from robotrl.runtime.frame_stack import FrameStack
from robotrl.runtime.metrics import MetricsWriter, NonFiniteError, UpdateMetrics
from robotrl.runtime.plot import plot_learning_curve
from robotrl.runtime.progress import Progress
from robotrl.runtime.smoothness import ActionSmoothness
from robotrl.tasks import make_env

log = logging.getLogger(__name__)


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
    frame_stack = getattr(cfg.agent, "frame_stack", 1)
    return FrameStack(env, frame_stack) if frame_stack > 1 and pixel_keys(env.obs_spec) else env


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


def pretrain_on_demos(agent, offline: ReplayBuffer, updates: int, batch_size: int, metrics: UpdateMetrics) -> None:
    """`updates` gradient updates on the offline buffer alone (hil.pretrain_updates), before the first env step
    (`Agent.pretrain_update`: SAC's and the chunk critic's actors clone the demos while their critics learn
    that policy's values): the run starts acting with them, instead of random actions and untrained critics."""
    if len(offline) < batch_size:
        raise ValueError(
            f"hil.pretrain_updates={updates}: the demonstrations hold {len(offline)} transitions, fewer than "
            f"agent.batch_size={batch_size}"
        )
    start = time.perf_counter()
    for _ in range(updates):
        metrics.add(agent.pretrain_update(sample_offline(offline, batch_size)))
    log.info(
        "pretrained on %d demonstration transitions: %d updates in %.0f s",
        len(offline),
        updates,
        time.perf_counter() - start,
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
            "define goal_spec(): panda_reach, panda_push); set her_ratio=0"
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
        cfg.agent.gamma,
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


def _crossed(before: int, after: int, interval: int) -> bool:
    return after // interval > before // interval


def train(cfg: TrainConfig, run_dir: Path, resume: bool = False) -> dict[str, float]:
    """Train `cfg.agent` on `cfg.task`, writing everything under `run_dir`; returns the final evaluation."""
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        retain_freed_memory()
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root = run_dir / "checkpoints"

    terminate_on_success = ends_at_success(cfg.task)
    env = make_training_env(cfg, cfg.num_envs, task=env_task(cfg.task, cfg.hil))
    env = wrap_for_hil(env, cfg.hil, terminate_on_success)
    agent = make_agent(cfg.agent, env.obs_spec, env.action_dim, device)
    replay = make_replay(cfg, env, agent.replay_n_step, device)
    # a resumed replay holds them already, unless the checkpoints were taken without it
    if isinstance(replay, MixedReplay) and cfg.hil.demos and not (resume and cfg.checkpoint_replay):
        load_demos(
            cfg.hil.demos,
            replay.offline,
            env.obs_spec,
            env.action_dim,
            frame_stack_of(env),
            env.name,
            cfg.hil.reward_classifier,
            getattr(cfg.task, "reward", None),
            terminate_on_success,
        )
    update_every = getattr(cfg.agent, "update_every", 1)
    counters = {"env_step": 0, "episodes": 0, "updates": 0, "evals": 0}
    if resume:
        path = latest_checkpoint(ckpt_root)
        counters.update(load_checkpoint(path, agent, replay if cfg.checkpoint_replay else None))
        agent.num_updates = counters["updates"]
        log.info("resumed from %s at env step %d", path, counters["env_step"])
        finished = run_dir / "summary.json"
        if counters["env_step"] >= cfg.total_steps and finished.exists():  # its final evaluation is in already
            log.info("the run is complete at %d env steps (total_steps=%d)", counters["env_step"], cfg.total_steps)
            env.close()
            return json.loads(finished.read_text())

    writer = MetricsWriter(run_dir, resume_step=counters["env_step"] if resume else None)
    update_metrics = UpdateMetrics()
    episodes = EpisodeStats(cfg.num_envs)
    smoothness = ActionSmoothness()  # of the policy's exploration actions (not the warm-up's random ones)
    progress = Progress(cfg.total_steps, counters["env_step"], enabled=cfg.progress)
    eval_env = None

    def run_eval(step: int, video: bool) -> dict[str, float]:
        nonlocal eval_env
        if eval_env is None:
            eval_env = make_training_env(cfg, num_envs=1, render=cfg.video)
        video_path = run_dir / "videos" / f"eval_step_{step:09d}.mp4" if video and cfg.video else None
        result = evaluate(agent, eval_env, cfg.eval_episodes, seed=cfg.seed + 10_000 + step, video_path=video_path)
        result["wall_s"] = time.perf_counter() - start_time  # since this process started training
        counters["evals"] += 1
        writer.write(step, {f"eval/{k}": v for k, v in result.items()})
        progress.show_eval(result)
        plot_learning_curve(writer.csv_path, run_dir / "learning_curve.png", title=f"{env.name} {cfg.agent.name}")
        return result

    def diverged(err: NonFiniteError) -> NonFiniteError:  # nothing is saved after it: say what a resume starts from
        return NonFiniteError(f"{err}; {kept_checkpoint_note(ckpt_root, f'resume={run_dir}')}")

    def checkpoint(step: int) -> None:
        counters["updates"] = agent.num_updates  # also mid-step (an interrupt among a step's updates)
        writer.write(step, update_metrics.flush(step))  # raises on a non-finite loss: nothing is saved
        save_checkpoint(
            ckpt_root, step, agent, replay if cfg.checkpoint_replay else None, dict(counters), keep=cfg.keep_checkpoints
        )

    pretrained = cfg.hil.pretrain_updates > 0  # the policy acts from the first env step
    if pretrained and agent.num_updates == 0:  # a resumed run was pretrained before its first step
        pretrain_on_demos(agent, replay.offline, cfg.hil.pretrain_updates, cfg.agent.batch_size, update_metrics)
        counters["updates"] = agent.num_updates
        writer.write(counters["env_step"], update_metrics.flush(counters["env_step"]))
    step = counters["env_step"]
    # updates start after learning_starts env steps; resumed without its replay, once the replay holds that
    # many again (at least a batch): a run must never train on a handful of rows
    update_start = cfg.learning_starts
    if resume and not cfg.checkpoint_replay:
        update_start = step + max(cfg.learning_starts, cfg.agent.batch_size)
    start_time = time.perf_counter()
    obs = env.reset(seed=cfg.seed + step)
    agent.reset_exploration(cfg.num_envs)  # every env starts an episode here (also after a resume)
    episode_start = torch.ones(cfg.num_envs, dtype=torch.bool)
    first_add = True
    last_log_time, last_log_step = time.perf_counter(), step
    try:
        while step < cfg.total_steps:
            if step < cfg.learning_starts and not pretrained:
                action = torch.rand(cfg.num_envs, env.action_dim) * 2.0 - 1.0
            else:
                action = agent.act({k: v.to(device) for k, v in obs.items()}).cpu()
                if not torch.isfinite(action).all():
                    update_metrics.flush(step)  # names the loss that diverged, if one did
                    raise NonFiniteError(f"the policy produced a non-finite action at env step {step}")
                smoothness.add(action, episode_start)
            result = env.step(action)
            episode_start = result.terminated | result.truncated
            agent.advance_exploration(episode_start)  # the actor's clock: gSDE resamples here, never in update
            executed = action if result.action is None else result.action  # an operator's, where it took over
            if first_add:
                replay.check_step(result.next_obs, executed)
                first_add = False
            transition = (obs, executed, result.reward, result.next_obs, result.terminated, result.truncated)
            if isinstance(replay, MixedReplay):  # corrections also go to the offline buffer
                replay.add(*transition, intervened=result.intervened)
            else:
                replay.add(*transition)
            obs = result.obs
            counters["episodes"] += episodes.record(result.reward, result.success, episode_start)
            prev, step = step, step + cfg.num_envs
            counters["env_step"] = step

            if step > update_start:  # utd_ratio updates per `update_every` env steps past update_start
                rounds = step // update_every - max(prev, update_start) // update_every
                for _ in range(cfg.agent.utd_ratio * rounds):
                    update_metrics.add(agent.update(replay.sample(cfg.agent.batch_size)))
                counters["updates"] = agent.num_updates

            progress.advance(step - prev)
            if _crossed(prev, step, cfg.log_interval):
                now = time.perf_counter()
                scalars = update_metrics.flush(step)
                scalars.update(episodes.flush(env.has_success))
                scalars.update({f"train/{k}": v for k, v in smoothness.flush().items()})
                if isinstance(env, InterventionEnv):
                    scalars.update({f"hil/{k}": v for k, v in env.flush_stats().items()})
                if isinstance(replay, MixedReplay):
                    scalars["hil/offline_ratio"] = replay.offline_ratio
                    scalars["hil/offline_transitions"] = float(len(replay.offline))
                scalars["time/env_steps_per_s"] = (step - last_log_step) / max(now - last_log_time, 1e-9)
                last_log_time, last_log_step = now, step
                writer.write(step, scalars)
                progress.show_train(scalars)
            if _crossed(prev, step, cfg.eval_interval) and step < cfg.total_steps:
                run_eval(step, video=False)
            if _crossed(prev, step, cfg.checkpoint_interval) and step < cfg.total_steps:
                checkpoint(step)
    except NonFiniteError as err:
        raise diverged(err) from err
    except KeyboardInterrupt:
        log.warning("interrupted at env step %d; saving a checkpoint to resume from", step)
        checkpoint(step)
        raise
    finally:
        progress.close()

    try:
        checkpoint(step)
    except NonFiniteError as err:
        raise diverged(err) from err
    final_eval = run_eval(step, video=True)
    summary = {
        "env_steps": step,
        "episodes": counters["episodes"],
        "updates": counters["updates"],
        **{f"eval/{k}": v for k, v in final_eval.items()},
    }
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=1).encode())
    writer.close()
    env.close()
    if eval_env is not None:
        eval_env.close()
    return summary
