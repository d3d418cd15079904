"""Settings of the learner's server and of an actor's connection to it (structured config nodes).

Tokens are never config values (a run directory keeps its config.yaml): they come from a file named here
or from the ROBOTRL_TOKEN environment variable.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

TOKEN_ENV = "ROBOTRL_TOKEN"
ON_CORRUPTION = ("refuse", "set_aside")  # server.wal_on_corruption


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"  # loopback unless told otherwise; 0.0.0.0 serves every interface
    port: int = 50051  # 0: any free port (logged, and written to <run dir>/learner_address)
    token_file: str | None = None  # a shared token, else $ROBOTRL_TOKEN, else none (loopback only)
    tls_cert: str | None = None  # PEM server certificate chain; with tls_key, the server speaks TLS only
    tls_key: str | None = None
    insecure_remote: bool = False  # allow a non-loopback bind without a token (not recommended)
    max_message_mb: float = 64.0  # largest request accepted (transition batches)
    heartbeat_timeout_s: float = 10.0  # an actor silent this long is reported lost
    workers: int = 8  # server threads
    # Calls served at once; more are refused (RESOURCE_EXHAUSTED, an actor retries) before their requests are read.
    # Each call in flight may hold a request of up to max_message_mb, so this bounds what a flood of calls can make
    # the learner hold (16 x 64 MiB = 1 GiB). An actor makes one call at a time: keep it above max_actors.
    max_concurrent_calls: int = 16
    # What to do with a write-ahead log damaged before its end (a flipped bit, a bad sector; a crash's torn final
    # record is always dropped: it was never acknowledged). Every record in the log was acknowledged to an actor,
    # which dropped its copy, so "refuse" stops at start-up and changes nothing; "set_aside" keeps the file as
    # <run dir>/wal.log.corrupt-<time>, replays its intact records and serves on.
    wal_on_corruption: str = "refuse"

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"server.port must be in [0, 65535], got {self.port}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("server.tls_cert and server.tls_key must be given together")
        for name in ("max_message_mb", "heartbeat_timeout_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"server.{name} must be > 0, got {getattr(self, name)}")
        for name in ("workers", "max_concurrent_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"server.{name} must be >= 1, got {getattr(self, name)}")
        if self.wal_on_corruption not in ON_CORRUPTION:
            raise ValueError(
                f"server.wal_on_corruption must be one of {', '.join(ON_CORRUPTION)}, got {self.wal_on_corruption!r}"
            )

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * 2**20)


@dataclass
class ConnectConfig:
    address: str = "127.0.0.1:50051"  # host:port of the learner
    token_file: str | None = None  # the learner's shared token, else $ROBOTRL_TOKEN, else none
    tls_ca: str | None = None  # PEM root certificate(s) to verify the learner; given: connect with TLS
    tls_server_name: str | None = None  # the name the learner's certificate is for, when not the address host
    deadline_s: float = 10.0  # every call but Weights
    weights_deadline_s: float = 60.0
    heartbeat_s: float = 1.0  # an idle actor calls Heartbeat this often
    heartbeat_deadline_s: float = 3.0  # a learner silent this long counts as gone
    backoff_min_s: float = 0.2  # reconnect delays double from here ...
    backoff_max_s: float = 5.0  # ... up to here (with jitter)
    max_weights_mb: float = 512.0

    def validate(self) -> None:
        host, sep, port = self.address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ValueError(f"learner.address must be host:port, got {self.address!r}")
        for name in (
            "deadline_s",
            "weights_deadline_s",
            "heartbeat_s",
            "heartbeat_deadline_s",
            "backoff_min_s",
            "backoff_max_s",
            "max_weights_mb",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"learner.{name} must be > 0, got {value}")
        if self.backoff_max_s < self.backoff_min_s:
            raise ValueError(
                f"learner.backoff_max_s ({self.backoff_max_s}) is below backoff_min_s ({self.backoff_min_s})"
            )

    @property
    def max_weights_bytes(self) -> int:
        return int(self.max_weights_mb * 2**20)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
