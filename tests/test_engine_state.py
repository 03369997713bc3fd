"""The engine's state contracts: counters are an EngineStats snapshot (attributes, not string keys), taken under the
engine's lock so that another thread may add, abort and read stats while the loop thread steps."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
import torch

from engine import Engine
from engine.loader import load_model_files
from engine.stats import EngineStats


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_files(str(tiny_model_dir))


def engine(tiny, **opts):
    config, w, tok = tiny
    return Engine(config, w, tok, dtype=torch.float32, **{"kv_tokens": 4096, **opts})


def test_stats_are_a_snapshot_of_the_counters(tiny):
    eng = engine(tiny)
    before = eng.stats
    assert isinstance(before, EngineStats) and before.requests == 0 and before.kv_pages_total == 4096 // 16
    eng.score([([1, 2, 3, 4, 5], [6, 7]), ([1, 2, 3, 4, 5], [8])])
    job, now = eng.last_stats, eng.stats
    assert isinstance(job, EngineStats) and before.requests == 0  # the earlier snapshot did not move
    assert job.requests == now.requests == 2 and job.scored_tokens == now.scored_tokens == 3
    assert job.tokens_computed == job.unique_tokens == 6 and job.cache_hit_tokens == 0
    assert job.peak_kv_pages == now.peak_kv_pages > 0 and now.kv_pages_used == 0
    assert now.running == now.waiting == 0
    eng.score([([1, 2, 3], [4])])
    assert eng.last_stats.requests == 1 and eng.stats.requests == 3  # per job, and since the engine was made
    assert {f.name for f in dataclasses.fields(EngineStats)} == set(dataclasses.asdict(eng.stats))


def test_add_abort_and_stats_from_another_thread_while_the_loop_steps(tiny):
    eng = engine(tiny, token_budget=8)
    rng = random.Random(0)
    handles, stop, errors = [], threading.Event(), []

    def loop():
        while not stop.is_set() or eng.has_pending():
            if eng.has_pending():
                eng.step()

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        for i in range(60):
            ctx = [rng.randrange(4, 200) for _ in range(rng.randrange(5, 40))]
            handles.append(eng.add_score(ctx, [rng.randrange(4, 200)]))
            if i % 3 == 0:
                eng.abort(handles[rng.randrange(len(handles))])
            s = eng.stats
            if not s.running + s.waiting <= s.requests:
                errors.append(s)
    finally:
        stop.set()
        worker.join(60)
    assert not worker.is_alive() and not errors
    assert all(h.done for h in handles)
    s = eng.stats
    assert s.requests == 60 and s.running == s.waiting == 0 and s.kv_pages_used == 0


def test_step_returns_the_events_the_handles_consumed(tiny):
    """Every score, token and end a step produced comes back as an event; the handles' results are exactly the
    events' contents (the scheduler writes nothing into a handle)."""
    from engine.request import Admitted, Finished, ScoreOut, StepTime, TokenOut

    eng = engine(tiny, token_budget=16)
    rng = random.Random(1)
    demo = [rng.randrange(4, 200) for _ in range(30)]
    scores = [
        eng.add_score(demo + [rng.randrange(4, 200)], [rng.randrange(4, 200) for _ in range(3)], top_k=2)
        for _ in range(4)
    ]
    gen = eng.add_generate(demo[:12], max_tokens=5)
    aborted = eng.add_score(demo + [7], [8, 9])
    eng.abort(aborted)
    events = []
    while eng.has_pending():
        events += eng.step()
    kinds = {type(e) for e in events}
    assert {ScoreOut, TokenOut, Finished, StepTime, Admitted} <= kinds
    assert sorted(e.request.id for e in events if type(e) is Admitted) == [h.id for h in scores + [gen, aborted]]
    for h in scores:
        outs = sorted((e for e in events if type(e) is ScoreOut and e.request is h), key=lambda e: e.index)
        res = h.result()
        assert [e.logprob for e in outs] == res.token_logprobs and [e.greedy for e in outs] == res.greedy_tokens
        assert [list(zip(e.top_ids[:2], e.top_logprobs[:2])) for e in outs] == res.top_logprobs
    toks = [e.token for e in events if type(e) is TokenOut and e.request is gen]
    assert toks[: len(gen.result().token_ids)] == gen.result().token_ids
    ends = {e.request.id: e.status for e in events if type(e) is Finished}
    assert ends[aborted.id].value == "aborted" and all(ends[h.id].value == "finished" for h in scores + [gen])
