"""The single-process training loop: env -> agent.act -> replay -> agent.update, with logging,
evaluation, checkpoints and resume. Every arrow of the data flow is one line in `train`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import torch

from robotrl.agents import make_agent
from robotrl.agents.schedule import UpdateSchedule
from robotrl.config import TrainConfig
from robotrl.core.durable import write_atomic
from robotrl.data.mixer import MixedReplay, sample_offline
from robotrl.data.replay import ReplayBuffer
from robotrl.hil.intervention import InterventionEnv
from robotrl.hil.setup import ends_at_success, env_task, load_demos, wrap_for_hil
from robotrl.runtime.allocator import retain_freed_memory
from robotrl.runtime.assembly import (
    EpisodeStats,
    add_actuation,
    add_privileged,
    add_randomization,
    add_sensing,
    frame_stack_of,
    make_replay,
    make_training_env,
    resolve_device,
    seed_everything,
)
from robotrl.runtime.checkpoint import kept_checkpoint_note, latest_checkpoint, load_checkpoint, save_checkpoint
from robotrl.runtime.evaluate import evaluate, evaluate_batched
from robotrl.runtime.metrics import MetricsWriter, NonFiniteError, UpdateMetrics
from robotrl.runtime.plot import plot_learning_curve
from robotrl.runtime.progress import Progress
from robotrl.runtime.smoothness import ActionSmoothness
from robotrl.runtime.tracking import check_tracker, open_tracker
from robotrl.sim2real.actuation import ActuationConfig

log = logging.getLogger(__name__)


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


def _crossed(before: int, after: int, interval: int) -> bool:
    return after // interval > before // interval


def train(cfg: TrainConfig, run_dir: Path, resume: bool = False) -> dict[str, float]:
    """Train `cfg.agent` on `cfg.task`, writing everything under `run_dir`; returns the final evaluation."""
    cfg.validate()
    check_tracker(cfg.logger)  # a missing extra fails here, not after the env and replay are built
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
    randomizer = add_randomization(env, cfg.randomization, cfg.seed, run_dir / "randomization.jsonl")
    add_actuation(env, cfg.actuation, cfg.seed)
    env = add_sensing(env, cfg.sensing, cfg.seed)
    if cfg.randomization.privileged:  # after the sensor model: the critic's input is the truth, not a sensor's
        env = add_privileged(env, randomizer, run_dir)
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
    schedule = UpdateSchedule.of(cfg.agent, cfg.learning_starts, cfg.num_envs)
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

    tracker = open_tracker(cfg.logger, cfg.wandb, run_dir, dataclasses.asdict(cfg))
    writer = MetricsWriter(run_dir, resume_step=counters["env_step"] if resume else None, tracker=tracker)
    update_metrics = UpdateMetrics()
    episodes = EpisodeStats(cfg.num_envs)
    smoothness = ActionSmoothness()  # of the policy's exploration actions (not the warm-up's random ones)
    progress = Progress(cfg.total_steps, counters["env_step"], enabled=cfg.progress)
    eval_env = None

    def run_eval(step: int, video: bool) -> dict[str, float]:
        nonlocal eval_env
        if eval_env is None:
            eval_env = make_training_env(cfg, num_envs=cfg.eval_envs, render=cfg.video and cfg.eval_envs == 1)
            add_actuation(eval_env, ActuationConfig(), cfg.seed)  # a model overlay's identified latency only
        video_path = None
        if cfg.eval_envs > 1:  # batched, unfilmed
            result = evaluate_batched(agent, eval_env, cfg.eval_episodes, seed=cfg.seed + 10_000 + step)
        else:
            video_path = run_dir / "videos" / f"eval_step_{step:09d}.mp4" if video and cfg.video else None
            result = evaluate(agent, eval_env, cfg.eval_episodes, seed=cfg.seed + 10_000 + step, video_path=video_path)
        result["wall_s"] = time.perf_counter() - start_time  # since this process started training
        counters["evals"] += 1
        writer.write(step, {f"eval/{k}": v for k, v in result.items()})
        progress.show_eval(result)
        plot_learning_curve(writer.csv_path, run_dir / "learning_curve.png", title=f"{env.name} {cfg.agent.name}")
        writer.write_files(step, {"eval/video": video_path, "learning_curve": run_dir / "learning_curve.png"})
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
    last_log_time, last_log_step, last_log_updates = time.perf_counter(), step, agent.num_updates
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

            if step > update_start:  # the schedule's updates for the env steps past update_start
                for _ in range(schedule.due(step) - schedule.due(max(prev, update_start))):
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
                elapsed = max(now - last_log_time, 1e-9)
                scalars["time/env_steps_per_s"] = (step - last_log_step) / elapsed
                scalars["time/updates_per_s"] = (agent.num_updates - last_log_updates) / elapsed
                last_log_time, last_log_step, last_log_updates = now, step, agent.num_updates
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
