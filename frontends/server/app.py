"""The HTTP app: routes, API-key check, OpenAI-style errors, access log and metrics.

`create_app(engine)` serves an `Engine` (wrapped in an `AsyncEngine`, whose one worker thread runs every
client's requests in the same steps) or an `AsyncEngine` already made. Every route handler validates its request
fully before queueing any work; a client that disconnects cancels its requests.

Before a body is read: the API key (a wrong one is a 401 without reading a byte of the body) and the body's size
(over MAX_BODY_BYTES: 413). Bodies are parsed as standard JSON (no NaN / Infinity; an integer of more than
MAX_INT_DIGITS digits is refused naming its field). A bug in a handler is a 500 with the error object, and the
kept-alive connection stays open. The OpenAPI schema (/openapi.json) says what the server does: every rejection is a
400 with the error object (never 422), and the rejections the schema language can express are in it. /docs shows
it offline: Swagger UI served from the `fastapi-offline` package's copy of it (its script and style at /docs/ASSET,
no CDN), or, without that package, a plain page listing every endpoint with its request and response schemas."""

from __future__ import annotations

import html
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.async_engine import AsyncEngine, QueueFull
from engine.errors import EngineFailure, UserError

from . import completions as openai_api
from . import engine_api
from .limits import DEFAULT_MAX_TOKENS
from .metrics import Metrics
from .schemas import APIError, ChatCompletionBody, CompletionBody, DetokenizeBody, GenerateBody, ScoreBody, TokenizeBody
from .state import ServerState, cancel_on_disconnect, queue_full_error

access_log = logging.getLogger("frontends.server.access")
log = logging.getLogger("frontends.server")

MAX_BODY_BYTES = 64 << 20  # a call of 256 pairs of a 32k-token context each is about 32 MiB of JSON
MAX_INT_DIGITS = 40  # no field takes an integer longer than this (2**128 has 39 digits)
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}  # the files of the fastapi-offline package that /docs loads
PUBLIC = ("/health", "/metrics", "/openapi.json", "/docs") + tuple(f"/docs/{name}" for name in DOCS_ASSETS)
# answered without the API key, unless api_key_all_endpoints


def create_app(
    engine,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    api_key_all_endpoints: bool = False,
) -> FastAPI:
    """A FastAPI app serving `engine` (an Engine or an AsyncEngine). `max_queue` bounds the engine requests in
    flight, queued or running (the AsyncEngine's bound, which counts them: a call that does not fit gets 503 +
    Retry-After, one larger than the bound a 400); `api_key` makes every /v1 and
    tokenizer route ask for `Authorization: Bearer <key>`, and every route (PUBLIC too: the health, metrics and
    schema pages, which name the model and count requests) with `api_key_all_endpoints`; a body over
    `max_body_bytes` is a 413; a chat request without max_tokens generates at most `default_max_tokens`."""
    owned = not isinstance(engine, AsyncEngine)
    aengine = AsyncEngine(engine, max_queue=max_queue) if owned else engine  # the one owner of the count in flight
    if max_queue not in (None, aengine.max_queue):
        raise ValueError(f"max_queue={max_queue}: the AsyncEngine given has its own bound ({aengine.max_queue})")
    state = ServerState(
        aengine, aengine.engine, model_name or "default", api_key=api_key, default_max_tokens=default_max_tokens
    )
    public = () if api_key_all_endpoints and api_key is not None else PUBLIC
    metrics = Metrics(aengine.stats)

    @asynccontextmanager
    async def lifespan(app):
        yield
        if owned:  # uvicorn has finished the requests in flight by now
            await aengine.shutdown()

    app = FastAPI(title="icqs-engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    # inside AccessLog, so that its 401s, 413s and 500s are logged and counted
    app.add_middleware(Guard, api_key=state.api_key, max_body_bytes=max_body_bytes, public=public)
    app.add_middleware(AccessLog, metrics=metrics)
    _install_error_handlers(app)
    app.openapi = lambda: _openapi(app, public)

    @app.get("/docs", include_in_schema=False)
    async def docs():
        if swagger_ui_dir() is None:
            return HTMLResponse(endpoints_page(app.openapi()))
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            swagger_js_url="/docs/swagger-ui-bundle.js",
            swagger_css_url="/docs/swagger-ui.css",
            swagger_favicon_url="/docs/favicon.png",
        )

    @app.get("/docs/{name}", include_in_schema=False)
    async def docs_asset(name: str):
        folder = swagger_ui_dir()
        if folder is None or name not in DOCS_ASSETS:  # only the named files: nothing else of the disk
            raise StarletteHTTPException(404, "Not Found")
        return FileResponse(folder / name, media_type=DOCS_ASSETS[name])

    api = APIRouter(route_class=StrictJSONRoute)

    @api.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        return await _respond(request, openai_api.completions(state, body))

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionBody, request: Request):
        return await _respond(request, openai_api.chat_completions(state, body))

    @api.post("/v1/score")
    async def score(body: ScoreBody, request: Request):
        return await cancel_on_disconnect(request, engine_api.score(state, body))

    @api.post("/v1/generate")
    async def generate(body: GenerateBody, request: Request):
        return await cancel_on_disconnect(request, engine_api.generate(state, body))

    @api.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "icqs-engine",
                    "max_model_len": state.max_len,
                }
            ],
        }

    @api.get("/tokenizer_info")
    async def tokenizer_info():
        return engine_api.tokenizer_info(state)

    @api.get("/v1/tokenizer")
    async def tokenizer_full():
        return engine_api.tokenizer_full(state)

    @api.post("/tokenize")
    def tokenize(body: TokenizeBody):  # plain functions: FastAPI runs them in its thread pool, off the event loop
        return engine_api.tokenize(state, body)

    @api.post("/detokenize")
    def detokenize(body: DetokenizeBody):
        return engine_api.detokenize(state, body)

    app.include_router(api)

    @app.get("/health")
    async def health():
        s = aengine.stats()
        return {
            "status": "ok",
            "model": state.model_name,
            "in_flight": s.in_flight,
            "queue_depth": s.queue_depth,
            "engine": s.engine_stats.to_dict(),  # EngineStats' wire form: the client reads it back with from_dict
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


def swagger_ui_dir() -> Path | None:
    """The folder of Swagger UI's files (5.x: it renders OpenAPI 3.1) in the `fastapi-offline` package, found
    without importing it; None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("fastapi_offline")
    folder = Path(spec.origin).parent / "static" if spec is not None and spec.origin else None
    return folder if folder is not None and all((folder / name).is_file() for name in DOCS_ASSETS) else None


def endpoints_page(schema: dict) -> str:
    """/docs without Swagger UI: every endpoint (method, path, summary) with its request and response schemas, from
    the OpenAPI schema, on one static page (no scripts)."""
    esc = html.escape
    parts = [
        f"<h1>{esc(schema['info']['title'])} API</h1><p>The machine-readable schema: "
        "<a href='/openapi.json'>/openapi.json</a>. (Install the <code>fastapi-offline</code> package for "
        "the interactive page.)</p>"
    ]
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            parts.append(f"<h2>{esc(method.upper())} {esc(path)}</h2><p>{esc(op.get('summary', ''))}</p>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                parts.append(f"<h3>request</h3><pre>{esc(json.dumps(body, indent=1))}</pre>")
            for code, response in op.get("responses", {}).items():
                media = response.get("content", {})
                shown = {kind: m.get("schema", {}) for kind, m in media.items()}
                parts.append(
                    f"<h3>{esc(code)}: {esc(response.get('description', ''))}</h3>"
                    + (f"<pre>{esc(json.dumps(shown, indent=1))}</pre>" if shown else "")
                )
    components = schema.get("components", {}).get("schemas", {})
    if components:
        parts.append(
            "<h2>schemas</h2>"
            + "".join(
                f"<h3 id='{esc(name)}'>{esc(name)}</h3><pre>{esc(json.dumps(s, indent=1))}</pre>"
                for name, s in components.items()
            )
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>"
        + esc(schema["info"]["title"])
        + " API</title><style>body{font-family:sans-serif;max-width:1100px;margin:auto}pre{background:#f4f4f4;"
        "padding:6px;overflow-x:auto;font-size:12px}</style></head><body>" + "".join(parts) + "</body></html>"
    )


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
    async def queue_full(request, e: QueueFull):  # an engine call made without a permit (ServerState.admit's)
        error = queue_full_error(e, None)
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(UserError)
    async def user_error(request, e: UserError):
        return JSONResponse(APIError(400, str(e)).body(), status_code=400)

    @app.exception_handler(EngineFailure)
    async def engine_failure(request, e: EngineFailure):
        return JSONResponse(APIError(500, str(e)).body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        return JSONResponse(validation_error(e.errors()).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e: StarletteHTTPException):
        return JSONResponse(
            APIError(e.status_code, str(e.detail)).body(),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )


def validation_error(errors) -> APIError:
    """The first pydantic error as a 400 naming its field (`messages[0].role`); when every member of a union
    failed, the accepted types."""
    err = errors[0]
    if err.get("type") == "json_invalid":
        return APIError(
            400,
            "the request body is not valid JSON"
            + (f" ({err['ctx']['error']})" if "standard JSON" in str(err.get("ctx", {}).get("error")) else ""),
        )
    text = next((e for e in errors if "not valid Unicode" in e.get("msg", "")), None)
    if text is not None:  # inside a union too: the string member is the one the client meant
        path, _ = _field_path(text.get("loc", ()))
        return APIError(400, f"{path}: {text['msg'].removeprefix('Value error, ')}", param=path)
    huge = next((e for e in errors if isinstance(e.get("input"), HugeInt)), None)
    if huge is not None:
        path, _ = _field_path(huge.get("loc", ()))
        return APIError(400, f"{path}: an integer of {huge['input'].digits} digits is out of range", param=path)
    path, tag = _field_path(err.get("loc", ()))
    if not path:
        return APIError(
            400,
            "the request body must be a JSON object"
            if err.get("type") in ("missing", "model_attributes_type", "dict_type")
            else err.get("msg", "").removeprefix("Value error, "),
        )
    message = (
        "this field is required"
        if err.get("type") == "missing"
        else err.get("msg", "invalid value").removeprefix("Value error, ")
    )
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

    KNOWN = {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/score",
        "/v1/generate",
        "/v1/models",
        "/v1/tokenizer",
        "/tokenizer_info",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
    }

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
            access_log.info(
                json.dumps(
                    {
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status[0],
                        "seconds": round(seconds, 6),
                        "client": f"{client[0]}:{client[1]}",
                    }
                )
            )


# ---- before the handlers: the key, the body, a bug ------------------------------------------------------------


def _json_response(status: int, error: APIError):
    return JSONResponse(error.body(), status_code=status, headers=error.headers)


class BodyTooLarge(StarletteHTTPException):
    """Raised while the body is read (an HTTPException, so FastAPI passes it on): answered 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is larger than the server's limit of {limit:,} bytes")


class Guard:
    """ASGI middleware. With an API key, a protected route's request without it is answered 401 before its body
    is read (FastAPI reads and parses the body before running dependencies). Then the body's size: a declared
    Content-Length over the limit is answered 413 at once, and a body that grows past it while read raises
    BodyTooLarge (413). And a handler's bug is answered 500 with the error object here, so the exception does not
    reach uvicorn, which would close the kept-alive connection; it is logged with its traceback."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, public=PUBLIC):
        self.app, self.expected = app, None if api_key is None else f"Bearer {api_key}".encode()
        self.limit, self.public = max_body_bytes, public

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.expected is not None and scope["path"] not in self.public:
            header = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(header, self.expected):
                error = APIError(
                    401, "missing or wrong API key (send `Authorization: Bearer <key>`)", code="invalid_api_key"
                )
                return await _json_response(401, error)(scope, receive, send)
        try:
            declared = int(dict(scope["headers"]).get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > self.limit:
            too_large = BodyTooLarge(self.limit)
            return await _json_response(413, APIError(413, too_large.detail))(scope, receive, send)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise BodyTooLarge(self.limit)
            return message

        started = False

        async def watch(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watch)
        except Exception as e:  # noqa: BLE001 - a bug in a handler: answered, logged, the connection kept
            if started:
                raise
            log.exception("internal error in %s %s", scope["method"], scope["path"])
            error = APIError(500, f"internal server error: {type(e).__name__}: {e}")
            await _json_response(500, error)(scope, receive, send)


class HugeInt:
    """A JSON integer of more than MAX_INT_DIGITS digits: no field takes it, so validation names the field."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"<integer of {self.digits} digits>"


def _parse_int(text: str):
    return int(text) if len(text) <= MAX_INT_DIGITS else HugeInt(text)


def _parse_float(text: str):
    """A JSON number written with a fraction or exponent; an integral one (`1.0`, `2e3`) is the integer, as JSON
    Schema counts it (so `n: 1.0` is accepted like `n: 1`), within the doubles' exact range."""
    value = float(text)
    return int(value) if value.is_integer() and abs(value) <= 2**53 else value


def _no_constant(name: str):
    raise json.JSONDecodeError(f"{name} is not standard JSON", name, 0)


class StrictJSONRequest(Request):
    """A request whose JSON body is standard JSON (NaN / Infinity refused), whose huge integers become HugeInt
    and whose integral numbers are integers."""

    async def json(self):
        if not hasattr(self, "_json"):
            self._json = json.loads(
                await self.body(), parse_int=_parse_int, parse_float=_parse_float, parse_constant=_no_constant
            )
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request: Request):
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


# ---- the OpenAPI schema: what the server does -------------------------------------------------------------------

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERRORS = {
    "400": "bad request: the error object names the field (`param`)",
    "401": "missing or wrong API key",
    "413": "request body too large",
    "503": "the server is busy (Retry-After)",
    "500": "internal error (a bug or an engine failure)",
}


def _openapi(app: FastAPI, public=PUBLIC) -> dict:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    components["Error"] = ERROR_SCHEMA
    state = app.state.server
    _express_rejections(components, state.config.vocab_size, state.max_len, state.model_name, state.max_text_chars)
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = ERRORS if method == "post" else {k: v for k, v in ERRORS.items() if k in ("401", "500")}
            if path in public:
                codes = {"500": ERRORS["500"]}
            for code, text in codes.items():
                responses[code] = {"description": text, **ref}
            if path in ("/v1/completions", "/v1/chat/completions"):  # with "stream": true, server-sent events
                responses["200"].setdefault("content", {})["text/event-stream"] = {"schema": {}}  # chunks, then [DONE]
    app.openapi_schema = schema
    return schema


def _token_ids(node, vocab: int):
    """Every array of integers in a schema is token ids: each inside the vocabulary."""
    if isinstance(node, dict):
        if node.get("type") == "array" and node.get("items") == {"type": "integer"}:
            node["items"] = {"type": "integer", "minimum": 0, "maximum": vocab - 1}
        for value in node.values():
            _token_ids(value, vocab)
    elif isinstance(node, list):
        for value in node:
            _token_ids(value, vocab)


def _nonempty(node) -> dict:
    """A text-or-ids schema (or a list of them) whose strings and arrays may not be empty."""
    for member in node.get("anyOf", [node]):
        if member.get("type") == "string":
            member["minLength"] = 1
        elif member.get("type") == "array":
            member["minItems"] = 1
            if isinstance(member.get("items"), dict) and member["items"].get("type") in ("string", "array"):
                _nonempty(member["items"])
    return node


def _capped(node, cap: int) -> None:
    """Every text in a text-or-ids schema (or a list of them) at most `cap` characters, every token-id list at most
    `cap` ids (ServerState.check_text: the longest a request can hold)."""
    if isinstance(node, dict):
        if node.get("type") == "string":
            node["maxLength"] = cap
        elif (
            node.get("type") == "array"
            and isinstance(node.get("items"), dict)
            and node["items"].get("type") == "integer"
        ):
            node["maxItems"] = cap
        for key in ("anyOf", "prefixItems", "items"):
            for child in node.get(key) if isinstance(node.get(key), list) else [node.get(key)]:
                _capped(child, cap)


def _express_rejections(components: dict, vocab: int, max_len: int, model: str, max_text: int) -> None:
    """What the handlers refuse that JSON Schema can say: another model's name, token ids outside the vocabulary,
    empty prompts and continuations, texts and token-id lists longer than any request can hold, more new tokens
    than the context holds, and /v1/score's two shapes (pairs, or query with items). (What depends on tokenizing,
    the prompt's length, and the server's queue cannot be.)"""
    _token_ids(components, vocab)
    for name, field in (
        ("CompletionBody", "prompt"),
        ("ScoreBody", "query"),
        ("ScoreBody", "items"),
        ("ScoreBody", "pairs"),
        ("GenerateBody", "prompts"),
        ("TokenizeBody", "prompt"),
        ("DetokenizeBody", "tokens"),
        ("ChatMessage", "content"),
        ("ContentPart", "text"),
    ):
        _capped(components[name]["properties"][field], max_text)
    for component in components.values():
        if "model" in component.get("properties", {}):
            component["properties"]["model"]["anyOf"] = [{"enum": [model]}, {"type": "null"}]
    _nonempty(components["CompletionBody"]["properties"]["prompt"])
    _nonempty(components["GenerateBody"]["properties"]["prompts"]["items"])
    for name in ("CompletionBody", "ChatCompletionBody", "GenerateBody"):
        for key in ("max_tokens", "max_completion_tokens"):
            field = components[name]["properties"].get(key)
            for member in field.get("anyOf", [field]) if field else []:
                if member.get("type") == "integer":
                    member["maximum"] = max_len - 1  # the prompt holds a token at least
    score = components["ScoreBody"]
    items = score["properties"]["items"]["anyOf"][0]
    _nonempty(items["items"])
    pair = score["properties"]["pairs"]["anyOf"][0]["items"]
    _nonempty(pair["prefixItems"][1])  # the continuation
    null = {"type": "null"}
    score["anyOf"] = [
        {
            "required": ["pairs"],
            "properties": {"pairs": {"type": "array"}, "query": null, "items": null, "label_token_ids": null},
        },
        {
            "required": ["query", "items"],
            "properties": {"query": {"not": null}, "items": {"type": "array"}, "pairs": null},
        },
    ]
