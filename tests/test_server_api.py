"""The scoring server against a live uvicorn on 127.0.0.1 (tiny float32 model): results equal the in-process
engine's, every malformed request is a 400 naming its field, the API key, the in-flight bound (503 +
Retry-After), client disconnects, tokenizer endpoints and metrics."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from live_server import live_server

from engine import Engine
from engine.stats import JOB, NAMES, kind
from frontends.server.app import create_app

TOL = 1e-5


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """A second engine, never served: the in-process results."""
    return Engine.load(str(tiny_model_dir), dtype="float32")


@pytest.fixture(scope="module")
def server(engine):
    app = create_app(engine, model_name="tiny", max_queue=64)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def error_of(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]


# ---- results equal the in-process engine's ---------------------------------------------------------------------


def test_score_pairs_and_query_items_equal_in_process(server, reference):
    pairs = [["The cat sat on", " the mat"], ["The cat sat on", " a hat"], ["Once upon", " a time there was"]]
    got = server.post("/v1/score", json={"pairs": pairs}).json()["data"]
    want = reference.score([tuple(p) for p in pairs])
    for g, w in zip(got, want):
        assert g["num_tokens"] == w.num_tokens and g["is_greedy"] == w.is_greedy
        assert g["logprob"] == pytest.approx(w.logprob, abs=TOL)
        assert g["token_logprobs"] == pytest.approx(w.token_logprobs, abs=TOL)
    items = [" the mat", " a hat", " nothing"]
    got = server.post("/v1/score", json={"query": "The cat sat on", "items": items, "model": "tiny"}).json()["data"]
    want = reference.score([("The cat sat on", x) for x in items])
    assert [g["logprob"] for g in got] == pytest.approx([w.logprob for w in want], abs=TOL)


def test_score_label_token_ids(server, reference):
    tok = reference.tokenizer
    labels = tok.encode(" yes")[:1] + tok.encode(" no")[:1]
    body = {
        "query": "Is the sky blue? Answer:",
        "items": [" Yes or no", " Think"],
        "label_token_ids": labels,
        "apply_softmax": True,
    }
    got = server.post("/v1/score", json=body).json()
    for item, data, probs in zip(body["items"], got["data"], got["scores"]):
        prefix = [tok.bos_id] + tok.encode(body["query"] + item)
        want = [reference.score([(prefix, [t])])[0].logprob for t in labels]
        assert data["label_logprobs"] == pytest.approx(want, abs=TOL)
        assert sum(probs) == pytest.approx(1.0) and probs[0] / probs[1] == pytest.approx(
            2.718281828 ** (want[0] - want[1]), rel=1e-4
        )


def test_echo_logprobs_equal_in_process_and_one_generated_token(server, reference):
    ids = reference.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    body = {"prompt": ids, "echo": True, "logprobs": 3, "max_tokens": 1, "temperature": 0, "model": "tiny"}
    choice = server.post("/v1/completions", json=body).json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = reference.score([(ids[:1], ids[1:])])[0]
    assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want.token_logprobs, abs=TOL)
    greedy = [lp["token_logprobs"][i] == max(lp["top_logprobs"][i].values()) for i in range(1, len(ids))]
    assert all(greedy) == want.is_greedy
    for i in range(1, len(lp["tokens"])):  # the argmax and the token itself, at most logprobs + 1 entries
        assert 1 <= len(lp["top_logprobs"][i]) <= 4
        assert lp["top_logprobs"][i][lp["tokens"][i]] == lp["token_logprobs"][i]
    gen = reference.generate([ids], max_tokens=1, temperature=0.0)[0]
    assert choice["text"] == reference.tokenizer.decode(ids) + gen.text
    assert lp["top_logprobs"][-1][lp["tokens"][-1]] == max(lp["top_logprobs"][-1].values())  # greedy token


def test_echo_of_cached_prompts_sharing_a_prefix(server, reference):
    """lm-eval's pattern on a warm cache: a prompt generated from (so cached), then echoes of it and of a prompt
    sharing its first tokens, in one call (the second insert splits the cached node the first one reads)."""
    tok = reference.tokenizer
    a, b = tok.encode("Once upon a time there was a cat"), tok.encode("Once upon a time in the west")
    assert server.post("/v1/completions", json={"prompt": a, "max_tokens": 1, "temperature": 0}).status_code == 200
    r = server.post(
        "/v1/completions", json={"prompt": [a, b], "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    for ids, choice in zip((a, b), r.json()["choices"]):
        lp = choice["logprobs"]
        want = reference.score([(ids[:1], ids[1:])])[0].token_logprobs
        assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want, abs=TOL)
        new = reference.generate([ids], max_tokens=1)[0].token_ids  # the greedy token: its own top-1
        assert lp["token_logprobs"][-1] == pytest.approx(reference.score([(ids, new)])[0].logprob, abs=TOL)
        assert lp["top_logprobs"][-1] == {lp["tokens"][-1]: lp["token_logprobs"][-1]}


def test_generate_endpoint_equals_in_process(server, reference):
    prompts = ["Once upon a time", "The cat"]
    got = server.post("/v1/generate", json={"prompts": prompts, "max_tokens": 8, "temperature": 0.8, "seed": 3})
    want = reference.generate(prompts, max_tokens=8, temperature=0.8, seed=3)
    for g, w in zip(got.json()["data"], want):
        assert g["token_ids"] == w.token_ids and g["text"] == w.text and g["finish_reason"] == w.finish_reason


def test_tokenizer_endpoints(server, reference):
    info = server.get("/tokenizer_info").json()
    assert info["eos_token"] == "</s>" and info["bos_token"] == "<s>" and "{% for message" in info["chat_template"]
    ids = server.post("/tokenize", json={"prompt": "hello world", "add_special_tokens": False}).json()["tokens"]
    assert ids == reference.tokenizer.encode("hello world")
    assert server.post("/detokenize", json={"tokens": ids}).json()["prompt"] == "hello world"
    assert server.get("/v1/models").json()["data"][0]["id"] == "tiny"


def test_metrics(server):
    server.post("/v1/score", json={"pairs": [["a b", " c"]]})
    server.post("/v1/completions", json={"prompt": ""})
    text = server.get("/metrics").text
    assert 'http_requests_total{endpoint="/v1/score",status="200"}' in text
    assert 'http_requests_total{endpoint="/v1/completions",status="400"}' in text
    assert "http_request_seconds_bucket" in text and "engine_tokens_computed_total" in text
    assert "engine_step_seconds_bucket" in text and "engine_kv_pages_used" in text and "engine_queue_depth" in text
    assert "engine_running_requests" in text and "engine_in_flight_requests" in text
    # every field of EngineStats is a metric, but a closed job's own figures (a server runs no closed job)
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE engine_")}
    for field in NAMES:
        assert (kind(field) != JOB) == any(field in name for name in names), field


# ---- bad input: a 400 naming the field, before any work --------------------------------------------------------

BAD = [
    ("/v1/completions", {"prompt": 5}, "prompt", "not one of the accepted types"),
    ("/v1/completions", {"prompt": ["a", 3]}, "prompt", "not one of the accepted types"),
    ("/v1/completions", {"prompt": ""}, "prompt", "empty prompt"),
    ("/v1/completions", {"prompt": []}, "prompt", "empty prompt"),
    ("/v1/completions", {"prompt": [1, 100000]}, "prompt", "outside the model's vocabulary"),
    ("/v1/completions", {}, "prompt", "required"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, "model", "unknown model"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs", "greater than or equal to 0"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 100000}, "max_tokens", "maximum context length"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature", "valid number"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p", "greater than 0"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n", "greater than or equal to 1"),
    ("/v1/completions", {"prompt": "hi", "echo": "yes"}, "echo", "valid boolean"),
    ("/v1/completions", {"prompt": "hi", "stream": True, "logprobs": 1}, "stream", "not supported"),
    ("/v1/completions", {"prompt": "hi", "stop": 3}, "stop", "not one of the accepted types"),
    ("/v1/chat/completions", {"messages": []}, "messages", "at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "Input should"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": 7}]},
        "messages[0].content",
        "not one of the accepted types",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 99},
        "top_logprobs",
        "less than or equal to 20",
    ),
    ("/v1/score", {"pairs": [["b", "c"], ["a", ""]]}, "pairs[1]", "empty continuation"),
    ("/v1/score", {"pairs": [["a", [1, 2]]]}, "pairs[0]", "both be text or both be token ids"),
    ("/v1/score", {"pairs": [["a", "b", "c"]]}, "pairs[0]", "at most 2 items"),
    ("/v1/score", {"pairs": [[[1, 2], [100000]]]}, "pairs[0]", "outside the model's vocabulary"),
    ("/v1/score", {"query": "a"}, None, "give `query` with `items`"),
    ("/v1/score", {"query": "a", "items": []}, "items", "at least 1"),
    (
        "/v1/score",
        {"query": "a", "items": [" b"], "label_token_ids": [100000]},
        "label_token_ids",
        "outside the model's vocabulary",
    ),
    ("/v1/score", {"pairs": [["a " * 600, "b"]]}, "pairs[0]", "maximum context length"),
    ("/v1/generate", {"prompts": ["a"], "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ("/tokenize", {"prompt": 3}, "prompt", "valid string"),
    ("/detokenize", {"tokens": [-1]}, "tokens", "outside the model's vocabulary"),
]


@pytest.mark.parametrize("path,body,param,message", BAD, ids=[f"{p}:{m}" for p, _, m, _ in BAD])
def test_bad_input_is_a_400_naming_the_field(server, path, body, param, message):
    err = error_of(server.post(path, json=body), 400)
    assert err["param"] == param and message in err["message"] and err["type"] == "invalid_request_error"


def test_body_that_is_not_json(server):
    err = error_of(
        server.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}), 400
    )
    assert "not valid JSON" in err["message"]
    assert "JSON object" in error_of(server.post("/v1/score", json=[1, 2]), 400)["message"]


def test_unknown_route_is_a_404_error_object(server):
    assert error_of(server.get("/v1/nothing"), 404)["message"] == "Not Found"


# ---- API key, load, disconnects ----------------------------------------------------------------------------------


def test_api_key(engine):
    with live_server(create_app(engine, model_name="tiny", api_key="sekret")) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            err = error_of(httpx.post(url + "/v1/score", json={"pairs": [["a", " b"]]}, headers=headers), 401)
            assert err["code"] == "invalid_api_key" and "API key" in err["message"]
        assert httpx.get(url + "/tokenizer_info").status_code == 401
        ok = httpx.post(url + "/v1/score", json={"pairs": [["a", " b"]]}, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and httpx.get(url + "/health").status_code == 200


class Gate:
    """Wraps the async engine so that generate calls wait until opened; records which ones were cancelled."""

    def __init__(self, aengine):
        self.aengine, self.opened, self.cancelled, self.waiting = aengine, asyncio.Event(), 0, 0

    def __getattr__(self, name):
        return getattr(self.aengine, name)

    def open(self):
        self.loop.call_soon_threadsafe(self.opened.set)  # the event belongs to the server's event loop

    async def generate(self, prompt, **params):
        self.loop = asyncio.get_running_loop()
        self.waiting += 1
        try:
            await self.opened.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await self.aengine.generate(prompt, **params)


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _held_generate(pool, url, gate, prompts):
    """A /v1/generate call of `prompts` in the pool, held by the gate (a future of its response), once the server has
    admitted it."""
    held = pool.submit(httpx.post, url + "/v1/generate", json={"prompts": prompts, "max_tokens": 2}, timeout=60)
    _wait_for(lambda: gate.waiting == len(prompts))
    return held


def test_full_server_answers_503_with_retry_after(engine):
    app = create_app(engine, model_name="tiny", max_queue=2)
    state = app.state.server
    gate = state.aengine = Gate(state.aengine)
    with live_server(app) as url, ThreadPoolExecutor(1) as pool:
        first = _held_generate(pool, url, gate, ["a", "b"])
        r = httpx.post(url + "/v1/score", json={"pairs": [["a", " b"]]})
        assert error_of(r, 503)["type"] == "overloaded_error" and r.headers["retry-after"] == "1"
        err = error_of(httpx.post(url + "/v1/score", json={"pairs": [["a", " b"]] * 3}), 400)
        assert err["param"] == "pairs" and "limit of 2" in err["message"]
        gate.open()
        assert first.result(30).status_code == 200 and state.aengine.in_flight == 0
        assert httpx.post(url + "/v1/score", json={"pairs": [["a", " b"]]}).status_code == 200


def test_client_disconnect_cancels_its_requests(engine):
    app = create_app(engine, model_name="tiny")
    state = app.state.server
    gate = state.aengine = Gate(state.aengine)
    with live_server(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/generate", json={"prompts": ["a", "b", "c"], "max_tokens": 4}, timeout=1.0)
        _wait_for(lambda: gate.cancelled == 3 and state.aengine.in_flight == 0)
        text = httpx.get(url + "/metrics").text
        assert 'http_requests_total{endpoint="/v1/generate",status="499"} 1.0' in text


def _in_flight(url) -> tuple[int, int]:
    """(/health's in_flight, /metrics' engine_in_flight_requests)."""
    health = httpx.get(url + "/health").json()["in_flight"]
    line = next(x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith("engine_in_flight_requests"))
    return health, int(float(line.split()[-1]))


def test_one_in_flight_count_for_health_metrics_and_the_engine(engine):
    """The async engine owns the count of engine requests in flight: /health and /metrics show its number while a
    call is held, the same number after a client that left had its call cancelled beside it, and 0 once all are
    answered (a second counter, bumped by the server, drifts from the engine's in one of these)."""
    app = create_app(engine, model_name="tiny", max_queue=8)
    state = app.state.server
    gate = state.aengine = Gate(state.aengine)
    with live_server(app) as url, ThreadPoolExecutor(1) as pool:
        held = _held_generate(pool, url, gate, ["a", "b"])
        assert _in_flight(url) == (2, 2) and gate.aengine.in_flight == 2
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/generate", json={"prompts": ["c", "d", "e"], "max_tokens": 2}, timeout=1.0)
        _wait_for(lambda: gate.cancelled == 3)
        _wait_for(lambda: gate.aengine.in_flight == 2)
        assert _in_flight(url) == (2, 2)
        gate.open()
        assert held.result(30).status_code == 200
        assert _in_flight(url) == (0, 0) and gate.aengine.in_flight == 0
        health = httpx.get(url + "/health").json()
        assert health["queue_depth"] == 0 and health["engine"]["requests"] >= 2


# ---- an internal failure is a 500 and spares the other requests of its step -------------------------------------


def test_engine_failure_is_500_and_other_requests_in_the_step_complete(tiny_model_dir, reference, monkeypatch):
    """A step that raises (an injected bug, set off by one request's token) answers that request's call with a
    500 `internal_error`; a concurrent good call, scored in the very same step, still gets its right answer."""
    from engine.async_engine import AsyncEngine

    engine = Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)
    poison, steps = 7, []
    real = engine.model.target_logprobs

    def faulty(hidden, targets, top_k=0):
        steps.append(set(targets.tolist()))
        if poison in steps[-1]:
            raise RuntimeError("injected fault")
        return real(hidden, targets, top_k=top_k)

    monkeypatch.setattr(engine.model, "target_logprobs", faulty)
    aengine = AsyncEngine(engine)
    app = create_app(aengine, model_name="tiny")
    good = {"pairs": [[[1, 11, 12, 13], [14, 15]], [[1, 11, 12], [16]]]}
    bad = {"pairs": [[[1, 11, 12, 13], [20, poison]]]}
    echo = {"prompt": [1, 11, 12, 13, 17], "echo": True, "logprobs": 1, "max_tokens": 0}
    with live_server(app) as url:
        aengine._inbox.put(lambda: time.sleep(1.0))  # hold the loop so that the three calls share one step
        with ThreadPoolExecutor(3) as pool:
            calls = [
                pool.submit(httpx.post, url + path, json=body, timeout=60)
                for path, body in (("/v1/score", good), ("/v1/score", bad), ("/v1/completions", echo))
            ]
            r_good, r_bad, r_echo = (c.result() for c in calls)
        err = error_of(r_bad, 500)
        assert err["type"] == "internal_error" and "injected fault" in err["message"]
        assert r_good.status_code == 200 and r_echo.status_code == 200, (r_good.text, r_echo.text)
        failed = next(s for s in steps if poison in s)
        assert failed & {14, 15, 16, 17}  # a good request's rows were in the step that failed
        want = reference.score([tuple(p) for p in good["pairs"]])
        assert [d["logprob"] for d in r_good.json()["data"]] == pytest.approx([w.logprob for w in want], abs=TOL)
        got = r_echo.json()["choices"][0]["logprobs"]["token_logprobs"][1:]
        assert got == pytest.approx(reference.score([([1], [11, 12, 13, 17])])[0].token_logprobs, abs=TOL)
        # bad input is still a 400, and the server goes on serving
        assert error_of(httpx.post(url + "/v1/score", json={"pairs": [[[1], [10**9]]]}), 400)["param"] == "pairs[0]"
        assert httpx.post(url + "/v1/score", json=good).status_code == 200
