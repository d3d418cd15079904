"""The actor's side of the service: one call per method, each with a deadline and the shared token.

Calls fail fast (no wait-for-ready): an unreachable learner raises grpc.RpcError (UNAVAILABLE, or
DEADLINE_EXCEEDED when the peer accepts the connection but never answers) within the call's deadline.
"""

from __future__ import annotations

from typing import Any

import torch

from robotrl.runtime.transport.config import ConnectConfig
from robotrl.runtime.transport.protocol import (
    HEARTBEAT,
    PROTOCOL_VERSION,
    PUSH,
    REGISTER,
    STATUS,
    WEIGHTS,
    method_path,
)
from robotrl.runtime.transport.security import auth_metadata, load_token, open_channel, warn_if_token_in_plaintext
from robotrl.runtime.transport.wire import decode, encode

SMALL_RESPONSE_BYTES = 1 << 20


def request(header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """A request payload: `tensors` with `header` (the protocol version added)."""
    return encode(tensors or {}, {"protocol": PROTOCOL_VERSION, **header})


class LearnerClient:
    def __init__(self, cfg: ConnectConfig, token: str | None = None):
        cfg.validate()
        self.cfg = cfg
        token = token if token is not None else load_token(cfg.token_file)
        warn_if_token_in_plaintext(cfg, token)
        self.metadata = auth_metadata(token)
        self.channel = open_channel(cfg)
        self._calls = {
            method: self.channel.unary_unary(method_path(method), _registered_method=False)
            for method in (REGISTER, PUSH, WEIGHTS, HEARTBEAT, STATUS)
        }

    def call(self, method: str, payload: bytes, deadline_s: float | None = None) -> bytes:
        """Raw call: response bytes, or grpc.RpcError once `deadline_s` (default cfg.deadline_s) has passed."""
        timeout = self.cfg.deadline_s if deadline_s is None else deadline_s
        return self._calls[method](payload, timeout=timeout, metadata=self.metadata, wait_for_ready=False)

    def _json_call(self, method: str, payload: bytes, deadline_s: float | None = None) -> dict[str, Any]:
        header, _ = decode(self.call(method, payload, deadline_s), SMALL_RESPONSE_BYTES)
        return header

    def register(self, header: dict[str, Any]) -> dict[str, Any]:
        return self._json_call(REGISTER, request(header))

    def push(self, payload: bytes) -> dict[str, Any]:
        return self._json_call(PUSH, payload)

    def heartbeat(self, header: dict[str, Any]) -> dict[str, Any]:
        return self._json_call(HEARTBEAT, request(header), self.cfg.heartbeat_deadline_s)

    def status(self) -> dict[str, Any]:
        return self._json_call(STATUS, request({}))

    def weights(self, have: str | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The learner's current weights (header, tensors); no tensors when `have` is already current."""
        response = self.call(WEIGHTS, request({"have": have}), self.cfg.weights_deadline_s)
        return decode(response, self.cfg.max_weights_bytes)

    def close(self) -> None:
        self.channel.close()
