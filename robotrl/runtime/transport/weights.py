"""Policy weights between learner and actors: what is sent, how the actor loads it, versioned publication.

The whole agent state is sent (the acting path of an agent may use any of its modules) except buffers on
the actor's clock, which the actor owns: DrQ-v2's exploration-schedule step count must keep counting the
actor's own env steps, not be reset to the learner's copy at every new version.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch
from torch import nn

from robotrl.runtime.transport.wire import check_weights, encode

ACTOR_OWNED_BUFFERS = ("env_steps",)


def actor_owned(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ACTOR_OWNED_BUFFERS


def policy_state(agent: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors the learner sends: CPU copies (no shared storage, as safetensors requires)."""
    return {k: v.detach().cpu().clone() for k, v in agent.state_dict().items() if not actor_owned(k)}


def load_policy_state(agent: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Load received weights into `agent`, keeping its actor-owned buffers; WireError if they do not fit."""
    own = agent.state_dict()
    check_weights(tensors, {k: v for k, v in own.items() if not actor_owned(k)})
    merged = {k: (v if actor_owned(k) else tensors[k]) for k, v in own.items()}
    agent.load_state_dict(merged)


class WeightsBoard:
    """The learner's latest published weights, encoded once per version and handed to every actor that asks.

    A version is identified by `weights_id` = "<learner incarnation>-<version>", so an actor also takes the
    weights of a learner that restarted from an older checkpoint (same version number, other weights)."""

    def __init__(self, incarnation: str):
        self.incarnation = incarnation
        self._lock = threading.Lock()
        self.weights_id: str | None = None
        self.version = -1
        self._payload: bytes | None = None

    def publish(self, agent: nn.Module, version: int) -> None:
        weights_id = f"{self.incarnation}-{version}"
        payload = encode(policy_state(agent), {"weights_id": weights_id, "version": version})
        with self._lock:
            self.weights_id, self.version, self._payload = weights_id, version, payload

    def current(self) -> tuple[str | None, int]:
        with self._lock:
            return self.weights_id, self.version

    def response(self, have: str | None) -> bytes:
        """The weights payload, or a header-only payload when `have` is current or nothing is published."""
        with self._lock:
            weights_id, version, payload = self.weights_id, self.version, self._payload
        if payload is None or have == weights_id:
            return encode({}, {"weights_id": weights_id, "version": version})
        return payload
