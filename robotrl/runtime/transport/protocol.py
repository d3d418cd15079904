"""The actor-learner service: its name, methods, protocol version and header fields.

Every method is unary-unary over raw bytes (wire.py payloads both ways):

  Register   actor -> learner  {actor_id, session, num_envs, task, task_settings}  ->  agent config, obs spec,
                               action dim, warm-up length, total_steps, the last sequence number acknowledged
  Push       a transition batch [steps, envs, ...] with {actor_id, session, seq}  ->  {acked_seq, ...},
             sent only once the batch is durable (write-ahead log fsynced)
  Weights    {have}  ->  the policy's tensors and {weights_id, version}, or no tensors when `have` is current
  Heartbeat  {actor_id, session, env_step}  ->  {weights_id, env_steps, ...}
  Status     {}  ->  the learner's counters and streams (operators, tests); never a session
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from typing import Any

import grpc
from omegaconf import OmegaConf

from robotrl.runtime.transport.wire import WireError

SERVICE = "robotrl.transport.Learner"
REGISTER, PUSH, WEIGHTS, HEARTBEAT, STATUS = "Register", "Push", "Weights", "Heartbeat", "Status"
METHODS = (REGISTER, PUSH, WEIGHTS, HEARTBEAT, STATUS)
# 2: Register carries task_settings, replies untrained_steps and total_steps; 3: sessions are 128-bit secrets,
# never listed by Status, and a batch numbered far past the last one stored is refused; 4: the agent settings a
# registration reply carries nest the pixel encoder's under `encoder`
PROTOCOL_VERSION = 4

ACTOR_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
SESSION = re.compile(r"[0-9a-f]{32}")
AUTH_METADATA_KEY = "authorization"  # value: "Bearer <token>"
# task settings that do not change what a step means (the simulator, its threads, videos): an actor may differ
TASK_SETTINGS_FREE = frozenset({"backend", "sim_threads", "render_width", "render_height", "camera"})


def task_settings(task_cfg: Any) -> dict[str, Any]:
    """The task config's settings (as JSON values) an actor must share with its learner: its reward, episode length,
    control, observations, ... Every one but TASK_SETTINGS_FREE."""
    if dataclasses.is_dataclass(task_cfg):
        values = dataclasses.asdict(task_cfg)
    else:  # a DictConfig, or a plain mapping
        values = OmegaConf.to_container(task_cfg, resolve=True) if OmegaConf.is_config(task_cfg) else dict(task_cfg)
    return json.loads(json.dumps({k: v for k, v in values.items() if k not in TASK_SETTINGS_FREE}))


def new_session() -> str:
    """A session for an actor process: 128 random bits. With the token it is the actor's credential for its stream
    (a batch is stored only under its registered session), so the learner never shows it to anyone."""
    return secrets.token_hex(16)


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


def session_of(header: dict[str, Any]) -> str:
    value = field(header, "session", str)
    if not SESSION.fullmatch(value):
        raise WireError(f"session must be 32 lowercase hex digits (protocol.new_session), got {value[:64]!r}")
    return value
