"""`robotrl-learner`: trains on the transitions actors stream to it and publishes weights for them.

robotrl-learner task=panda_reach agent=sac                      # loopback only, port 50051
robotrl-learner server.host=0.0.0.0 server.token_file=token server.tls_cert=cert.pem server.tls_key=key.pem
robotrl-learner hydra.run.dir=runs/learner/arm                  # restarted: resumes what that directory holds
robotrl-learner task=panda_pick_cube hil.demos=[demos/pick] agent.bc_weight=1.0   # HIL-SERL's learner side
robotrl-learner task=panda_push her_ratio=0.8                   # hindsight goals on all that actors send

Each actor's steps land in its own replay stream (robotrl/runtime/transport/storage.py). The update loop runs
`agent.utd_ratio` updates per `agent.update_every` env steps received (across all actors; agents/schedule.py) once
`learning_starts` steps have arrived, and
publishes a new weights version every `weights_every` updates. The actors are not paced by it: an actor in
simulation (control_hz 0) may send steps faster than they are trained on, so the updates trail the ratio, unless it
runs with `max_steps_ahead` (it waits while this learner's `untrained_steps`, reported in every reply, exceed it).
With `total_steps` the learner stops once that many steps have arrived and their updates are made; its actors, told
the figure at registration, stop once it has them. A batch is acknowledged only once it is appended and fsynced to
`<run dir>/wal.log`; a checkpoint (which holds the replay) empties that log and starts it on the checkpoint's
generation. A learner restarted in the same run directory loads the latest checkpoint, then replays the log, so
nothing it acknowledged is lost; a log of an older generation (the learner died between a checkpoint and emptying
the log) is all in the checkpoint and is not replayed. A log damaged before its end (not a crash's torn last record)
stops the start-up, naming the file and offset, until `server.wal_on_corruption=set_aside` says to keep it aside and
replay its intact records. One process at a time holds a run directory (`<run dir>/run.lock`).

With `hil.pretrain_updates=N` the learner first makes N updates on the demonstrations alone (as robotrl-train
does) and publishes those weights before it serves: actors act with the cloned policy from their first step.

Human in the loop, split as HIL-SERL runs it: the operator sits at the actor (robotrl-actor hil.operator=...),
the demonstrations here (`hil.demos`). The storage keeps one offline buffer shared by all actors: the
demonstrations, loaded once at the first start (a checkpoint holds them after that), and every intervened
step the actors send, copied there as contiguous runs; `hil.offline_ratio` of each batch comes from it
(RLPD's 0.5 by default), marked in `Batch.demo` for the agent's optional behaviour-cloning term.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from robotrl.agents import make_agent
from robotrl.agents.schedule import UpdateSchedule
from robotrl.cli_errors import reports_errors
from robotrl.config import register_configs
from robotrl.core.durable import write_atomic
from robotrl.core.memory import check_fits
from robotrl.hil.setup import ends_at_success, load_demos
from robotrl.runtime.allocator import retain_freed_memory
from robotrl.runtime.assembly import make_hindsight, make_training_env, resolve_device, seed_everything
from robotrl.runtime.checkpoint import (
    LATEST,
    kept_checkpoint_note,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from robotrl.runtime.frame_stack import FrameStack
from robotrl.runtime.learner_config import LearnerConfig, to_learner_config
from robotrl.runtime.loop import pretrain_on_demos
from robotrl.runtime.metrics import MetricsWriter, NonFiniteError, UpdateMetrics
from robotrl.runtime.run_config import read_run_config, save_run_config
from robotrl.runtime.run_lock import hold_run_dir
from robotrl.runtime.tracking import check_tracker, open_tracker
from robotrl.runtime.transport.protocol import task_settings
from robotrl.runtime.transport.security import check_serve_security, load_token
from robotrl.runtime.transport.server import serve
from robotrl.runtime.transport.service import LearnerService, LearnerSpec
from robotrl.runtime.transport.storage import ReplayGroup, replay_factory
from robotrl.runtime.transport.wal import WriteAheadLog
from robotrl.runtime.transport.weights import WeightsBoard
from robotrl.tasks import write_deploy_spec_for_run

log = logging.getLogger(__name__)

UPDATES_PER_TURN = 16  # updates between looks at the clock (logging, weights, checkpoints, stop)


class Learner:
    """The agent, its per-actor storage, the service actors call, and the update loop (see the module doc)."""

    def __init__(self, cfg: LearnerConfig, run_dir: Path, token: str | None = None):
        cfg.validate()
        check_tracker(cfg.logger)  # a missing extra fails before anything is built or served
        self.cfg, self.run_dir = cfg, run_dir
        self.schedule = UpdateSchedule.of(cfg.agent, cfg.learning_starts, num_envs=1)  # per env step received
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        seed_everything(cfg.seed)
        self.device = resolve_device(cfg.device)
        if self.device.type == "cpu":  # as the single-process loop: no page faults re-reading each batch
            retain_freed_memory()
        hold_run_dir(run_dir)  # before the write-ahead log is read: another learner may be appending to it
        self.ckpt_root = run_dir / "checkpoints"
        self.token = token if token is not None else load_token(cfg.server.token_file)
        check_serve_security(cfg.server, self.token)  # before anything is built: a refusal costs nothing

        env = make_training_env(cfg, num_envs=1)  # read its spec: what the agent sees, frames stacked
        obs_spec, action_dim = dict(env.obs_spec), env.action_dim
        frame_stack = env.k if isinstance(env, FrameStack) else 1  # the replay stores what the env stacks
        task_name = env.name
        hindsight = make_hindsight(cfg, env)  # refused by name where a relabelled reward cannot be computed
        env.close()
        self.agent = make_agent(cfg.agent, obs_spec, action_dim, self.device)
        self.obs_spec, self.action_dim, self.frame_stack = obs_spec, action_dim, frame_stack
        buffer_args = (frame_stack, cfg.agent.replay_n_step, cfg.agent.replay_gamma, self.device)
        make_buffer = replay_factory(obs_spec, action_dim, cfg.replay_capacity, *buffer_args, hindsight)
        make_offline = replay_factory(obs_spec, action_dim, cfg.hil.offline_capacity, *buffer_args, hindsight)
        meta = (*buffer_args[:-1], torch.device("meta"))  # buffers sized on the meta device allocate nothing
        self._meta_stream = replay_factory(obs_spec, action_dim, cfg.replay_capacity, *meta)
        self._meta_offline = replay_factory(obs_spec, action_dim, cfg.hil.offline_capacity, *meta)(1)
        self.storage = ReplayGroup(
            obs_spec,
            action_dim,
            cfg.replay_capacity,
            make_buffer,
            self.device,
            make_offline=lambda: make_offline(1),  # one shared offline buffer, one env column
            schedule=cfg.hil.schedule(),
            admit=self._check_stream_fits,
        )
        self._check_stream_fits(self.storage, None, 1)  # before serving: the first actor's stream and the offline
        self.demos_loaded: list[str] = []  # datasets in the offline buffer (kept in checkpoints' counters)
        spec = LearnerSpec(
            task=cfg.task.name,
            agent=dataclasses.asdict(cfg.agent),
            obs_spec=obs_spec,
            action_dim=action_dim,
            random_steps=0 if cfg.hil.pretrain_updates else cfg.learning_starts,
            total_steps=cfg.total_steps,
            her_ratio=cfg.her_ratio,
            task_settings=task_settings(cfg.task),
            max_actors=cfg.max_actors,
            max_batch_steps=cfg.max_batch_steps,
            max_message_bytes=cfg.server.max_message_bytes,
            heartbeat_timeout_s=cfg.server.heartbeat_timeout_s,
            demo_rewards=("classifier" if cfg.hil.reward_classifier else "recorded") if cfg.hil.demos else None,
        )
        self.wal = WriteAheadLog(run_dir / "wal.log", cfg.server.wal_on_corruption)
        self.board = WeightsBoard(incarnation=secrets.token_hex(4))
        self.service = LearnerService(spec, self.storage, self.wal, self.board)
        self.clock_steps = 0  # env steps the agent's exploration clock has counted
        self.env_name = task_name
        self.update_metrics = UpdateMetrics()
        self.pretrained_updates = 0  # updates made on the demos alone, before the first env step
        self.resumed = self._restore()
        if cfg.hil.pretrain_updates and self.agent.num_updates == 0:  # not again once a checkpoint holds them
            self._pretrain()
        self._report_progress(self._trainable(self.service.env_steps))  # a restart's actors see its real progress
        self.server = None
        self.port: int | None = None
        self._alive: set[str] = set()
        self.started = time.monotonic()
        self._episodes_logged = self._episode_counts()

    def _check_stream_fits(self, storage: ReplayGroup, stream_id: str | None, num_envs: int) -> None:
        """MemoryError where a new stream of `num_envs` envs, as full as `total_steps` lets it get (0: until stopped,
        so full), would not fit beside what the open streams and the offline buffer (made on demos or takeovers)
        have still to commit. Run before serving for the first actor's stream, then as each actor's stream is made
        (at its first registration): an actor too many is refused by name instead of the kernel's OOM killer
        ending the learner and every other actor's run."""
        cfg, device = self.cfg, self.device
        stored = cfg.replay_capacity if cfg.total_steps == 0 else min(cfg.replay_capacity, cfg.total_steps)
        new = self._meta_stream(num_envs)
        whose = "one actor's stream" if stream_id is None else f"actor {stream_id!r}'s stream, {num_envs} envs"
        flags = new.horizon * num_envs  # the stream's intervention flags, a bool per row (ReplayGroup.open_stream)
        new_bytes = new.committed_bytes(stored, device) + flags
        sizes = {f"replay_capacity={cfg.replay_capacity} ({whose})": new_bytes}
        to_fill = sum(
            s.buffer.committed_bytes(stored, device) - s.buffer.committed_bytes(len(s.buffer), device)
            for s in storage.streams.values()
        )
        if to_fill:
            sizes[f"{len(storage.streams)} open streams, still to fill"] = to_fill
        capacity, offline = cfg.hil.offline_capacity, storage.offline
        if offline is None:
            offline_bytes = self._meta_offline.committed_bytes(capacity, device)
        else:
            offline_bytes = offline.committed_bytes(capacity, device) - offline.committed_bytes(len(offline), device)
        if offline_bytes:
            sizes[f"hil.offline_capacity={capacity}"] = offline_bytes

        def advice(free: int) -> str:
            per_transition = (new.committed_bytes(cfg.replay_capacity, device) + flags) / cfg.replay_capacity
            room = max(0, free - sum(sizes.values()) + new_bytes)  # what the new stream may have beside the rest
            fit = f"about {room // per_transition:,.0f} fit beside the rest"
            fewer = f" or run fewer actors ({len(storage.streams)} streams are open)" if storage.streams else ""
            return f"lower replay_capacity ({per_transition:.0f} bytes a transition: {fit}){fewer}"

        check_fits("the learner's replay", sizes, device, advice)

    def _restore(self) -> bool:
        """Load the latest checkpoint, if any, and the demonstrations it does not hold, then the write-ahead log
        (the order in which they first arrived); True if anything was restored."""
        service, resumed = self.service, False
        if (self.ckpt_root / LATEST).exists():
            path = latest_checkpoint(self.ckpt_root)
            counters = load_checkpoint(path, self.agent, self.storage)
            self.agent.num_updates = counters["updates"]
            service.ledger.load_state(counters["streams"])
            service.env_steps = self.clock_steps = counters["env_steps"]
            service.last_checkpoint_step = counters["env_steps"]
            service.wal_generation = counters.get("wal_generation", 0)
            self.demos_loaded = list(counters.get("hil_demos", []))
            self.pretrained_updates = counters.get("pretrain_updates", 0)
            resumed = True
            log.info("resumed from %s at %d env steps, %d updates", path, counters["env_steps"], counters["updates"])
        self._load_demos()
        replayed = service.replay_log()
        if replayed:
            log.info("restored %d acknowledged batches from the write-ahead log", replayed)
        service.updates = self.agent.num_updates
        if self.agent.num_updates:
            self.board.publish(self.agent, self.agent.num_updates)  # actors get the resumed weights at once
        return resumed or replayed > 0

    def _load_demos(self) -> None:
        """Write the `hil.demos` datasets not in the offline buffer yet into it (all of them at the first start;
        after a restart the checkpoint holds those it had)."""
        paths = [str(Path(p).resolve()) for p in self.cfg.hil.demos]
        for gone in sorted(set(self.demos_loaded) - set(paths)):
            log.warning("demonstrations %s are no longer in hil.demos but stay in the offline buffer", gone)
        new = [p for p in paths if p not in self.demos_loaded]
        if not new:
            return
        written = self.storage.load_demos(
            lambda offline: load_demos(
                new,
                offline,
                self.obs_spec,
                self.action_dim,
                self.frame_stack,
                self.env_name,
                self.cfg.hil.reward_classifier,
                getattr(self.cfg.task, "reward", None),
                ends_at_success(self.cfg.task),
            )
        )
        self.demos_loaded += new
        log.info("offline buffer: %d demonstration transitions from %d datasets", written, len(new))

    def _pretrain(self) -> None:
        """hil.pretrain_updates updates on the offline buffer alone, then the weights actors start from."""
        agent, updates = self.agent, self.cfg.hil.pretrain_updates
        pretrain_on_demos(agent, self.storage.ensure_offline(), updates, agent.cfg.batch_size, self.update_metrics)
        self.pretrained_updates = agent.num_updates
        self.service.updates = agent.num_updates
        self.board.publish(agent, agent.num_updates)

    def start_serving(self) -> int:
        service = self.service
        self.server, self.port = serve(service.handlers(), self.cfg.server, self.token, service.request_limits())
        self.started = time.monotonic()  # actors get server.heartbeat_timeout_s from here to come back
        write_atomic(self.run_dir / "learner_address", f"{self.cfg.server.host}:{self.port}\n".encode())
        return self.port

    def updates_due(self, env_steps: int) -> int:
        """Updates owed after `env_steps` received: those made on the demos before serving, then the schedule's
        (agents/schedule.py) past learning_starts."""
        return self.pretrained_updates + self.schedule.due(env_steps)

    def _trainable(self, received: int) -> int:
        """Of the env steps received, those the learner trains on: up to total_steps. An actor unpaced in simulation
        can send steps faster than they are trained on; were the updates due for the steps past total_steps made,
        the learner would never catch up and stop."""
        return min(received, self.cfg.total_steps) if self.cfg.total_steps else received

    def _report_progress(self, training: int) -> int:
        """The updates due for `training` env steps; tells the service which of them those made so far cover (what
        paced actors wait on, `LearnerService.untrained_steps`)."""
        due = self.updates_due(training)
        with self.service.lock:
            self.service.trained_steps = training - self._steps_behind(due)
        return due

    def _steps_behind(self, due: int) -> int:
        """The env steps whose share of the `due` updates is not made yet (updates_due's step, inverted)."""
        return self.schedule.env_steps_for(due - self.agent.num_updates)

    def run(self, stop: threading.Event) -> dict[str, Any]:
        """Serve and train until `stop` is set or `total_steps` env steps have arrived and the updates due for
        them are made (steps that arrive beyond it are stored, not trained on)."""
        cfg, agent, service = self.cfg, self.agent, self.service
        if self.server is None:
            self.start_serving()
        tracker = open_tracker(cfg.logger, cfg.wandb, self.run_dir, dataclasses.asdict(cfg))
        writer = MetricsWriter(self.run_dir, resume_step=service.env_steps if self.resumed else None, tracker=tracker)
        update_metrics = self.update_metrics
        pretraining = update_metrics.flush(0)  # this start's pretraining losses, if it pretrained
        if pretraining and not self.resumed:  # a restart's first start logged them already: not mixed into step N
            writer.write(0, pretraining)
        published = agent.num_updates
        logged = checkpointed = service.env_steps
        last_log = (time.perf_counter(), service.env_steps, agent.num_updates)
        try:
            while not stop.is_set():
                with service.lock:
                    received = service.env_steps
                training = self._trainable(received)
                self._advance_clock(training)
                due = self._report_progress(training)
                if agent.num_updates < due and len(self.storage):
                    for _ in range(min(due - agent.num_updates, UPDATES_PER_TURN)):
                        with service.lock:
                            batch = self.storage.sample(agent.cfg.batch_size)
                        update_metrics.add(agent.update(batch))  # outside the lock: actors keep pushing
                    self._report_progress(training)
                    service.updates = agent.num_updates
                    if agent.num_updates - published >= cfg.weights_every:
                        self.board.publish(agent, agent.num_updates)
                        published = agent.num_updates
                elif cfg.total_steps and received >= cfg.total_steps:
                    break
                else:
                    with service.arrived:
                        service.arrived.wait(timeout=0.05)
                if received // cfg.log_interval > logged // cfg.log_interval:
                    logged = received
                    writer.write(received, {**update_metrics.flush(received), **self._scalars(last_log)})
                    last_log = (time.perf_counter(), received, agent.num_updates)
                if received - checkpointed >= cfg.checkpoint_interval:  # bounds the write-ahead log
                    checkpointed = received
                    self.checkpoint(writer, update_metrics)
                self._watch_actors()
            # a failure skips this last checkpoint (a diverged agent must not overwrite a good one); what was
            # acknowledged is in the write-ahead log either way
            self.checkpoint(writer, update_metrics)
        except NonFiniteError as err:
            resume_with = f"robotrl-learner hydra.run.dir={self.run_dir}"
            raise NonFiniteError(f"{err}; {kept_checkpoint_note(self.ckpt_root, resume_with)}") from err
        finally:
            if self.server is not None:
                self.server.stop(grace=1.0).wait(5.0)
            writer.close()
            self.wal.close()
        return service.snapshot()

    def checkpoint(self, writer: MetricsWriter, update_metrics: UpdateMetrics) -> None:
        """Save agent, replay and delivery state together, then empty the write-ahead log."""
        service = self.service
        with service.lock:
            held_from = time.monotonic()
            step = service.env_steps
            if step == service.last_checkpoint_step:
                return  # nothing arrived since: the log is empty, the checkpoint current but for updates
            writer.write(step, update_metrics.flush(step))  # raises on a non-finite loss: nothing is saved
            counters = {
                "env_steps": step,
                "updates": self.agent.num_updates,
                "streams": service.ledger.state(),
                "hil_demos": self.demos_loaded,
                "pretrain_updates": self.pretrained_updates,
                "wal_generation": service.wal_generation + 1,
            }
            save_checkpoint(self.ckpt_root, step, self.agent, self.storage, counters, keep=self.cfg.keep_checkpoints)
            # a crash before this line leaves the old generation's log, which a restart then skips
            service.start_log_generation(counters["wal_generation"])
            service.last_checkpoint_step = step
            # no actor could be heard while this held the lock (seconds for a large pixel replay): that time
            # does not count as their silence, or live actors' open intervention runs would be closed
            service.ledger.excuse_silence(time.monotonic() - held_from)
        log.info("checkpoint at %d env steps, %d updates", step, self.agent.num_updates)

    def _watch_actors(self) -> None:
        """Log actors going silent (no call within server.heartbeat_timeout_s) and coming back; close the open
        intervention runs of actors that are not live (after a restart, once they had that long to come back),
        so their corrections reach the offline buffer even if the actor never returns."""
        now, timeout = time.monotonic(), self.cfg.server.heartbeat_timeout_s
        with self.service.lock:
            alive = set(self.service.ledger.alive(now, timeout))
            stranded = [a for a in self.storage.streams if a not in alive and self.storage.open_run_steps(a)]
        for actor in sorted(self._alive - alive):
            log.warning("actor %r lost: silent for over %.1f s", actor, timeout)
        for actor in sorted(alive - self._alive):
            log.info("actor %r is live", actor)
        self._alive = alive
        if stranded and now - self.started >= timeout:
            for actor in stranded:
                written = self.service.end_open_runs(actor)
                log.info("closed actor %r's open intervention runs: %d transitions offline", actor, written)

    def _advance_clock(self, received: int) -> None:
        """The learner's agent mirrors the actors' clock as the single-process loop's shared agent does (DrQ-v2's
        std schedule reads it in `update`). Exploration is never reset here, so gSDE and chunk state stay untouched."""
        if received > self.clock_steps:
            self.agent.advance_exploration(torch.zeros(received - self.clock_steps, dtype=torch.bool))
            self.clock_steps = received

    def _scalars(self, last: tuple[float, int, int]) -> dict[str, float]:
        status = self.service.snapshot()
        elapsed = max(time.perf_counter() - last[0], 1e-9)
        streams = status["streams"].values()
        scalars = {
            "learner/env_steps_per_s": (status["env_steps"] - last[1]) / elapsed,
            "learner/updates_per_s": (status["updates"] - last[2]) / elapsed,
            "learner/untrained_steps": float(status["untrained_steps"]),
            "learner/actors_alive": float(status["actors_alive"]),
            "learner/weights_version": float(status["version"]),
            "learner/stored": float(sum(s["stored"] for s in streams)),
            "learner/interventions": float(sum(s["interventions"] for s in streams)),
            "learner/rejected": float(status["rejected"]),
        }
        offline = status["offline"]
        if offline is not None:
            with self.service.lock:
                scalars["hil/offline_ratio"] = self.storage.offline_ratio
            scalars["hil/offline_transitions"] = float(offline["stored"])
            scalars["hil/offline_interventions"] = float(offline["interventions"])
        (episodes, intervened), (episodes_before, intervened_before) = self._episode_counts(), self._episodes_logged
        if episodes > episodes_before and scalars["learner/interventions"]:  # all actors, episodes ended since
            scalars["hil/interventions_per_episode"] = (intervened - intervened_before) / (episodes - episodes_before)
        self._episodes_logged = (episodes, intervened)
        return scalars

    def _episode_counts(self) -> tuple[int, int]:
        """(episodes ended, their intervened steps), all streams, ever."""
        with self.service.lock:
            streams = self.storage.streams.values()
            return sum(s.episodes for s in streams), sum(s.episode_interventions for s in streams)


# ---- Hydra entry point -----------------------------------------------------------------------------------

register_configs()
ConfigStore.instance().store(name="learner_schema", node=LearnerConfig)

_FIXED_ON_RESTART = ("agent", "task")


def _check_same_experiment(cfg: DictConfig, saved_path: Path) -> None:
    saved = read_run_config(saved_path.parent)  # in today's layout: a run saved before still restarts
    for key in _FIXED_ON_RESTART:
        if OmegaConf.to_container(saved[key], resolve=True) != OmegaConf.to_container(cfg[key], resolve=True):
            raise ValueError(
                f"{saved_path.parent} holds a learner for another {key} ({OmegaConf.to_container(saved[key])}); "
                "use a new run directory"
            )


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    learner_cfg = to_learner_config(cfg)
    saved = run_dir / "config.yaml"
    if saved.exists():
        _check_same_experiment(cfg, saved)
    learner = Learner(learner_cfg, run_dir)
    if not saved.exists():
        save_run_config(cfg, run_dir)
    # what a robot needs to run its policy
    write_deploy_spec_for_run(learner_cfg.task, learner_cfg.agent.frame_stack, run_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    learner.start_serving()
    log.info(
        "learner for %s (%s) at %s:%d, run directory %s",
        learner.env_name,
        learner_cfg.agent.name,
        learner_cfg.server.host,
        learner.port,
        run_dir.resolve(),
    )
    return learner.run(stop)


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="learner")
@reports_errors("robotrl-learner")
def _hydra_main(cfg: DictConfig) -> None:
    run(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
