"""The actor's network side, on its own thread: the control loop never waits on the learner.

The control loop puts transition batches into a bounded `Outbox` (when it is full the oldest batch is
dropped and counted) and picks up new weights with `take_weights`, both without blocking. The `Sender`
thread pushes the oldest unacknowledged batch, heartbeats when idle, pulls weights when the learner
announces a new version, and on any failure reconnects with exponential backoff: it registers again
(same session), learns which batch the learner acknowledged last, and resends everything after it.
Batches dropped before they were sent leave one number out, not one per batch (`Outbox.close_gap`): the
learner cuts the stream at the gap and refuses numbers far ahead of what it stored (ledger.MAX_SEQ_AHEAD).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import torch

from robotrl.runtime.transport.client import LearnerClient, request
from robotrl.runtime.transport.config import ConnectConfig
from robotrl.runtime.transport.wire import WireError, check_weights

log = logging.getLogger(__name__)

# a learner answering these to Register will answer them again: stop instead of retrying forever
PERMANENT_REGISTER_ERRORS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)


@dataclass
class Outgoing:
    seq: int
    tensors: dict[str, torch.Tensor]
    env_steps: int  # transitions in the batch (steps * envs)
    env_step: int  # the actor's env step counter after the batch
    payload: bytes | None = None  # encoded on first send, kept for resends


@dataclass
class Outbox:
    """Batches not yet acknowledged, oldest first, at most `capacity` of them."""

    capacity: int
    _queue: collections.deque = field(default_factory=collections.deque)
    _ready: threading.Condition = field(default_factory=threading.Condition)
    next_seq: int = 0
    last_sent: int = -1  # the highest number a batch has been sent under
    dropped_batches: int = 0
    dropped_env_steps: int = 0
    _progress_wanted: bool = False  # the control loop waits on the learner's progress (max_steps_ahead): ask now

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"outbox capacity must be >= 1, got {self.capacity}")

    def put(self, tensors: dict[str, torch.Tensor], env_steps: int, env_step: int) -> int:
        """Queue a batch (never waits); returns its sequence number."""
        with self._ready:
            if len(self._queue) >= self.capacity:
                dropped = self._queue.popleft()
                self.dropped_batches += 1
                self.dropped_env_steps += dropped.env_steps
            seq = self.next_seq
            self.next_seq += 1
            self._queue.append(Outgoing(seq, tensors, env_steps, env_step))
            self._ready.notify_all()
            return seq

    def oldest(self) -> Outgoing | None:
        with self._ready:
            return self._queue[0] if self._queue else None

    def acknowledge(self, seq: int) -> int:
        """Forget every batch numbered `seq` or lower; returns the transitions they held."""
        released = 0
        with self._ready:
            while self._queue and self._queue[0].seq <= seq:
                released += self._queue.popleft().env_steps
        return released

    def sent(self, batch: Outgoing) -> None:
        with self._ready:
            self.last_sent = max(self.last_sent, batch.seq)

    def close_gap(self, acked_seq: int) -> None:
        """Renumber the batches not sent yet so that, where batches before them were dropped, they follow the
        last batch the learner may have stored (`acked_seq`, or a higher one sent whose outcome is unknown) with
        one number left out: the learner sees the gap and cuts the stream there, and the numbers stay within
        what it takes. A sent batch at the head keeps its number, and those behind it follow it."""
        with self._ready:
            if self._queue and self._queue[0].payload is not None:
                return
            first = self._queue[0].seq if self._queue else self.next_seq
            shift = first - (max(acked_seq, self.last_sent) + 2)
            if shift <= 0:
                return
            for batch in self._queue:
                batch.seq -= shift
            self.next_seq -= shift

    def forget_numbers(self) -> None:
        """The learner refused a batch's number: every queued batch is unstored and is numbered afresh (by the
        next close_gap, after the registration that tells what the learner stored)."""
        with self._ready:
            for batch in self._queue:
                batch.payload = None
            self.last_sent = -1

    def wait(self, timeout: float) -> None:
        """Return when a batch is queued, the learner's progress is wanted, or `timeout` passes."""
        with self._ready:
            self._ready.wait_for(lambda: bool(self._queue) or self._progress_wanted, timeout)

    def want_progress(self) -> None:
        """Have the sender ask the learner for its progress now rather than at its next heartbeat."""
        with self._ready:
            self._progress_wanted = True
            self._ready.notify_all()

    def take_progress_request(self) -> bool:
        with self._ready:
            wanted, self._progress_wanted = self._progress_wanted, False
            return wanted

    @property
    def env_steps(self) -> int:
        """Transitions queued and not yet acknowledged."""
        with self._ready:
            return sum(batch.env_steps for batch in self._queue)

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def __len__(self) -> int:
        with self._ready:
            return len(self._queue)


def backoff_delay(failures: int, cfg: ConnectConfig) -> float:
    """Exponential in the failures so far, capped, with +-20% jitter so actors do not reconnect in lockstep."""
    return min(cfg.backoff_max_s, cfg.backoff_min_s * 2 ** min(max(failures - 1, 0), 30)) * random.uniform(0.8, 1.2)


def register_until_accepted(
    connect: Callable[[], LearnerClient], registration: dict[str, Any], timeout_s: float, stop: threading.Event
) -> tuple[LearnerClient, dict[str, Any]]:
    """Register, retrying with backoff while the learner is unreachable (timeout_s <= 0: forever)."""
    give_up = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
    failures = 0
    client = connect()
    while True:
        try:
            return client, client.register(registration)
        except grpc.RpcError as err:
            if err.code() in PERMANENT_REGISTER_ERRORS:
                client.close()
                raise ConnectionRefusedError(f"the learner refused this actor: {err.details()}") from None
            failures += 1
            if failures == 1:
                log.info("waiting for the learner at %s (%s)", client.cfg.address, err.code().name)
        delay = backoff_delay(failures, client.cfg)
        if time.monotonic() + delay > give_up:
            client.close()
            raise TimeoutError(f"no learner answered at {client.cfg.address} within {timeout_s} s")
        if stop.wait(delay):
            client.close()
            raise InterruptedError("stopped while waiting for the learner")
        client.close()
        client = connect()  # a fresh channel: no reconnect backoff inherited from the old one


class Sender:
    """The thread that talks to the learner on the actor's behalf (see the module doc)."""

    def __init__(
        self,
        connect: Callable[[], LearnerClient],
        client: LearnerClient,
        registration: dict[str, Any],
        first_reply: dict[str, Any],
        outbox: Outbox,
        weights_template: dict[str, torch.Tensor],
    ):
        self.connect, self.client, self.registration = connect, client, registration
        self.outbox, self.template = outbox, weights_template
        self.cfg = client.cfg
        self.agent_config = first_reply["agent"]
        self._stop = threading.Event()
        self._weights_lock = threading.Lock()
        self._new_weights: tuple[dict[str, torch.Tensor], int] | None = None
        self.have_weights: str | None = None  # id of the newest weights received
        self.received_version: int | None = None  # version of the newest weights received (maybe not yet taken)
        self.rejected_weights: str | None = None  # id of weights that failed to decode: not fetched again
        self.connected = True
        self.fatal: BaseException | None = None  # set when the learner refuses this actor for good
        self.actor_env_step = 0  # written by the control loop, reported to the learner
        self.acked_env_steps = 0  # transitions the learner acknowledged (durably stored)
        self.refused_batches = 0
        self.reconnects = 0
        self.learner_total_steps = 0  # the learner's total_steps (registration replies); 0: it trains until stopped
        self.learner_max_message_bytes = 0  # the learner's request size limit (registration replies); 0: not told
        self.learner_acked_seq = -1  # the last batch the learner said it stored
        self._apply_reply(first_reply)
        self._settle(first_reply["acked_seq"])
        self._thread = threading.Thread(target=self._run, name=f"sender-{registration['actor_id']}", daemon=True)

    def start(self) -> Sender:
        self._thread.start()
        return self

    def take_weights(self) -> tuple[dict[str, torch.Tensor], int] | None:
        """The newest weights received since the last call and their version, or None (never waits)."""
        with self._weights_lock:
            new, self._new_weights = self._new_weights, None
            return new

    def stop(self, flush_s: float = 0.0) -> None:
        """Give the queued batches up to `flush_s` seconds to be acknowledged, then stop the thread."""
        deadline = time.monotonic() + flush_s
        while len(self.outbox) and self.connected and self.fatal is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        self.outbox.wake()
        self._thread.join(timeout=self.cfg.weights_deadline_s + self.cfg.deadline_s)
        self.client.close()

    # ---- the thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        last_contact = time.monotonic()
        while not self._stop.is_set():
            try:
                if not self.connected:
                    self._reconnect()
                    failures = 0
                    last_contact = time.monotonic()
                batch = self.outbox.oldest()
                if batch is not None:
                    self._push(batch)
                    last_contact = time.monotonic()
                elif self.outbox.take_progress_request() or time.monotonic() - last_contact >= self.cfg.heartbeat_s:
                    self._apply_reply(self.client.heartbeat(self._session_header()))
                    last_contact = time.monotonic()
                else:
                    self.outbox.wait(self.cfg.heartbeat_s - (time.monotonic() - last_contact))
                self._pull_weights_if_new()
            except grpc.RpcError as err:
                failures += 1
                self._on_rpc_error(err)
                if self.fatal is None:
                    self._stop.wait(backoff_delay(failures, self.cfg))
            except Exception as err:  # a bug or a learner sending garbage: keep the actor acting, say why
                failures += 1
                log.exception("sender error; reconnecting")
                self.connected = False
                if isinstance(err, ConnectionRefusedError):
                    self.fatal = err
                self._stop.wait(backoff_delay(failures, self.cfg))
            if self.fatal is not None:
                return

    def _session_header(self) -> dict[str, Any]:
        reg = self.registration
        return {"actor_id": reg["actor_id"], "session": reg["session"], "env_step": self.actor_env_step}

    def _reconnect(self) -> None:
        self.client.close()
        self.client = self.connect()
        reply = self.client.register(self.registration)
        if reply["agent"] != self.agent_config:
            raise ConnectionRefusedError(
                f"the learner now trains another agent config than at this actor's start: {reply['agent']}"
            )
        self._apply_reply(reply)  # before the acknowledgement: a paced actor never misses an acknowledged batch
        self.acked_env_steps += self._settle(reply["acked_seq"])
        self.connected = True
        self.reconnects += 1
        log.info("reconnected to the learner; %d batches to resend", len(self.outbox))

    def _push(self, batch: Outgoing) -> None:
        if batch.payload is None:
            header = {**self._session_header(), "seq": batch.seq, "env_step": batch.env_step}
            batch.payload = request(header, batch.tensors)
        self.outbox.sent(batch)
        try:
            reply = self.client.push(batch.payload)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                log.warning("the learner refused batch number %d: %s; renumbering", batch.seq, err.details())
                self.outbox.forget_numbers()
                raise  # registering again tells which batch the learner stored last
            # INVALID_ARGUMENT: the learner's checks; RESOURCE_EXHAUSTED for a batch over the learner's size limit
            # (resending the same bytes would loop forever while nothing else is delivered). RESOURCE_EXHAUSTED for
            # a batch within it is the learner's cap on concurrent calls: retried.
            if err.code() not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not self._over_size_limit(batch.payload):
                raise
            # the learner will never take this batch: drop it (the learner cuts the stream at the gap)
            self.refused_batches += 1
            log.error(
                "the learner refused batch %d (%d bytes): %s%s",
                batch.seq,
                len(batch.payload),
                err.details(),
                "; lower batch_steps or raise the learner's server.max_message_bytes"
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                else "",
            )
            self.outbox.acknowledge(batch.seq)
            self.outbox.close_gap(self.learner_acked_seq)
            return
        self._apply_reply(reply)  # before the acknowledgement: a paced actor never misses an acknowledged batch
        self.acked_env_steps += self._settle(reply["acked_seq"])

    def _settle(self, acked_seq: int) -> int:
        """Forget the batches the learner stored (up to `acked_seq`) and number the rest to follow them; returns
        the transitions acknowledged."""
        self.learner_acked_seq = acked_seq
        released = self.outbox.acknowledge(acked_seq)
        self.outbox.close_gap(acked_seq)
        return released

    def _over_size_limit(self, payload: bytes) -> bool:
        return not self.learner_max_message_bytes or len(payload) > self.learner_max_message_bytes

    def _apply_reply(self, reply: dict[str, Any]) -> None:
        self.learner_env_steps = int(reply.get("env_steps", 0))
        self.learner_untrained_steps = int(reply.get("untrained_steps", 0))
        if "total_steps" in reply:  # registration replies: a learner restarted with another budget says so
            self.learner_total_steps = int(reply["total_steps"])
        if "max_message_bytes" in reply:
            self.learner_max_message_bytes = int(reply["max_message_bytes"])
        self.learner_weights = reply.get("weights_id")

    def _pull_weights_if_new(self) -> None:
        if self.learner_weights in (None, self.have_weights, self.rejected_weights):
            return
        try:
            header, tensors = self.client.weights(self.have_weights)
        except WireError as err:  # never loaded; fetching the same payload again would only stall the uploads
            self.rejected_weights = self.learner_weights
            log.error(
                "weights %s from the learner are unusable, acting on the last good ones: %s", self.learner_weights, err
            )
            return
        self.learner_weights = header.get("weights_id")  # what the learner has now (maybe newer than announced)
        if not tensors:
            return
        try:
            check_weights(tensors, self.template)
        except WireError as err:
            self.fatal = ConnectionRefusedError(f"the learner's weights do not fit this actor's agent: {err}")
            return
        with self._weights_lock:
            self._new_weights = (tensors, int(header["version"]))
        self.have_weights, self.received_version = header["weights_id"], int(header["version"])

    def _on_rpc_error(self, err: grpc.RpcError) -> None:
        code = err.code()
        if code == grpc.StatusCode.UNAUTHENTICATED or (not self.connected and code in PERMANENT_REGISTER_ERRORS):
            self.fatal = ConnectionRefusedError(f"the learner refused this actor: {err.details()}")
            log.error("%s", self.fatal)
            return
        if self.connected:
            log.warning("lost the learner (%s: %s); acting on, reconnecting", code.name, err.details())
        self.connected = False
