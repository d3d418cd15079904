"""The actor-learner service: its name, methods, protocol version and header fields.

Every method is unary-unary over raw bytes (wire.py payloads both ways):

  Register   actor -> learner  {actor_id, session, num_envs, task}  ->  agent config, obs spec, action dim,
                               warm-up length, the last sequence number acknowledged for this session
  Push       a transition batch [steps, envs, ...] with {actor_id, session, seq}  ->  {acked_seq, ...},
             sent only once the batch is durable (write-ahead log fsynced)
  Weights    {have}  ->  the policy's tensors and {weights_id, version}, or no tensors when `have` is current
  Heartbeat  {actor_id, session, env_step}  ->  {weights_id, env_steps, ...}
  Status     {}  ->  the learner's counters and streams (operators, tests)
"""

from __future__ import annotations

import re
from typing import Any

import grpc

from robotrl.runtime.transport.wire import WireError

SERVICE = "robotrl.transport.Learner"
REGISTER, PUSH, WEIGHTS, HEARTBEAT, STATUS = "Register", "Push", "Weights", "Heartbeat", "Status"
METHODS = (REGISTER, PUSH, WEIGHTS, HEARTBEAT, STATUS)
PROTOCOL_VERSION = 1

ACTOR_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
AUTH_METADATA_KEY = "authorization"  # value: "Bearer <token>"


def method_path(method: str) -> str:
    return f"/{SERVICE}/{method}"


class RpcFailure(Exception):
    """A request the learner refuses with a specific status (not a malformed payload: that is WireError)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def field(header: dict[str, Any], name: str, kind: type) -> Any:
    """header[name] if it has type `kind` (bool is not an int here), else WireError naming the field."""
    value = header.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"header field {name!r} must be {kind.__name__}, got {value!r}")
    return value


def check_version(header: dict[str, Any]) -> None:
    version = header.get("protocol")
    if version != PROTOCOL_VERSION:
        raise RpcFailure(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"protocol version {version!r} is not this learner's {PROTOCOL_VERSION}: run the same robotrl on both",
        )


def actor_id(header: dict[str, Any]) -> str:
    value = field(header, "actor_id", str)
    if not ACTOR_ID.fullmatch(value):
        raise WireError(f"actor_id must be 1-64 letters, digits, '_' or '-', got {value!r}")
    return value
