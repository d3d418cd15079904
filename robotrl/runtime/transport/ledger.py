"""Delivery bookkeeping per actor: its session, the last batch acknowledged, when it was last heard from.

An actor process draws a random session when it starts (128 bits, `protocol.new_session`) and numbers its
batches 0, 1, 2, ... within it. The session is a secret shared with this learner only: the learner stores a
batch only under the session its actor id registered, and shows sessions to nobody (not in Status, not in its
log). Registering again with the same session is how an actor reconnects after a network drop or a learner
restart. Registering an actor id with another session is refused while the registered one is live (heard from
within the heartbeat timeout); once it has gone silent, the new session replaces it: that is an actor process
restarted. A token holder who needs a live id sooner stops that actor or uses another actor id.

The learner stores a batch only if its number is above the last one acknowledged for that session, so a
batch resent after a lost acknowledgement is acknowledged again but stored once. A number that skips ahead
means the actor dropped batches (its outbox overflowed while the learner was away); a new session means the
actor restarted. Either way what arrives next does not continue the stream's newest step. A number more than
MAX_SEQ_AHEAD past the last one stored is refused: accepted, it would make the actor's own next batches look
like resends, acknowledged and never stored. The persistent part (`state`) goes into every checkpoint, in step
with the replay it describes.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import Enum
from typing import Any

import grpc

from robotrl.runtime.transport.protocol import RpcFailure

# How far past the last batch stored a batch may be numbered. The actor's outbox leaves one number out where it
# dropped batches, counted past the highest number it has sent (Outbox.close_gap); the slack covers sent
# batches whose outcome the actor never heard (each lost and then dropped while the learner was away).
MAX_SEQ_AHEAD = 64


class Arrival(Enum):
    DUPLICATE = "duplicate"  # acknowledged before: acknowledge again, store nothing
    NEXT = "next"  # the batch after the last acknowledged one
    GAP = "gap"  # batches in between were dropped by the actor


@dataclass
class Delivery:
    session: str
    num_envs: int
    acked_seq: int = -1
    actor_env_step: int = 0
    last_contact: float = 0.0  # time.monotonic() of its last call; 0: not heard from since this learner started


class Ledger:
    def __init__(self) -> None:
        self.actors: dict[str, Delivery] = {}

    def register(self, actor_id: str, session: str, num_envs: int, now: float, live_s: float) -> tuple[Delivery, bool]:
        """The actor's delivery record, and whether a new session starts with this call."""
        known = self.actors.get(actor_id)
        if known is not None and hmac.compare_digest(known.session, session):
            if known.num_envs != num_envs:
                raise RpcFailure(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"actor {actor_id!r} registered {known.num_envs} envs in this session, now {num_envs}",
                )
            known.last_contact = now
            return known, False
        if known is not None and known.last_contact and now - known.last_contact < live_s:
            raise RpcFailure(
                grpc.StatusCode.ALREADY_EXISTS,
                f"actor id {actor_id!r} is in use by a live actor (heard from {now - known.last_contact:.1f} s ago): "
                "give every actor its own actor_id",
            )
        delivery = Delivery(session, num_envs, last_contact=now)
        self.actors[actor_id] = delivery
        return delivery, True

    def session(self, actor_id: str, session: str) -> Delivery:
        """The record of a registered actor's current session, or FAILED_PRECONDITION asking it to register."""
        known = self.actors.get(actor_id)
        if known is None or not hmac.compare_digest(known.session, session):
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION, f"actor {actor_id!r} has no open session here: register first"
            )
        return known

    @staticmethod
    def check_window(actor_id: str, delivery: Delivery, seq: int) -> None:
        """OUT_OF_RANGE for a batch number below 0 or more than MAX_SEQ_AHEAD past the last one stored."""
        highest = delivery.acked_seq + MAX_SEQ_AHEAD
        if not 0 <= seq <= highest:
            raise RpcFailure(
                grpc.StatusCode.OUT_OF_RANGE,
                f"actor {actor_id!r}: batch number {seq} is outside 0..{highest} (the last one stored is "
                f"{delivery.acked_seq}, and a batch may skip at most {MAX_SEQ_AHEAD - 1} numbers)",
            )

    @staticmethod
    def arrival(delivery: Delivery, seq: int) -> Arrival:
        if seq <= delivery.acked_seq:
            return Arrival.DUPLICATE
        return Arrival.NEXT if seq == delivery.acked_seq + 1 else Arrival.GAP

    def excuse_silence(self, seconds: float) -> None:
        """Move every heard-from actor's last contact `seconds` later: a span in which the learner could not
        hear anyone (a checkpoint holding the service lock) is not their silence."""
        for delivery in self.actors.values():
            if delivery.last_contact:
                delivery.last_contact += seconds

    def alive(self, now: float, timeout_s: float) -> list[str]:
        return [a for a, d in self.actors.items() if d.last_contact and now - d.last_contact < timeout_s]

    def state(self) -> dict[str, Any]:
        return {
            a: {
                "session": d.session,
                "num_envs": d.num_envs,
                "acked_seq": d.acked_seq,
                "actor_env_step": d.actor_env_step,
            }
            for a, d in self.actors.items()
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.actors = {
            a: Delivery(d["session"], int(d["num_envs"]), int(d["acked_seq"]), int(d.get("actor_env_step", 0)))
            for a, d in state.items()
        }
