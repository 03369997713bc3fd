"""`python -m engine serve`: load the model once and serve it over HTTP (uvicorn) until SIGINT/SIGTERM, which
stop accepting connections, finish the requests in flight and exit."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from engine.errors import UserError
from frontends.server.limits import DEFAULT_MAX_TOKENS

from .factory import MAX_QUEUE, add_engine_args, int_in_range, new_tokens_int

DEFAULT_MAX_QUEUE = 4096


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve the model over HTTP (OpenAI-compatible completions, chat, /v1/score)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    s.add_argument(
        "--port", type=int_in_range(0, 65535, "a TCP port"), default=8000, help="default: 8000 (0: any free port)"
    )
    s.add_argument(
        "--api-key",
        default=None,
        help="ask clients of the API (/v1/*, /tokenize, /detokenize, /tokenizer_info) for `Authorization: "
        "Bearer KEY` (default: $ENGINE_API_KEY, else none); /health, /metrics, /openapi.json and /docs "
        "stay open (they name the model and count requests) unless --api-key-all-endpoints",
    )
    s.add_argument(
        "--api-key-all-endpoints",
        action="store_true",
        help="with --api-key: ask for the key on every endpoint, /health, /metrics, /openapi.json and "
        "/docs too (a Prometheus scraper or health check then sends it)",
    )
    s.add_argument(
        "--default-max-tokens",
        type=new_tokens_int,
        default=DEFAULT_MAX_TOKENS,
        help="a chat request without max_tokens generates at most this many "
        f"tokens, and at most what the context holds after its prompt (default {DEFAULT_MAX_TOKENS})",
    )
    s.add_argument(
        "--max-queue",
        type=int_in_range(1, MAX_QUEUE, "requests held at once"),
        default=DEFAULT_MAX_QUEUE,
        help=f"engine requests waiting at most; more get 503 + Retry-After (default {DEFAULT_MAX_QUEUE})",
    )
    s.add_argument("--served-model-name", default=None, help="the model's name in the API (default: file name)")
    add_engine_args(s, remote=False)
    s.set_defaults(func=serve)


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # listening from here: a client that connects once "serving ... on" is logged waits in the backlog
        # while uvicorn starts, instead of being refused (uvicorn listens again with its own backlog)
        sock.listen(2048)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def exposure_warning(host: str, api_key: str | None, all_endpoints: bool) -> str | None:
    """What a server listening on `host` leaves open to other machines, or None (loopback only, or every endpoint
    behind the key)."""
    import ipaddress

    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        local = False
    if local or (api_key and all_endpoints):
        return None
    if api_key:
        return (
            f"listening on {host}: /health, /metrics, /openapi.json and /docs answer without the API key "
            "(they name the model and count requests); --api-key-all-endpoints guards them too"
        )
    return f"listening on {host} without --api-key: any client that can reach this port can use the model"


def serve(args) -> int:
    import uvicorn

    from engine.loader import default_model_path
    from frontends.server.app import create_app

    from .factory import engine_from_args

    api_key = args.api_key or os.environ.get("ENGINE_API_KEY")
    if args.api_key_all_endpoints and not api_key:
        raise UserError("--api-key-all-endpoints needs an API key (--api-key or $ENGINE_API_KEY)")
    sock = _listen(args.host, args.port)  # before loading: a busy port is a one-line error, not a minute later
    engine = engine_from_args(args, keep_cache=True)  # online mode: computed prefixes stay cached (LRU)
    name = args.served_model_name or Path(args.model or default_model_path()).name.removesuffix(".gguf")
    app = create_app(
        engine,
        model_name=name,
        api_key=api_key,
        max_queue=args.max_queue,
        default_max_tokens=args.default_max_tokens,
        api_key_all_endpoints=args.api_key_all_endpoints,
    )
    host, port = sock.getsockname()[:2]
    log = logging.getLogger("frontends.server")
    if (warning := exposure_warning(args.host, api_key, args.api_key_all_endpoints)) is not None:
        log.warning("warning: %s", warning)
    log.info("serving %s on http://%s:%d", name, host, port)
    server = uvicorn.Server(uvicorn.Config(app, access_log=False, log_level="info", timeout_graceful_shutdown=30))
    server.run(sockets=[sock])
    return 0
