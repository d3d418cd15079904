"""Shared-token authentication and TLS credentials for the actor-learner channel."""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable
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


def carries_token(metadata: Iterable[tuple[str, str | bytes]], token: str) -> bool:
    """Whether a call's metadata carries `token`; compared in constant time."""
    sent = dict(metadata).get(AUTH_METADATA_KEY, "")
    sent = sent if isinstance(sent, bytes) else sent.encode()
    return hmac.compare_digest(sent, f"Bearer {token}".encode())


class TokenCheck(grpc.ServerInterceptor):
    """Refuses a call without the token (UNAUTHENTICATED) from its metadata alone, before its request is read: a
    stranger's 60 MiB request costs the learner nothing but the refusal."""

    def __init__(self, token: str):
        self._token = token

    def intercept_service(self, continuation, handler_call_details):
        if carries_token(handler_call_details.invocation_metadata or (), self._token):
            return continuation(handler_call_details)
        method = handler_call_details.method

        def refuse(requests, context: grpc.ServicerContext) -> None:
            # a handler that streams its requests is called before any is read; this one never reads one
            log.warning("%s from %s refused: missing or wrong token", method, context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

        return grpc.stream_unary_rpc_method_handler(refuse)


def warn_if_open(cfg: ServeConfig, token: str | None) -> None:
    """Say at start-up who can call a learner that has no token."""
    if token is not None:
        return
    who = "every user of this machine" if is_loopback(cfg.host) else "anyone who can reach this host"
    log.warning(
        "serving on %s with no token: %s can push transitions into the replay and read the weights; set "
        "server.token_file or $%s to shut them out",
        cfg.host,
        who,
        TOKEN_ENV,
    )


def warn_if_token_in_plaintext(cfg: ConnectConfig, token: str | None) -> None:
    """Warn, once per address, that the token would cross the network unencrypted (not over loopback)."""
    host = cfg.address.rpartition(":")[0].strip("[]")
    if token is None or cfg.tls_ca is not None or is_loopback(host) or cfg.address in _warned_plaintext:
        return
    _warned_plaintext.add(cfg.address)
    log.warning(
        "connecting to %s without TLS: the token and all traffic cross the network in plaintext, so anyone on the "
        "path can read the token and act as this actor; set learner.tls_ca (and the learner's server.tls_cert)",
        cfg.address,
    )


_warned_plaintext: set[str] = set()


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
