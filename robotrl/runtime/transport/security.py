"""Shared-token authentication and TLS credentials for the actor-learner channel."""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

import grpc

from robotrl.runtime.transport.config import TOKEN_ENV, ConnectConfig, ServeConfig, is_loopback
from robotrl.runtime.transport.protocol import AUTH_METADATA_KEY

log = logging.getLogger(__name__)


def load_token(token_file: str | None) -> str | None:
    """The token in `token_file` (stripped), else $ROBOTRL_TOKEN, else None."""
    if token_file is not None:
        path = Path(token_file)
        if not path.is_file():
            raise FileNotFoundError(f"token_file {token_file!r} does not exist")
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"token_file {token_file!r} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


def authorized(context: grpc.ServicerContext, token: str | None) -> bool:
    """Whether the call carries `token` (always, when the server has none); compared in constant time."""
    if token is None:
        return True
    sent = dict(context.invocation_metadata()).get(AUTH_METADATA_KEY, "")
    return hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())


def check_serve_security(cfg: ServeConfig, token: str | None) -> None:
    """Refuse to serve beyond this machine with no token unless explicitly allowed; warn about plaintext."""
    if is_loopback(cfg.host):
        return
    if token is None and not cfg.insecure_remote:
        raise ValueError(
            f"server.host={cfg.host!r} is reachable from other machines but no token is set: set server.token_file "
            f"or ${TOKEN_ENV} (or server.insecure_remote=true to serve without one)"
        )
    if cfg.tls_cert is None:
        log.warning("serving on %s without TLS: the token and all traffic cross the network in plaintext", cfg.host)


def server_credentials(cfg: ServeConfig) -> grpc.ServerCredentials | None:
    if cfg.tls_cert is None:
        return None
    key, cert = _read(cfg.tls_key, "server.tls_key"), _read(cfg.tls_cert, "server.tls_cert")
    return grpc.ssl_server_credentials([(key, cert)])


def channel_options(cfg: ConnectConfig) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", cfg.max_weights_bytes + (1 << 20)),
        ("grpc.max_send_message_length", -1),
        # the channel's own reconnect backoff must not outlast ours (gRPC's default grows to 120 s)
        ("grpc.initial_reconnect_backoff_ms", int(cfg.backoff_min_s * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(cfg.backoff_min_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(cfg.backoff_max_s * 1000)),
    ]
    if cfg.tls_server_name:
        options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
    return options


def open_channel(cfg: ConnectConfig) -> grpc.Channel:
    """A channel to the learner: TLS when `tls_ca` is set, else plaintext."""
    if cfg.tls_ca is None:
        return grpc.insecure_channel(cfg.address, options=channel_options(cfg))
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(cfg.tls_ca, "learner.tls_ca"))
    return grpc.secure_channel(cfg.address, credentials, options=channel_options(cfg))


def _read(path: str, name: str) -> bytes:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{name} {path!r} does not exist")
    return file.read_bytes()
