"""The server's limits on what one request may ask for (issue 40), against a live uvicorn on 127.0.0.1 (tiny float32
model): the token endpoints share the scoring endpoints' length limit and every text over it is refused before it
is tokenized (a 50 MB text on /tokenize took a minute and 7 GB); a chat request without max_tokens generates a
bounded default; with --api-key-all-endpoints the health, metrics and schema pages ask for the key too."""

from __future__ import annotations

import httpx
import pytest
from live_server import live_server
from test_server_reliability import engine, error_of, url  # noqa: F401 - the fixtures: a tiny engine, its server

from frontends.server.app import create_app
from frontends.server.limits import DEFAULT_MAX_TOKENS


def _longest(engine) -> int:
    """The most characters a request's text may have on this server (the tiny model: 512 tokens of at most 13)."""
    return engine.tokenizer.max_text_chars(engine.limits.max_request_tokens)


TOO_LONG = 100_000  # characters: far over the tiny model's 6,656, far under the 64 MiB body limit
CASES = [
    ("/tokenize", {"prompt": "a" * TOO_LONG}, "prompt"),
    ("/detokenize", {"tokens": [5] * TOO_LONG}, "tokens"),
    ("/v1/score", {"pairs": [["ok", " fine"], ["a " * (TOO_LONG // 2), " b"]]}, "pairs[1]"),
    ("/v1/score", {"query": "a " * (TOO_LONG // 2), "items": [" b"]}, "items[0]"),
    ("/v1/completions", {"prompt": "a" * TOO_LONG, "max_tokens": 1}, "prompt"),
    ("/v1/generate", {"prompts": ["a", "a" * TOO_LONG], "max_tokens": 1}, "prompts[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * TOO_LONG}], "max_tokens": 1}, "messages"),
]


@pytest.mark.parametrize("path, body, param", CASES, ids=[f"{p}:{f}" for p, _, f in CASES])
def test_a_text_longer_than_any_request_is_refused_before_it_is_tokenized(engine, url, path, body, param, monkeypatch):
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("the text was tokenized")

    for name in ("encode", "encode_batch"):
        monkeypatch.setattr(engine.tokenizer, name, no_tokenizing)
    err = error_of(httpx.post(url + path, json=body, timeout=60), 400)
    assert err["param"] == param and f"at most {_longest(engine):,}" in err["message"], err


def test_the_openapi_schema_states_the_limit(engine, url):
    schemas = httpx.get(url + "/openapi.json").json()["components"]["schemas"]
    longest = _longest(engine)
    assert schemas["TokenizeBody"]["properties"]["prompt"]["maxLength"] == longest
    assert schemas["DetokenizeBody"]["properties"]["tokens"]["maxItems"] == longest
    context, continuation = schemas["ScoreBody"]["properties"]["pairs"]["anyOf"][0]["items"]["prefixItems"]
    assert [m.get("maxLength", m.get("maxItems")) for m in context["anyOf"] + continuation["anyOf"]] == [longest] * 4
    prompts = schemas["CompletionBody"]["properties"]["prompt"]["anyOf"]
    assert prompts[1]["maxItems"] == 4096 and prompts[1]["items"]["maxLength"] == longest  # calls: not capped


def test_a_50_mb_text_on_tokenize_is_a_400_naming_the_field(url):
    r = httpx.post(url + "/tokenize", json={"prompt": "The quick brown fox. " * (50_000_000 // 21)}, timeout=60)
    err = error_of(r, 400)
    assert err["param"] == "prompt" and "longer than any request can be" in err["message"]


def test_texts_up_to_the_limit_still_work(engine, url):
    longest = _longest(engine)
    r = httpx.post(url + "/tokenize", json={"prompt": "a" * longest})
    assert r.status_code == 200 and r.json()["count"] > 0
    assert httpx.post(url + "/detokenize", json={"tokens": [5] * longest}).status_code == 200
    ok = httpx.post(url + "/v1/score", json={"pairs": [["The quick brown fox", " jumps"]]})
    assert ok.status_code == 200


def test_a_chat_request_without_max_tokens_gets_a_bounded_default(engine):
    body = {"messages": [{"role": "user", "content": "Tell me a long story"}], "temperature": 0}
    with live_server(create_app(engine, model_name="tiny", default_max_tokens=3)) as base:
        usage = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()["usage"]
        assert 1 <= usage["completion_tokens"] <= 3, usage
        asked = httpx.post(base + "/v1/chat/completions", json={**body, "max_tokens": 5}, timeout=60).json()
        assert asked["usage"]["completion_tokens"] <= 5  # a client's own max_tokens is not capped by the default


def test_serve_options_say_which_endpoints_the_key_guards(capsys):
    from commands.engine_cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert args.default_max_tokens == DEFAULT_MAX_TOKENS == 512 and args.api_key_all_endpoints is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "/health, /metrics, /openapi.json and /docs stay open" in text and "--api-key-all-endpoints" in text
    assert "--default-max-tokens" in text


def test_api_key_all_endpoints_needs_a_key(capsys, monkeypatch):
    from commands.engine_cli import main

    monkeypatch.delenv("ENGINE_API_KEY", raising=False)
    assert main(["serve", "--api-key-all-endpoints", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key-all-endpoints needs an API key" in err, err


@pytest.mark.parametrize("everywhere", [False, True])
def test_api_key_on_every_endpoint_when_asked(engine, everywhere):
    app = create_app(engine, model_name="tiny", api_key="sekret", api_key_all_endpoints=everywhere)
    key = {"Authorization": "Bearer sekret"}
    with live_server(app) as base:
        for path in ("/health", "/metrics", "/openapi.json", "/docs"):
            assert httpx.get(base + path).status_code == (401 if everywhere else 200), path
            assert httpx.get(base + path, headers=key).status_code == 200, path
        assert httpx.get(base + "/tokenizer_info").status_code == 401
        schema = httpx.get(base + "/openapi.json", headers=key).json()
    assert ("401" in schema["paths"]["/health"]["get"]["responses"]) == everywhere


def test_other_clients_are_served_while_a_call_is_tokenized(engine, monkeypatch):
    """A call's texts are tokenized off the event loop: while one call's tokenizer is busy (held here), /health, a
    /tokenize and a client that leaves are all seen (before, the loop waited for the tokenizer: 4.4 s for a call of
    64 texts of 6,400 tokens on SmolLM2, during which the server answered nothing and missed a SIGTERM)."""
    import threading

    busy, release = threading.Event(), threading.Event()
    encode_batch = engine.tokenizer.encode_batch

    def held(texts):
        busy.set()
        release.wait(30)
        return encode_batch(texts)

    monkeypatch.setattr(engine.tokenizer, "encode_batch", held)
    with live_server(create_app(engine, model_name="tiny")) as base:
        result = {}
        t = threading.Thread(
            target=lambda: result.update(
                r=httpx.post(base + "/v1/score", json={"pairs": [["The quick brown fox", " jumps"]]}, timeout=60)
            )
        )
        t.start()
        try:
            assert busy.wait(20)
            assert httpx.get(base + "/health", timeout=5).json()["status"] == "ok"
            assert httpx.post(base + "/tokenize", json={"prompt": "hello"}, timeout=5).status_code == 200
        finally:
            release.set()
            t.join(60)
    assert result["r"].status_code == 200


def test_serve_warns_when_other_machines_can_reach_what_the_key_does_not_guard():
    from commands.serve import exposure_warning

    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert exposure_warning(host, None, False) is None
    assert "without --api-key: any client" in exposure_warning("0.0.0.0", None, False)
    assert "without --api-key" in exposure_warning("example.org", None, False)
    assert "/health, /metrics, /openapi.json and /docs answer without" in exposure_warning("::", "k", False)
    assert exposure_warning("0.0.0.0", "k", True) is None
