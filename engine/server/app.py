"""The HTTP app: routes, API-key check, OpenAI-style errors, access log and metrics.

`create_app(engine)` serves an `Engine` (wrapped in an `AsyncEngine`, whose one worker thread runs every
client's requests in the same steps) or an `AsyncEngine` already made. Every route handler validates its request
fully before queueing any work; a client that disconnects cancels its requests."""
from __future__ import annotations

import json
import logging
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..async_engine import AsyncEngine, QueueFull
from ..errors import EngineFailure, UserError
from . import completions as openai_api
from . import native
from .metrics import Metrics
from .protocol import (APIError, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, GenerateRequest,
                       ScoreRequest, TokenizeRequest)
from .state import ServerState, cancel_on_disconnect

access_log = logging.getLogger("engine.server.access")


def create_app(engine, *, model_name: str | None = None, api_key: str | None = None,
               max_queue: int | None = None) -> FastAPI:
    """A FastAPI app serving `engine` (an Engine or an AsyncEngine). `max_queue` bounds the engine requests in
    flight, queued or running (a call that does not fit gets 503 + Retry-After); `api_key` makes every /v1 and
    tokenizer route ask for `Authorization: Bearer <key>`."""
    owned = not isinstance(engine, AsyncEngine)
    aengine = AsyncEngine(engine) if owned else engine  # the bound is the server's: all of a call or none
    state = ServerState(aengine, aengine.engine, model_name or "default", api_key=api_key, max_queue=max_queue)
    metrics = Metrics(aengine.stats)

    @asynccontextmanager
    async def lifespan(app):
        yield
        if owned:  # uvicorn has finished the requests in flight by now
            await aengine.shutdown()

    app = FastAPI(title="icqs-engine", lifespan=lifespan)
    app.state.server = state
    app.add_middleware(AccessLog, metrics=metrics)
    _install_error_handlers(app)

    def check_key(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        if not secrets.compare_digest(header.encode(), f"Bearer {state.api_key}".encode()):
            raise APIError(401, "missing or wrong API key (send `Authorization: Bearer <key>`)",
                           code="invalid_api_key")

    api = APIRouter(dependencies=[Depends(check_key)])

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _respond(request, openai_api.completions(state, body))

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _respond(request, openai_api.chat_completions(state, body))

    @api.post("/v1/score")
    async def score(body: ScoreRequest, request: Request):
        return await cancel_on_disconnect(request, native.score(state, body))

    @api.post("/v1/generate")
    async def generate(body: GenerateRequest, request: Request):
        return await cancel_on_disconnect(request, native.generate(state, body))

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "icqs-engine", "max_model_len": state.max_len}]}

    @api.get("/tokenizer_info")
    async def tokenizer_info():
        return native.tokenizer_info(state)

    @api.get("/v1/tokenizer")
    async def tokenizer_full():
        return native.tokenizer_full(state)

    @api.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        return native.tokenize(state, body)

    @api.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        return native.detokenize(state, body)

    app.include_router(api)

    @app.get("/health")
    async def health():
        stats = {k: v for k, v in aengine.stats().items() if k != "step_seconds"}
        return {"status": "ok", "model": state.model_name, "in_flight": state.in_flight, "engine": stats}

    @app.get("/metrics")
    async def prometheus():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


async def _respond(request: Request, work):
    """A JSON body, or server-sent events when the handler returned an async iterator (a stream)."""
    result = await cancel_on_disconnect(request, work)
    if isinstance(result, dict):
        return result
    return StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(QueueFull)
    async def queue_full(request, e: QueueFull):
        return JSONResponse(APIError(503, f"the server is busy ({e}); retry later").body(), status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(UserError)
    async def user_error(request, e: UserError):
        return JSONResponse(APIError(400, str(e)).body(), status_code=400)

    @app.exception_handler(EngineFailure)
    async def engine_failure(request, e: EngineFailure):
        return JSONResponse(APIError(500, str(e)).body(), status_code=500)

    @app.exception_handler(Exception)
    async def internal_error(request, e: Exception):  # a bug in a handler (logged by uvicorn): still JSON
        return JSONResponse(APIError(500, f"internal server error: {type(e).__name__}: {e}").body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        return JSONResponse(validation_error(e.errors()).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e: StarletteHTTPException):
        return JSONResponse(APIError(e.status_code, str(e.detail)).body(), status_code=e.status_code,
                            headers=getattr(e, "headers", None))


def validation_error(errors) -> APIError:
    """The first pydantic error as a 400 naming its field (`messages[0].role`); when every member of a union
    failed, the accepted types."""
    err = errors[0]
    if err.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON")
    path, tag = _field_path(err.get("loc", ()))
    if not path:
        return APIError(400, "the request body must be a JSON object" if err.get("type") in (
            "missing", "model_attributes_type", "dict_type") else err.get("msg", "").removeprefix("Value error, "))
    message = "this field is required" if err.get("type") == "missing" else \
        err.get("msg", "invalid value").removeprefix("Value error, ")
    located = [_field_path(e.get("loc", ())) for e in errors]
    if len(errors) > 1 and all(p == path and t is not None for p, t in located):
        message = f"not one of the accepted types ({', '.join(dict.fromkeys(t for _, t in located))})"
    return APIError(400, f"{path}: {message}", param=path)


def _field_path(loc) -> tuple[str, str | None]:
    """('body', 'messages', 0, 'content', 'str') -> ('messages[0].content', 'str'): the field, and the union
    member pydantic tried (None when the error is not inside a union)."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _is_field(part):
            path += ("." if path else "") + part
        else:
            return path, part
    return path, None


# pydantic writes the union member it tried into an error's location; they are not fields
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "tuple", "dict", "none"}


def _is_field(part: str) -> bool:
    return part.isidentifier() and part not in _TYPE_TAGS


class AccessLog:
    """ASGI middleware: one JSON line per request (method, path, status, seconds) and the HTTP metrics."""

    KNOWN = {"/v1/completions", "/v1/chat/completions", "/v1/score", "/v1/generate", "/v1/models", "/v1/tokenizer",
             "/tokenizer_info", "/tokenize", "/detokenize", "/health", "/metrics"}

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            seconds = time.perf_counter() - start
            path = scope["path"] if scope["path"] in self.KNOWN else "other"
            self.metrics.observe(path, status[0], seconds)
            client = scope.get("client") or ("", 0)
            access_log.info(json.dumps({"method": scope["method"], "path": scope["path"], "status": status[0],
                                        "seconds": round(seconds, 6), "client": f"{client[0]}:{client[1]}"}))
