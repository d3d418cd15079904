"""A gRPC server for the learner's methods: raw-bytes generic handlers, token check, errors mapped to status codes.

The token is checked by an interceptor, from the call's metadata, before its request is read. A handler takes
the request bytes and returns the response bytes. `WireError` becomes INVALID_ARGUMENT, `RpcFailure` its own
code, any other exception INTERNAL (logged with its traceback); the server keeps serving after every one of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc

from robotrl.runtime.transport.config import ServeConfig
from robotrl.runtime.transport.protocol import SERVICE, RpcFailure
from robotrl.runtime.transport.security import TokenCheck, check_serve_security, server_credentials, warn_if_open
from robotrl.runtime.transport.wire import WireError

log = logging.getLogger(__name__)

Handler = Callable[[bytes], bytes]
# requests a little over the payload limit still reach the handler, which rejects them by name; far larger
# ones gRPC itself refuses (RESOURCE_EXHAUSTED) before reading them
OVERSIZE_SLACK = 1 << 20


def serve(
    handlers: Mapping[str, Handler],
    cfg: ServeConfig,
    token: str | None,
    request_limits: Mapping[str, int] | None = None,
) -> tuple[grpc.Server, int]:
    """Start serving `handlers` on cfg.host:cfg.port; returns the server and the bound port. A method named in
    `request_limits` refuses a larger request (INVALID_ARGUMENT) before its handler sees it. gRPC reads a request
    whole before any of this code runs: the server-wide limit (server.max_message_mb) bounds that read, and only
    callers that passed the token check get that far."""
    cfg.validate()
    check_serve_security(cfg, token)
    options = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes + OVERSIZE_SLACK),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),  # a second learner on the same port must fail, not share it
    ]
    interceptors = [TokenCheck(token)] if token is not None else []
    server = grpc.server(
        ThreadPoolExecutor(max_workers=cfg.workers),
        interceptors=interceptors,
        options=options,
        maximum_concurrent_rpcs=cfg.max_concurrent_calls,  # beyond: RESOURCE_EXHAUSTED before the request is read
    )
    limits = request_limits or {}
    methods = {
        name: grpc.unary_unary_rpc_method_handler(_guarded(name, fn, limits.get(name))) for name, fn in handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    address = f"{host}:{cfg.port}"
    credentials = server_credentials(cfg)
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as err:
        raise OSError(f"cannot listen on {address}: {err} (port in use?)") from None
    if port == 0:
        raise OSError(f"cannot listen on {address} (port in use?)")
    server.start()
    log.info("serving %s on %s:%d (%s)", SERVICE, cfg.host, port, "TLS" if credentials else "plaintext")
    warn_if_open(cfg, token)
    return server, port


def _guarded(name: str, handler: Handler, max_request_bytes: int | None):
    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            if max_request_bytes is not None and len(request) > max_request_bytes:
                raise WireError(
                    f"a request of {len(request)} bytes exceeds {name}'s limit of {max_request_bytes} bytes"
                )
            return handler(request)
        except WireError as err:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {err}"
        except RpcFailure as err:
            code, message = err.code, f"{name}: {err}"
        except Exception as err:
            log.exception("%s from %s failed", name, context.peer())
            code, message = grpc.StatusCode.INTERNAL, f"{name} failed on the learner: {type(err).__name__}: {err}"
        log.warning("%s from %s rejected (%s): %s", name, context.peer(), code.name, message)
        context.abort(code, message)

    return handle
