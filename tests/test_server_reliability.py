"""The server under hostile input (issue 24), against a live uvicorn on 127.0.0.1 (tiny float32 model): text fields
that are not Unicode, integers out of range, the API key checked before the body is read, a body-size limit, a
request-count limit, a broken chat template, a 500 that keeps the connection, in-flight gauges that never go
negative, and an OpenAPI schema that says 400 (not 422). Each test fails on the code before issue 24."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest
from live_server import live_server

from engine import Engine
from frontends.server.app import create_app


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)


@pytest.fixture(scope="module")
def url(engine):
    with live_server(create_app(engine, model_name="tiny")) as base:
        yield base


def error_of(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]


def post_raw(url: str, path: str, text: str, headers: dict | None = None):
    return httpx.post(
        url + path, content=text.encode(), headers={"content-type": "application/json", **(headers or {})}, timeout=60
    )


# lone surrogate escapes in every text field: JSON allows the escape, Unicode does not
SURROGATE = [
    ("/v1/completions", '{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "a\\udc00"]}', "prompt"),
    ("/v1/completions", '{"prompt": "hi", "stop": "\\ud800"}', "stop"),
    ("/v1/completions", '{"prompt": "hi", "model": "\\ud800"}', "model"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
        "messages[0].content",
    ),
    ("/v1/score", '{"pairs": [["a\\ud800", " b"]]}', "pairs[0][0]"),
    ("/v1/score", '{"query": "a", "items": [" \\ud800"]}', "items[0]"),
    ("/v1/generate", '{"prompts": ["\\ud800"]}', "prompts[0]"),
    ("/v1/generate", '{"prompts": ["a"], "stop": ["\\ud800"]}', "stop[0]"),
    ("/tokenize", '{"prompt": "x\\ud800"}', "prompt"),
]


@pytest.mark.parametrize("path, body, param", SURROGATE, ids=[f"{p}:{f}" for p, _, f in SURROGATE])
def test_a_lone_surrogate_is_a_400_naming_the_field(url, path, body, param):
    err = error_of(post_raw(url, path, body), 400)
    assert err["param"] == param and "Unicode" in err["message"], err


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "hi", "seed": 2**64}, "seed"),
        ("/v1/completions", {"prompt": "hi", "seed": 2**64, "stream": True}, "seed"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": -1}, "seed"),
        ("/v1/generate", {"prompts": ["hi"], "seed": 2**63}, "seed"),
        ("/v1/generate", {"prompts": ["hi"], "max_tokens": 2**40}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 5000}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, "max_tokens"),
    ],
)
def test_integers_are_range_checked_naming_the_field(url, path, body, param):
    err = error_of(httpx.post(url + path, json=body, timeout=60), 400)
    assert err["param"] == param, err


@pytest.mark.parametrize("field", ["seed", "max_tokens", "logprobs", "n"])
def test_an_integer_of_thousands_of_digits_names_its_field(url, field):
    err = error_of(post_raw(url, "/v1/completions", '{"prompt": "hi", "%s": %s}' % (field, "7" * 5000)), 400)
    assert err["param"] == field and "5000 digits" in err["message"], err


def test_nan_in_a_body_is_not_json(url):
    err = error_of(post_raw(url, "/v1/completions", '{"prompt": "hi", "temperature": NaN}'), 400)
    assert "not valid JSON" in err["message"]


def test_a_call_holds_a_bounded_number_of_requests(url):
    from frontends.server.limits import MAX_PER_CALL

    body = {"query": "a", "items": [" b"] * (MAX_PER_CALL + 1), "label_token_ids": [10**6]}
    err = error_of(httpx.post(url + "/v1/score", json=body, timeout=60), 400)
    assert err["param"] == "items" and f"at most {MAX_PER_CALL}" in err["message"], err


def _raw_exchange(url: str, requests: list[bytes], timeout: float = 5.0) -> list[bytes]:
    """Send each request on ONE connection, reading each response head (and its body by Content-Length)."""
    host, port = url.removeprefix("http://").split(":")
    out = []
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        f = sock.makefile("rb")
        for raw in requests:
            sock.sendall(raw)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = f.read(1)
                if not byte:
                    raise ConnectionError(f"connection closed after {len(out)} responses")
                head += byte
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            out.append(head + f.read(length))
    return out


def _request(path: str, body: bytes, extra: str = "", length: int | None = None) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def test_api_key_is_checked_before_the_body_is_read(engine):
    with live_server(create_app(engine, model_name="tiny", api_key="sekret")) as base:
        assert error_of(post_raw(base, "/v1/completions", "{not json"), 401)["code"] == "invalid_api_key"
        t0 = time.perf_counter()  # a 200 MB body announced and never sent: answered at once, nothing read
        head = _raw_exchange(base, [_request("/v1/score", b"", length=200 << 20)])[0]
        assert head.startswith(b"HTTP/1.1 401") and time.perf_counter() - t0 < 3, head[:200]


def test_a_body_over_the_limit_is_a_413(engine):
    with live_server(create_app(engine, model_name="tiny", max_body_bytes=4096)) as base:
        err = error_of(httpx.post(base + "/v1/score", json={"pairs": [["a" * 5000, " b"]]}), 413)
        assert err["message"] and err["type"]
        assert httpx.post(base + "/v1/score", json={"pairs": [["a", " b"]]}).status_code == 200


def test_a_500_keeps_the_connection_open(engine, monkeypatch):
    from frontends.server import engine_api

    def broken(state, req):
        raise RuntimeError("an injected bug")

    monkeypatch.setattr(engine_api, "detokenize", broken)
    with live_server(create_app(engine, model_name="tiny")) as base:
        first, second = _raw_exchange(
            base, [_request("/detokenize", b'{"tokens": [1]}'), _request("/tokenize", b'{"prompt": "hi"}')]
        )
    assert first.startswith(b"HTTP/1.1 500") and b"an injected bug" in first, first[:300]
    assert second.startswith(b"HTTP/1.1 200"), second[:300]


def test_a_broken_chat_template_is_a_400(tiny_model_dir):
    eng = Engine.load(str(tiny_model_dir), dtype="float32")
    eng.tokenizer.chat_template = "{{ messages.append(1) }}"  # the sandbox refuses it while rendering
    with live_server(create_app(eng, model_name="tiny")) as base:
        err = error_of(
            httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}), 400
        )
    assert err["param"] == "messages" and "chat template" in err["message"], err


def test_cancelled_calls_leave_the_in_flight_gauges_at_zero(engine):
    from engine.async_engine import AsyncEngine

    async def main():
        aengine = AsyncEngine(engine)
        pairs = [("The quick brown fox " * 20, f" jumps {i}") for i in range(8)]
        for delay in (0, 0.0005, 0.002, 0.01):
            tasks = [asyncio.ensure_future(aengine.score(pairs)) for _ in range(30)]
            await asyncio.sleep(delay)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        deadline = time.monotonic() + 20
        while aengine.stats().in_flight != 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        value = aengine.stats().in_flight
        await aengine.shutdown()
        return value

    assert asyncio.run(main()) == 0


def test_openapi_says_400_with_the_error_object_and_docs_work_offline(url):
    schema = httpx.get(url + "/openapi.json").json()
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (path, method)
            if method == "post":
                assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    docs = httpx.get(url + "/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text and "https://" not in docs.text  # offline
