"""The learner's side of the service: registration, durable transition intake, weights, heartbeats, status.

Handlers run on gRPC's threads; the learner's update loop runs on its own. They share `lock` (storage,
ledger, write-ahead log and counters) and `arrived`, a condition the loop waits on for new steps. A pushed
batch is decoded and checked outside the lock, then, under it: dropped if it was stored before (resend),
appended to the write-ahead log and fsynced, added to storage, and only then acknowledged.

The log also holds the learner's own decisions that change storage and cannot be read off the batches:
`end_runs` records (an actor went silent, so its open intervention runs were closed), so a replayed log
rebuilds the offline buffer exactly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from robotrl.core.spec import ObsSpec
from robotrl.runtime.transport.ledger import Arrival, Delivery, Ledger
from robotrl.runtime.transport.protocol import (
    HEARTBEAT,
    PROTOCOL_VERSION,
    PUSH,
    REGISTER,
    STATUS,
    WEIGHTS,
    RpcFailure,
    actor_id,
    check_version,
    field,
    session_of,
)
from robotrl.runtime.transport.storage import ReplayGroup
from robotrl.runtime.transport.wal import WriteAheadLog
from robotrl.runtime.transport.weights import WeightsBoard
from robotrl.runtime.transport.wire import WireError, check_transitions, decode, encode, spec_to_json

log = logging.getLogger(__name__)

SMALL_REQUEST_BYTES = 1 << 16
END_RUNS = "end_runs"  # write-ahead record kind: close an actor's open intervention runs
# write-ahead record kind, first in the log: the checkpoint generation whose successors the log holds. A log
# of an older generation was left by a crash between a checkpoint and the log's truncation: the checkpoint
# holds all of it, and replaying it would store again what an actor sent under a session since replaced.
GENERATION = "generation"


@dataclass
class LearnerSpec:
    """What an actor must match, and is told at registration."""

    task: str
    agent: dict[str, Any]  # the agent's config dataclass as JSON (its `name` selects the class)
    obs_spec: ObsSpec
    action_dim: int
    random_steps: int  # env steps (all actors) the actors act randomly before the policy: 0 once pretrained
    max_actors: int
    max_batch_steps: int
    max_message_bytes: int
    heartbeat_timeout_s: float
    # how the demonstrations in the offline buffer are rewarded, if there are any: None (no demos), "recorded"
    # (as recorded) or "classifier" (a reward classifier's verdicts); an actor must score its steps the same way
    demo_rewards: str | None = None
    total_steps: int = 0  # env steps (all actors) the learner trains on, then stops; 0: until stopped
    her_ratio: float = 0.0  # goal relabelling recomputes the task's reward: no actor may score with a classifier
    # the learner's task_settings(); an actor registering with other ones is refused (None: not checked)
    task_settings: dict[str, Any] | None = None


class LearnerService:
    def __init__(self, spec: LearnerSpec, storage: ReplayGroup, wal: WriteAheadLog, board: WeightsBoard):
        self.spec, self.storage, self.wal, self.board = spec, storage, wal, board
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.ledger = Ledger()
        self.env_steps = 0  # transitions stored, all streams
        self.rejected = 0  # pushes refused
        self.wal_replayed = 0  # batches restored from the write-ahead log at start
        self.wal_generation = 0  # the loaded checkpoint's generation (0: none, or one saved before generations)
        # set by the learner's loop, reported by Status
        self.updates = 0
        # env steps whose updates the learner has made (its loop sets it each turn); the rest of those received, up
        # to the spec's total_steps, are `untrained_steps`, what a paced actor (max_steps_ahead) waits on
        self.trained_steps = 0
        self.last_checkpoint_step: int | None = None

    def request_limits(self) -> dict[str, int]:
        """The largest request each method but Push takes: none carries tensors."""
        return {method: SMALL_REQUEST_BYTES for method in (REGISTER, WEIGHTS, HEARTBEAT, STATUS)}

    def handlers(self) -> dict[str, Callable[[bytes], bytes]]:
        return {
            REGISTER: self.register,
            PUSH: self.push,
            WEIGHTS: self.weights,
            HEARTBEAT: self.heartbeat,
            STATUS: self.status,
        }

    # ---- methods --------------------------------------------------------------------------------------

    @property
    def untrained_steps(self) -> int:
        """Env steps received (up to the spec's total_steps) whose updates are not made yet; read under `lock`."""
        total = self.spec.total_steps
        received = min(self.env_steps, total) if total else self.env_steps
        return max(0, received - self.trained_steps)

    def register(self, request: bytes) -> bytes:
        header, _ = decode(request, SMALL_REQUEST_BYTES)
        check_version(header)
        actor, session = actor_id(header), session_of(header)
        num_envs, task = field(header, "num_envs", int), field(header, "task", str)
        if not 1 <= num_envs <= self.storage.capacity:
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"num_envs must be between 1 and the replay capacity {self.storage.capacity}, got {num_envs}",
            )
        if task != self.spec.task:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION, f"the actor runs task {task!r}, this learner {self.spec.task!r}"
            )
        self._check_task_settings(header.get("task_settings"))
        self._check_rewards_match(header.get("learned_reward", False))
        with self.lock:
            if actor not in self.ledger.actors and len(self.ledger.actors) >= self.spec.max_actors:
                raise RpcFailure(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this learner takes at most {self.spec.max_actors} actors (max_actors); {actor!r} is one more",
                )
            try:
                self.storage.open_stream(actor, num_envs)  # its buffer, allocated now: misfits fail here, by name
            except ValueError as err:
                raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
            except MemoryError as err:  # refused before allocating: the learner and its other actors go on
                log.warning("refused actor %r: %s", actor, err)
                raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
            delivery, new_session = self.ledger.register(
                actor, session, num_envs, time.monotonic(), self.spec.heartbeat_timeout_s
            )
            if new_session:
                self.storage.cut(actor)  # a restarted actor's envs restart: its stored episodes end here
                log.info("actor %r registered (a new session, %d envs)", actor, num_envs)
            weights_id, version = self.board.current()
            reply = {
                "agent": self.spec.agent,
                "obs_spec": spec_to_json(self.spec.obs_spec),
                "action_dim": self.spec.action_dim,
                "random_steps": self.spec.random_steps,
                "total_steps": self.spec.total_steps,
                "max_batch_steps": self.spec.max_batch_steps,
                "max_message_bytes": self.spec.max_message_bytes,
                "acked_seq": delivery.acked_seq,
                "env_steps": self.env_steps,
                "untrained_steps": self.untrained_steps,
                "weights_id": weights_id,
                "version": version,
            }
        return encode({}, reply)

    def _check_task_settings(self, sent) -> None:
        """An actor stepping the task with another reward, episode length, control or observations than the
        learner's config would fill its replay with steps that mean something else than the learner assumes (a
        sparse reward beside dense demos, episodes relabelled over the wrong length): refused, naming the keys."""
        ours = self.spec.task_settings
        if ours is None:
            return
        if sent is None:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the actor sent no task_settings (an older robotrl-actor): run the same robotrl on both",
            )
        if not isinstance(sent, dict):
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task_settings must be the actor's task config (an object), got {type(sent).__name__}",
            )
        missing = object()
        differ = sorted(k for k in sent.keys() | ours.keys() if sent.get(k, missing) != ours.get(k, missing))
        if differ:

            def shown(settings: dict, key: str) -> str:
                return repr(settings[key]) if key in settings else "unset"

            pairs = ", ".join(f"task.{k}={shown(sent, k)} (the learner's: {shown(ours, k)})" for k in differ)
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the actor's task config differs from the learner's: {pairs}; run the same task settings on both",
            )

    def _check_rewards_match(self, learned_reward) -> None:
        """Demonstrations and an actor's steps must share one reward function: half of each batch is drawn
        from the demos, and a demo success scored -1..0 beside online 0..1 teaches that success is worthless."""
        if not isinstance(learned_reward, bool):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"learned_reward must be a bool, got {learned_reward!r}")
        if learned_reward and self.spec.her_ratio:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this learner relabels goals (her_ratio={self.spec.her_ratio:g}) with the task's reward, which an "
                "actor scoring its steps with a reward classifier does not use: drop the actor's "
                "hil.reward_classifier or set the learner's her_ratio=0",
            )
        if self.spec.demo_rewards is None or learned_reward == (self.spec.demo_rewards == "classifier"):
            return
        if learned_reward:
            message = (
                "the actor's rewards come from a reward classifier, this learner's demonstrations keep their recorded "
                "rewards: give the learner the same hil.reward_classifier"
            )
        else:
            message = (
                "this learner rewards its demonstrations with a reward classifier, the actor does not: give the actor "
                "the same hil.reward_classifier"
            )
        raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, message)

    def push(self, request: bytes) -> bytes:
        try:
            return self._push(request)
        except Exception:
            with self.lock:
                self.rejected += 1
            raise

    def _push(self, request: bytes) -> bytes:
        header, tensors = decode(request, self.spec.max_message_bytes)
        check_version(header)
        actor, session = actor_id(header), session_of(header)
        seq, actor_env_step = field(header, "seq", int), field(header, "env_step", int)
        with self.lock:
            num_envs = self.ledger.session(actor, session).num_envs
        steps = check_transitions(
            tensors, self.spec.obs_spec, self.spec.action_dim, num_envs, self.spec.max_batch_steps
        )
        with self.lock:
            delivery = self.ledger.session(actor, session)  # it may have re-registered meanwhile
            Ledger.check_window(actor, delivery, seq)
            self._store(actor, delivery, seq, tensors, steps, request)
            delivery.last_contact = time.monotonic()
            delivery.actor_env_step = actor_env_step
            self.arrived.notify_all()
            return encode({}, self._progress(delivery))

    def heartbeat(self, request: bytes) -> bytes:
        header, _ = decode(request, SMALL_REQUEST_BYTES)
        check_version(header)
        actor, session = actor_id(header), session_of(header)
        actor_env_step = field(header, "env_step", int)
        with self.lock:
            delivery = self.ledger.session(actor, session)
            delivery.last_contact = time.monotonic()
            delivery.actor_env_step = actor_env_step
            return encode({}, self._progress(delivery))

    def weights(self, request: bytes) -> bytes:
        header, _ = decode(request, SMALL_REQUEST_BYTES)
        check_version(header)
        have = header.get("have")
        if have is not None and not isinstance(have, str):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"'have' must be a weights id or null, got {have!r}")
        return self.board.response(have)

    def status(self, request: bytes) -> bytes:
        header, _ = decode(request, SMALL_REQUEST_BYTES)
        check_version(header)
        return encode({}, self.snapshot())

    # ---- shared with the learner's loop ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        with self.lock:
            alive = set(self.ledger.alive(now, self.spec.heartbeat_timeout_s))
            stats = self.storage.stats()
            streams = {
                a: {
                    **stats.get(a, {"transitions": 0, "stored": 0, "interventions": 0}),
                    "num_envs": d.num_envs,
                    "acked_seq": d.acked_seq,
                    "actor_env_step": d.actor_env_step,
                    "alive": a in alive,
                }
                for a, d in self.ledger.actors.items()
            }
            weights_id, version = self.board.current()
            return {
                "offline": self.storage.offline_stats(),
                "env_steps": self.env_steps,
                "updates": self.updates,
                "untrained_steps": self.untrained_steps,
                "weights_id": weights_id,
                "version": version,
                "last_checkpoint_step": self.last_checkpoint_step,
                "wal_records": self.wal.records_written,
                "wal_replayed": self.wal_replayed,
                "rejected": self.rejected,
                "actors_alive": len(alive),
                "streams": streams,
            }

    def replay_log(self) -> int:
        """Apply the write-ahead log (batches acknowledged after the loaded checkpoint, `wal_generation`);
        returns how many were stored. Call before serving, after the checkpoint's storage and ledger are
        loaded. Afterwards the log continues the current generation."""
        stored = 0
        records = self.wal.read()
        first = _generation_of(records[0]) if records else None
        if first is not None and first < self.wal_generation:
            log.warning(
                "write-ahead log of generation %d predates the checkpoint's %d (a crash before the log was emptied):"
                " the checkpoint holds it all; not replayed",
                first,
                self.wal_generation,
            )
            records = []
        for record in records:
            try:
                header, tensors = decode(record, max(self.spec.max_message_bytes, len(record)))
                if header.get("kind") == GENERATION:
                    continue
                if header.get("kind") == END_RUNS:
                    with self.lock:
                        self.storage.end_open_runs(actor_id(header))
                    continue
                actor, session, seq = actor_id(header), field(header, "session", str), field(header, "seq", int)
                num_envs = int(tensors["reward"].shape[1])
                steps = check_transitions(  # accepted once: a smaller max_batch_steps now must not drop it
                    tensors, self.spec.obs_spec, self.spec.action_dim, num_envs, max_steps=len(tensors["reward"])
                )
                with self.lock:
                    delivery, new_session = self.ledger.register(actor, session, num_envs, now=0.0, live_s=0.0)
                    if new_session:
                        self.storage.cut(actor)
                    arrival = self._store(actor, delivery, seq, tensors, steps, payload=None)
                    stored += arrival is not Arrival.DUPLICATE
            except Exception:
                log.exception("skipping a write-ahead log record that cannot be applied")
        self.wal_replayed = stored
        if first is None or first < self.wal_generation:  # empty, stale, or from before generations
            self.start_log_generation(self.wal_generation, keep=bool(records))
        return stored

    def start_log_generation(self, generation: int, keep: bool = False) -> None:
        """Empty the log (unless `keep`: records of a log from before generations, still to be covered by the
        next checkpoint) and mark it as holding what comes after checkpoint `generation`."""
        if not keep:
            self.wal.truncate()
        self.wal_generation = generation
        self.wal.append(encode({}, {"protocol": PROTOCOL_VERSION, "kind": GENERATION, "generation": generation}))

    def end_open_runs(self, actor: str) -> int:
        """Close the actor's open intervention runs (it went silent: nothing may continue them), logging the
        decision first so a replayed log closes them at the same point; returns the transitions written."""
        with self.lock:
            if not self.storage.open_run_steps(actor):
                return 0
            self.wal.append(encode({}, {"protocol": PROTOCOL_VERSION, "kind": END_RUNS, "actor_id": actor}))
            return self.storage.end_open_runs(actor)

    def _store(
        self, actor: str, delivery: Delivery, seq: int, tensors: dict[str, torch.Tensor], steps: int, payload
    ) -> Arrival:
        """Store a checked batch unless it was stored before; `payload` (the request) is logged first."""
        arrival = Ledger.arrival(delivery, seq)
        if arrival is Arrival.DUPLICATE:
            return arrival
        if payload is not None:
            self.wal.append(payload)  # durable before it is applied and acknowledged
        if arrival is Arrival.GAP:
            log.warning(
                "actor %r skipped batches %d..%d (dropped from its outbox)", actor, delivery.acked_seq + 1, seq - 1
            )
            self.storage.cut(actor)
        self.storage.add(actor, tensors)
        delivery.acked_seq = seq
        self.env_steps += steps * delivery.num_envs
        return arrival

    def _progress(self, delivery: Delivery) -> dict[str, Any]:
        weights_id, version = self.board.current()
        return {
            "acked_seq": delivery.acked_seq,
            "env_steps": self.env_steps,
            "untrained_steps": self.untrained_steps,
            "weights_id": weights_id,
            "version": version,
        }


def _generation_of(record: bytes) -> int | None:
    """The generation a log's first record marks, or None if it is no generation record."""
    try:
        header, _ = decode(record, len(record))
    except WireError:
        return None
    generation = header.get("generation") if header.get("kind") == GENERATION else None
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else None
