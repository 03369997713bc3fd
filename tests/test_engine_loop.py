"""The engine loop (add / step / handles): the same requests give the same log-probs (fp32, 1e-5) and the same
greedy tokens however they arrive (one batch, one by one, shuffled, interleaved with running work, scoring and
generation mixed); page reference counts are checked; KV pressure changes nothing but the work done; a request
that cannot fit, or whose log-probs are not finite, fails alone; seeded sampling is per request."""

from __future__ import annotations

import io
import random
import sys

import pytest
import torch

from engine import Engine, ScoreResult, UserError
from engine.kv_cache import PageError
from engine.loader import load_model_files
from engine.request import Finished
from engine.results import Status
from icqs.preview import unique_tokens


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_files(str(tiny_model_dir))


def engine(tiny, weights=None, **opts):
    config, w, tok = tiny
    return Engine(config, weights or w, tok, dtype=torch.float32, **{"kv_tokens": 4096, **opts})


def workload(vocab: int, seed: int = 0):
    """Scoring requests over shared demo prefixes, and greedy generations from prompts that share them too."""
    rng = random.Random(seed)
    toks = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    demos = [toks(rng.randrange(20, 40)) for _ in range(2)]
    scores = [("score", d + toks(rng.randrange(2, 6)), toks(rng.randrange(1, 4))) for d in demos for _ in range(5)]
    gens = [("gen", d + toks(rng.randrange(1, 5)), rng.randrange(1, 7)) for d in demos for _ in range(3)]
    items = scores + gens
    rng.shuffle(items)
    return items


def add(eng, item):
    kind, a, b = item
    return eng.add_score(a, b, top_k=2) if kind == "score" else eng.add_generate(a, max_tokens=b)


def outcome(handle):
    r = handle.result()
    return (
        ("score", r.token_logprobs, r.greedy_tokens)
        if isinstance(r, ScoreResult)
        else ("gen", r.token_ids, r.token_logprobs)
    )


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[0] == w[0]
        if g[0] == "score":
            assert g[1] == pytest.approx(w[1], abs=1e-5) and g[2] == w[2]
        else:
            assert g[1] == w[1] and g[2] == pytest.approx(w[2], abs=1e-5)


def alone(tiny, items):
    """Each request on a fresh engine, by itself: the reference."""
    out = []
    for item in items:
        eng = engine(tiny)
        h = add(eng, item)
        eng.run()
        out.append(outcome(h))
    return out


def test_arrival_order_and_interleaving_change_nothing(tiny):
    items = workload(tiny[0].vocab_size)
    want = alone(tiny, items)
    # one batch
    eng = engine(tiny, token_budget=48)
    handles = [add(eng, it) for it in items]
    eng.run()
    assert_same([outcome(h) for h in handles], want)
    eng.check_pages()
    assert eng.kv.used_pages == 0
    # shuffled, on one engine that keeps its cache between requests
    order = list(range(len(items)))
    random.Random(1).shuffle(order)
    eng = engine(tiny, token_budget=16, keep_cache=True)
    handles = {i: add(eng, items[i]) for i in order}
    eng.run()
    assert_same([outcome(handles[i]) for i in range(len(items))], want)
    # one by one, each run to the end before the next (online cache hits)
    hits = eng.stats.cache_hit_tokens
    for i, item in enumerate(items):
        h = add(eng, item)
        eng.run()
        assert_same([outcome(h)], [want[i]])
    assert eng.stats.cache_hit_tokens > hits
    eng.check_pages()
    # interleaved: requests arrive while earlier ones are being computed; results arrive when each is done
    eng = engine(tiny, token_budget=24)
    rng = random.Random(2)
    handles, pending, finished_early = {}, list(range(len(items))), 0
    while pending or eng.has_pending():
        for _ in range(rng.randrange(0, 3)):
            if pending:
                i = pending.pop(0)
                handles[i] = add(eng, items[i])
        done = [e.request for e in eng.step() if isinstance(e, Finished)]
        assert all(h.done for h in done)
        finished_early += sum(1 for h in done if pending)
    assert finished_early > 0  # results come out while later requests are still arriving
    assert_same([outcome(handles[i]) for i in range(len(items))], want)
    eng.check_pages()
    assert eng.kv.used_pages == 0


def test_wrappers_match_the_loop_and_share_in_flight(tiny):
    items = workload(tiny[0].vocab_size, seed=3)
    scores = [(a, b) for k, a, b in items if k == "score"]
    eng = engine(tiny)
    batch = eng.score(scores)
    s = eng.last_stats
    assert s.requests == len(scores) and s.tokens_computed == s.unique_tokens
    unshared = engine(tiny).score(scores, share_prefix=False)
    assert [r.logprob for r in batch] == pytest.approx([r.logprob for r in unshared], abs=1e-5)
    # a request whose whole prefix is already cached needs the LM head only: no layer is recomputed for it
    eng = engine(tiny, keep_cache=True)
    ctx, cont = scores[0]
    cold = eng.score([(ctx, cont)])[0]
    again = eng.score([(ctx, cont[:1]), (ctx, cont)])
    assert eng.last_stats.tokens_computed == 0 and eng.last_stats.forward_steps == 0
    assert again[1].token_logprobs == pytest.approx(cold.token_logprobs, abs=1e-5)
    assert again[0].token_logprobs[0] == pytest.approx(cold.token_logprobs[0], abs=1e-5)


def test_top_k_and_greedy_flags(tiny):
    eng = engine(tiny)
    ctx = list(range(10, 30))
    first = eng.score([(ctx, [5, 6, 7])], top_k=5)[0]
    assert first.top_logprobs is not None and all(len(t) == 5 for t in first.top_logprobs)
    for j, top in enumerate(first.top_logprobs):
        vals = [v for _, v in top]
        assert vals == sorted(vals, reverse=True)
        assert first.greedy_tokens[j] == (top[0][0] == [5, 6, 7][j])
    # put the argmax in as the continuation: its value is bit-identical to its entry in the top k
    best = first.top_logprobs[0][0][0]
    r = eng.score([(ctx, [best])], top_k=3)[0]
    assert r.greedy_tokens == [True] and r.is_greedy
    assert r.token_logprobs[0] == r.top_logprobs[0][0][1]
    assert eng.score([(ctx, [best])])[0].top_logprobs is None


def test_kv_pressure_gives_the_unpressured_results(tiny):
    items = workload(tiny[0].vocab_size, seed=4)
    want = alone(tiny, items)
    eng = engine(tiny, kv_tokens=64, page_size=8, token_budget=64)  # 8 pages: waits and preemptions
    handles = [add(eng, it) for it in items]
    eng.run()
    assert_same([outcome(h) for h in handles], want)
    assert eng.stats.preemptions > 0 and eng.stats.kv_waits > 0
    eng.check_pages()
    assert eng.kv.used_pages == 0


def test_a_request_that_cannot_fit_fails_alone(tiny):
    eng = engine(tiny, kv_tokens=64, page_size=8)
    small = eng.add_score(list(range(10, 30)), [5])
    big = eng.add_score(list(range(10, 90)), [5])  # 81 tokens > 64: known at once
    gen = eng.add_generate(list(range(10, 40)), max_tokens=40)  # 70 > 64
    eng.run()
    assert small.result().num_tokens == 1
    for h in (big, gen):
        assert h.status is Status.FAILED and "exceed" in str(h.error)
        with pytest.raises(UserError):
            h.result()
    # fits the cache by tokens, not by pages once split into prefix-tree nodes of 1 + 1 + 29 tokens (each node on
    # pages of its own: 6 pages of 8 > 4): its own error when it runs, the requests that split it complete
    eng = engine(tiny, kv_tokens=32, page_size=8)
    b = eng.add_score(list(range(10, 41)), [6])
    a1, a2 = eng.add_score([10, 20], [5]), eng.add_score([10, 11, 30], [5])
    eng.run()
    assert a1.result().num_tokens == 1 and a2.result().num_tokens == 1
    assert b.status is Status.FAILED and "needs 6 pages of KV cache" in str(b.error)
    eng.check_pages()
    with pytest.raises(UserError, match="request 0: 81 tokens exceed"):
        engine(tiny, kv_tokens=64, page_size=8).score([(list(range(10, 90)), [5])])


def test_bad_requests_are_user_errors(tiny):
    import engine.validation as validation

    eng = engine(tiny)
    vocab = tiny[0].vocab_size
    with pytest.raises(UserError, match=f"token id {vocab} is outside"):
        eng.score([([1, 2, vocab], [3])])
    with pytest.raises(UserError, match="token id -1"):
        eng.generate([[1, -1]])
    # token ids that are not integers are refused, never truncated (1.7 is not token 1), naming request and field
    for ctx, cont, where in (
        ([1.7, 2], [3], "request 0: token ids must be integers, got 1.7"),
        ([1, 2], ["3"], "request 0: token ids must be integers, got '3'"),
        ([True, 2], [3], "request 0: token ids must be integers, got True"),
        (5, [3], "request 0: expected text or a list of token ids, got int"),
    ):
        with pytest.raises(UserError, match=where.replace(".", r"\.")) as err:
            eng.score([([4, 5], [6]), (ctx, cont)][1:])
        assert err.value.field in ("context", "continuation")
    with pytest.raises(UserError, match=r"prompt 1: token ids must be integers, got 2\.0"):
        eng.generate([[5, 6], [1, 2.0]])
    with pytest.raises(UserError, match="token ids must be integers, got None"):
        validation.check_token_ids([3, None], vocab)
    # a job that is no list of pairs, a request that is no pair (a dict would unpack to its keys), stop strings
    # that are no strings: user errors, not a ValueError or a silently wrong job
    for requests, message in (
        (None, "requests must be a list of \\(context, continuation\\) pairs, got NoneType"),
        ({"context": "a", "continuation": "b"}, "got dict"),
        (["hello"], "request 0: a request is a \\(context, continuation\\) pair, got str"),
        ([("a", " b"), ("a", " b", " c")], "request 1: .* got 3 items"),
        ([{"context": "a", "continuation": " b"}], "request 0: .* got dict"),
    ):
        with pytest.raises(UserError, match=message):
            eng.score(requests)
    for stop in (5, [5], ["ok", None]):
        with pytest.raises(UserError, match="stop must be a string or a list of strings"):
            eng.generate([[5, 6]], stop=stop)
        with pytest.raises(UserError, match="request .*: stop must be"):
            h = eng.add_generate([5, 6], stop=stop)
            eng.run([h])
            h.result()
    with pytest.raises(UserError, match="prompts must be a text or a list of prompts, got NoneType"):
        eng.generate(None)
    one = eng.generate("Once", max_tokens=3)  # a single text is one prompt, as vLLM's generate takes it
    assert len(one) == 1 and one[0].token_ids == eng.generate(["Once"], max_tokens=3)[0].token_ids
    assert eng.generate([[5, 6]], max_tokens=2, stop="x")[0].finish_reason in ("length", "stop", "eos")
    import numpy as np

    with pytest.raises(UserError, match=r"request 0: token ids must be integers, got array\(\[5, 6\]\)"):
        eng.score([(np.array([[5, 6], [7, 8]]), [9])])  # rows of a 2-D array are no token ids
    numpy_ids = eng.score([(np.array([5, 6, 7]), np.array([8]))])[0]  # numpy integers are integers
    assert numpy_ids.token_logprobs == eng.score([([5, 6, 7], [8])])[0].token_logprobs
    with pytest.raises(UserError, match="max_tokens"):
        eng.generate([[1, 2]], max_tokens=tiny[0].max_position)
    assert eng.generate([[1, 2]], max_tokens=0)[0].token_ids == []
    greedy = eng.generate([[5, 6, 7]], max_tokens=5)[0]
    assert eng.generate([[5, 6, 7]], max_tokens=5, temperature=1.0, top_p=0.0)[0].token_ids == greedy.token_ids
    for bad in (dict(token_budget=0), dict(page_size=0), dict(kv_tokens=8, page_size=16), dict(colour=1)):
        with pytest.raises(UserError):
            engine(tiny, **bad)


def test_a_job_shares_its_context_lists_and_checks_each_once(tiny, monkeypatch):
    """encode_pairs gives the requests of one context one list (text or the same list of ids); the job's check reads
    each shared list once and still names the first request that holds a bad id."""
    import engine.validation as validation
    from engine.encoding import encode_pairs

    eng = engine(tiny)
    vocab = tiny[0].vocab_size
    text = encode_pairs(eng.tokenizer, [("The sky is", " blue"), ("The sky is", " green"), ("Grass is", " green")])
    assert text[0][0] is text[1][0] and text[0][0] is not text[2][0] and text[0][1] != text[1][1]
    ctx = [5, 6, 7]
    ids = encode_pairs(eng.tokenizer, [(ctx, [1]), (ctx, [2]), (list(ctx), [3])])
    assert ids[0][0] is ids[1][0] and ids[0][0] is not ids[2][0] and ids[0][0] is not ctx
    reads = []
    real = validation.check_token_ids
    monkeypatch.setattr(validation, "check_token_ids", lambda t, *a, **k: reads.append(t) or real(t, *a, **k))
    validation.check_scores(ids, 0, eng.limits)
    assert len(reads) == 2 + 3  # two distinct context lists, three continuations
    bad = [1, vocab]
    with pytest.raises(UserError, match=f"request 1: token id {vocab} is outside"):
        eng.score([([1, 2], [3]), (bad, [4]), (bad, [5])])


def test_non_finite_log_probs_fail_their_request_only(tiny):
    config, weights, tok = tiny
    broken = dict(weights)
    embed = weights["model.embed_tokens.weight"].clone()
    embed[7] = float("nan")  # a corrupt row: only requests reading token 7 see it
    broken["model.embed_tokens.weight"] = embed
    if not config.tie_embeddings:
        broken["lm_head.weight"] = weights["lm_head.weight"]
    eng = engine(tiny, weights=broken)
    bad = eng.add_score([1, 2, 7, 3], [4])
    good = eng.add_score([1, 2, 3], [4])
    eng.run()
    assert good.result().num_tokens == 1
    assert bad.status is Status.FAILED and "non-finite" in str(bad.error) and "request" in str(bad.error)


def test_seeded_sampling_is_per_request_and_leaves_the_global_rng_alone(tiny):
    eng = engine(tiny)
    prompt = list(range(10, 40))
    state = torch.get_rng_state()
    alone_ = eng.generate([prompt], max_tokens=8, temperature=1.0, top_p=0.9, seed=5)[0]
    h = eng.add_generate(prompt, max_tokens=8, temperature=1.0, top_p=0.9, seed=5)
    others = [eng.add_generate(prompt[:20] + [i], max_tokens=5, temperature=0.7, seed=i) for i in range(4)]
    eng.run()
    assert h.result().token_ids == alone_.token_ids
    assert all(o.result().finish_reason == "length" for o in others)
    eng.generate([prompt], max_tokens=4, temperature=1.0)  # no seed: fresh entropy, still not the global RNG
    assert torch.equal(torch.get_rng_state(), state)


def test_abort_frees_everything_and_stats(tiny):
    eng = engine(tiny)
    gen = eng.add_generate(list(range(10, 40)), max_tokens=50)
    score = eng.add_score(list(range(10, 40)), [1, 2])
    eng.step()
    eng.step()
    gen.abort()
    eng.run()
    assert gen.status is Status.ABORTED and score.result().num_tokens == 2
    assert eng.kv.used_pages == 0
    eng.check_pages()
    s = score.stats
    assert s.tokens_requested == 31 and s.total_seconds > 0 and s.step_seconds > 0
    assert s.cache_hit_tokens == 0 and s.tokens_computed == 31 and s.wait_seconds > 0
    again = eng.add_score(list(range(10, 40)), [1, 2])  # nothing kept (no keep_cache): all computed again
    eng.run()
    assert again.stats.cache_hit_tokens == 0


def test_page_refcounts_catch_double_free_and_leak(tiny):
    eng = engine(tiny, page_size=4)
    eng.score([(list(range(10, 30)), [1])])
    eng.check_pages()
    pages = eng.kv.alloc(2)
    with pytest.raises(PageError, match="refcount"):
        eng.check_pages()  # a leak: pages referenced by no node
    eng.kv.release(pages)
    with pytest.raises(PageError, match="double free"):
        eng.kv.release(pages)
    with pytest.raises(PageError, match="free page"):
        eng.kv.incref(pages[:1])
    eng.check_pages()


def test_cached_rows_survive_a_split_before_the_next_step(tiny):
    eng = engine(tiny, keep_cache=True, page_size=4)
    ctx = list(range(10, 40))
    eng.score([(ctx, [5, 6])])
    again = eng.add_score(ctx[:20], [30, 31, 32])  # scored from cached hidden states, read at the next step
    splitter = eng.add_score(ctx[:12] + [7, 8], [9])  # splits the cached node those rows point into
    eng.run()
    want = engine(tiny).score([(ctx[:20], [30, 31, 32]), (ctx[:12] + [7, 8], [9])], share_prefix=False)
    assert again.result().token_logprobs == pytest.approx(want[0].token_logprobs, abs=1e-5)
    assert splitter.result().token_logprobs == pytest.approx(want[1].token_logprobs, abs=1e-5)
    eng.check_pages()


def test_more_sequences_than_the_token_budget_all_progress(tiny):
    eng = engine(tiny, token_budget=3)
    prompts = [[10 + i, 20, 30] for i in range(7)]
    got = eng.generate(prompts, max_tokens=4)
    want = [engine(tiny).generate([p], max_tokens=4)[0].token_ids for p in prompts]
    assert [g.token_ids for g in got] == want


def test_streamed_text_is_the_final_text_and_stops_before_the_stop_string(tiny_model_dir):
    eng = Engine.load(str(tiny_model_dir), dtype="float32", threads=1)
    free = eng.generate(["Once upon a time"], max_tokens=24)[0]
    assert len(free.text) > 6
    stop = free.text[4:6]  # a stop string the greedy text is known to contain
    events = []
    h = eng.add_generate("Once upon a time", max_tokens=24, stop=[stop], on_token=events.append)
    eng.run()
    g = h.result()
    assert g.finish_reason == "stop" and g.text == free.text[: free.text.find(stop)]
    assert "".join(e.text_delta for e in events) == g.text
    assert [e.finish_reason for e in events] == [None] * (len(events) - 1) + ["stop"]
    assert [e.token_id for e in events] == g.token_ids


def test_scored_tokens_are_remembered_beside_the_cache(tiny):
    eng = engine(tiny, keep_cache=True)
    ctx, cont = list(range(10, 40)), [5, 6, 7, 8]
    cold = eng.score([(ctx, cont)], top_k=3)[0]
    again = eng.score([(ctx, cont)], top_k=2)[0]  # the first three tokens from the memo, the last from the LM head
    assert eng.last_stats.memo_hits == len(cont) - 1 and eng.last_stats.forward_steps == 0
    assert again.token_logprobs[:3] == cold.token_logprobs[:3]  # the very numbers computed before
    assert again.token_logprobs[3] == pytest.approx(cold.token_logprobs[3], abs=1e-5)  # from the kept hidden state
    assert again.greedy_tokens == cold.greedy_tokens
    assert again.top_logprobs[:3] == [t[:2] for t in cold.top_logprobs[:3]]
    wider = eng.score([(ctx, cont)], top_k=5)[0]  # more alternatives than remembered: computed again
    assert eng.last_stats.memo_hits == 0
    assert wider.token_logprobs == pytest.approx(cold.token_logprobs, abs=1e-6)


def test_default_threads_counts_other_processes_not_this_one(monkeypatch):
    """default_threads: cores less what the rest of the machine keeps busy; this process's own CPU time is not
    counted (a program that has just been computing still gets every free core)."""
    import engine.engine as ee

    monkeypatch.setattr(ee.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(ee, "_runnable_others", lambda: 0)
    busy = iter([100.0, 100.0 + 0.3])  # the machine busy for 0.3 s during a 0.3 s window
    monkeypatch.setattr(ee, "_cpu_busy_seconds", lambda: next(busy))
    clock = iter([0.0, 0.3])
    monkeypatch.setattr(ee.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(ee.time, "sleep", lambda s: None)
    own = iter([5.0, 5.3])  # ... and all of it was this process
    monkeypatch.setattr(ee.time, "process_time", lambda: next(own))
    assert ee.default_threads() == 2
    busy, clock, own = iter([100.0, 100.6]), iter([0.0, 0.3]), iter([5.0, 5.0])  # another process held one core
    assert ee.default_threads() == 1
    busy, clock, own = iter([100.0, 100.0]), iter([0.0, 0.3]), iter([5.0, 5.0])  # quiet, but 2 tasks runnable now
    monkeypatch.setattr(ee, "_runnable_others", lambda: 2)
    assert ee.default_threads() == 1


def test_rows_asked_by_several_requests_go_through_the_lm_head_once(tiny):
    """Requests that arrive before their shared prefix is computed each ask for its positions (echo-style scoring
    of one context by many clients): the step runs each (position, target) through the LM head once and gives
    every request the numbers it would get alone."""
    context, conts = list(range(5, 45)), [[50, 51, 52], [50, 51, 60], [70]]
    eng = engine(tiny)
    handles = [eng.add_score(context, c, top_k=2) for c in conts * 3]  # 9 requests, 3 distinct
    eng.run()
    rows = sum(len(c) for c in conts) * 3
    assert eng.stats.scored_tokens == rows
    assert eng.stats.lm_head_rows == 5  # 50 (x2 conts), 51 after 50, 52, 60, 70: positions x targets
    for h, c in zip(handles, conts * 3):
        alone = engine(tiny).score([(context, c)], top_k=2)[0]
        assert h.result().token_logprobs == pytest.approx(alone.token_logprobs, abs=1e-5)
        assert h.result().greedy_tokens == alone.greedy_tokens
        assert [t[0][0] for t in h.result().top_logprobs] == [t[0][0] for t in alone.top_logprobs]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("how", ["run", "step"])
def test_the_loop_overlaps_where_asked_and_gives_each_requests_results_alone(tiny, monkeypatch, how, overlap):
    """run() and step() (the server's loop) run the same rounds. With `overlap` (a GPU's default) a round launches
    the next step before it reads the one in flight (sampling steps too, their tokens taken on the device); without
    (a CPU's default) each step is read before the next is launched. Either way each request's results are those
    it gets alone (fp32), and step() hands back every request's end."""
    import engine.engine as engine_module

    items = workload(tiny[0].vocab_size, seed=8)
    want = alone(tiny, items)
    log = []
    launch, result = engine_module.Engine._launch, engine_module.PendingHead.result

    def spy_launch(self, in_flight):
        out = launch(self, in_flight)
        log.append(("launch", bool(out.plan.sample_rows), in_flight is not None))
        return out

    def spy_result(self):
        log.append(("read",))
        return result(self)

    monkeypatch.setattr(engine_module.Engine, "_launch", spy_launch)
    monkeypatch.setattr(engine_module.PendingHead, "result", spy_result)
    eng = engine(tiny, token_budget=24, overlap=overlap)
    assert eng.overlaps is overlap
    handles = [add(eng, it) for it in items]
    if how == "run":
        eng.run()
    else:
        finished = []
        while eng.has_pending():
            finished += [e.request for e in eng.step() if isinstance(e, Finished)]
        assert sorted(h.id for h in finished) == sorted(h.id for h in handles)
    assert not eng.has_pending()
    assert_same([outcome(h) for h in handles], want)
    ahead = [e for e in log if e[0] == "launch" and e[2]]  # launched while another step was in flight
    if overlap:
        assert any(e[1] for e in ahead) and any(not e[1] for e in ahead), log  # sampling and scoring steps alike
    else:
        assert not ahead and all(b == ("read",) for a, b in zip(log, log[1:]) if a[0] == "launch"), log
    eng.check_pages()


def test_a_closed_job_launches_its_first_step_before_adding_the_rest(tiny, monkeypatch):
    """score() adds its requests until the tree holds a step's worth of new tokens, launches that step, and adds
    the rest while it runs, before any step's results are recorded: no shared prefix is freed and computed again,
    the results are those of adding everything first, and the progress bar's total is the job's unique tokens."""
    import engine.engine as engine_module

    rng = random.Random(3)
    vocab = tiny[0].vocab_size
    demos = [[rng.randrange(4, vocab) for _ in range(30)] for _ in range(3)]
    job = [
        (d + [rng.randrange(4, vocab) for _ in range(4)], [rng.randrange(4, vocab)]) for _ in range(6) for d in demos
    ]
    first_all = engine(tiny, token_budget=32)
    handles = [first_all.add_score(c, x) for c, x in job]
    first_all.run()
    want = [h.result().token_logprobs for h in handles]

    eng = engine(tiny, token_budget=32)
    log, add, launch, finish = [], eng.scheduler.add, engine_module.Engine._launch, engine_module.Engine._finish
    monkeypatch.setattr(eng.scheduler, "add", lambda *a: log.append("add") or add(*a))
    monkeypatch.setattr(engine_module.Engine, "_launch", lambda self, f: log.append("launch") or launch(self, f))
    monkeypatch.setattr(engine_module.Engine, "_finish", lambda self, st: log.append("finish") or finish(self, st))
    monkeypatch.setenv("ICQS_PROGRESS_INTERVAL", "1e-9")
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    got = eng.score(job, progress=True)
    assert [lp for r in got for lp in r.token_logprobs] == pytest.approx([lp for w in want for lp in w], abs=1e-5)
    assert 0 < log.index("launch") < log.count("add") == len(job)  # launched after some adds, before the others
    assert max(i for i, e in enumerate(log) if e == "add") < log.index("finish")
    stats = eng.last_stats
    assert stats.tokens_computed == stats.unique_tokens == unique_tokens([c for c, _ in job])  # each token once
    assert stderr.getvalue().splitlines()[-1].startswith(f"scoring: {stats.unique_tokens}/{stats.unique_tokens} tok")
    eng.check_pages()


def test_a_failed_launch_still_records_the_step_in_flight(tiny, monkeypatch):
    """The pipelined run launches step 2 before it records step 1; when step 2's forward raises, step 1's results
    are recorded first (its requests finish), then the error reaches the caller."""
    eng = engine(tiny, token_budget=8, overlap=True)
    later = eng.add_score(list(range(20, 60)), [7])  # 40 tokens: the rest of step 1's budget, then more steps
    first = eng.add_score([11, 12, 13], [14])  # 3 tokens, on top of the depth-first stack: all of it in step 1
    forward, calls = eng.model.forward, []

    def failing(batch, kv):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return forward(batch, kv)

    monkeypatch.setattr(eng.model, "forward", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        eng.run()
    assert first.done and first.result().num_tokens == 1
    assert not later.done


def _stops(eng, prompts, n):
    """For each prompt, a stop string its greedy text reaches after a few tokens (a different point for each)."""
    free = eng.generate(prompts, max_tokens=n)
    return [g.text[2 + i % 4 : 4 + i % 4] or None for i, g in enumerate(free)]


@pytest.mark.parametrize("kv", [dict(), dict(kv_tokens=96, page_size=8, token_budget=32)])
def test_overlapped_decode_gives_the_read_first_results(tiny_model_dir, kv, monkeypatch):
    """With `overlap` a closed job launches each step before it reads the tokens the step before samples;
    the next step takes them on the device (Chunk.feed). Greedy, seeded sampling, stop strings at different points
    (a sequence ended by its token has one row computed in vain) and max_tokens of 1 to 9, beside scoring
    requests, and under KV pressure (waits, preemptions): the same tokens and log-probs as reading each sampled
    step first, and every page freed."""
    import engine.engine as engine_module

    config, weights, tok = load_model_files(str(tiny_model_dir))
    make = lambda **o: Engine(config, weights, tok, dtype=torch.float32, **{"kv_tokens": 4096, **kv, **o})  # noqa: E731
    rng = random.Random(5)
    prompts = [tok.encode(f"Once upon a time in land {i} there") for i in range(6)]
    stops = _stops(make(), prompts, 12)
    assert sum(s is not None for s in stops) >= 3
    scores = [(p[:-1], [rng.randrange(4, config.vocab_size) for _ in range(3)]) for p in prompts[:3]]

    def job(eng):
        handles = [
            eng.add_generate(p, max_tokens=1 + i % 9, stop=[s] if s and i % 2 else None)
            if i % 3
            else eng.add_generate(p, max_tokens=9, temperature=0.9, top_p=0.9, seed=i, stop=[s] if s else None)
            for i, (p, s) in enumerate(zip(prompts, stops))
        ]
        handles += [eng.add_score(c, x) for c, x in scores]
        eng._loop(lambda: not all(h.done for h in handles))  # a closed job's loop
        return handles

    read_first = make(overlap=False)
    assert not read_first.overlaps
    want = [outcome(h) for h in job(read_first)]

    fed, build = [], engine_module.build_step
    monkeypatch.setattr(
        engine_module,
        "build_step",
        lambda c, cache, dev, s=None, **kw: fed.append(sum(x.feed >= 0 for x in c)) or build(c, cache, dev, s, **kw),
    )
    overlapped = make(overlap=True)
    assert overlapped.overlaps
    got = [outcome(h) for h in job(overlapped)]
    assert_same(got, want)
    assert sum(fed) > 10, fed  # decode tokens taken from the step in flight
    finished = [h.result().finish_reason for h in job(make(overlap=True))[:6]]
    assert "stop" in finished and "length" in finished
    overlapped.check_pages()
    assert overlapped.kv.used_pages == 0
    if kv:
        assert overlapped.stats.preemptions > 0 or overlapped.stats.kv_waits > 0


def test_overlapped_decode_launches_before_reading(tiny, monkeypatch):
    """Steps with sample rows are launched before the step before them is read (the read-first order reads each
    one first), and a token not yet read is pending in its sequence's node until its step is read."""
    import engine.engine as engine_module
    from engine.prefix_cache import PENDING

    log, launch, finish = [], engine_module.Engine._launch, engine_module.Engine._finish

    def spy_launch(self, in_flight):
        out = launch(self, in_flight)
        pending = [t for n in self.cache.nodes() for t in self.cache.tokens(n) if t == PENDING]
        log.append(("launch", bool(out.plan.sample_rows), in_flight is not None, len(pending)))
        return out

    monkeypatch.setattr(engine_module.Engine, "_launch", spy_launch)
    monkeypatch.setattr(engine_module.Engine, "_finish", lambda self, st: log.append(("read",)) or finish(self, st))
    prompts = [[10 + i, 20, 30, 40] for i in range(4)]
    want = engine(tiny).generate(prompts, max_tokens=6)
    got = engine(tiny, overlap=True).generate(prompts, max_tokens=6)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    decode = [e for e in log if e[0] == "launch" and e[1] and e[2]]
    assert len(decode) >= 4, log  # sampling steps launched with the one before still in flight
    # after each such launch two tokens per sequence are pending (its own and the step in flight's) but at the
    # last steps, where the sequences reached max_tokens
    assert max(e[3] for e in decode) == 2 * len(prompts), log


def test_overlap_option_is_checked():
    with pytest.raises(UserError, match="overlap"):
        from engine.engine import EngineOptions

        EngineOptions.checked(overlap="yes")


def test_the_collector_pauses_until_a_closed_jobs_first_launch(tiny, monkeypatch):
    """The cyclic collector is off while a closed job encodes, checks and adds its first step's worth, and after
    its last read (host time no device step hides), on from the first launch to the last read; a job that fails
    its checks, or one started with the collector off, leaves it as it was."""
    import gc

    import engine.engine as engine_module

    seen, launch = [], engine_module.Engine._launch
    monkeypatch.setattr(engine_module.Engine, "_launch", lambda self, f: seen.append(gc.isenabled()) or launch(self, f))
    eng = engine(tiny, token_budget=16)
    vocab = tiny[0].vocab_size
    job = [(list(range(4, 40)), [i % vocab]) for i in range(5, 15)]
    assert gc.isenabled()
    read, finish = [], engine_module.Engine._finish
    monkeypatch.setattr(
        engine_module.Engine, "_finish", lambda self, st: read.append(gc.isenabled()) or finish(self, st)
    )
    eng.score(job)
    assert seen[0] is False and all(seen[1:]) and len(seen) > 2 and all(read) and gc.isenabled()
    with pytest.raises(UserError):
        eng.score([([5, 6], [vocab + 1])])
    assert gc.isenabled()
    seen.clear()
    eng.generate([[5, 6, 7]], max_tokens=3)
    assert seen[0] is False and all(seen[1:]) and gc.isenabled()
    gc.disable()
    try:
        eng.score(job)
        assert not gc.isenabled()
    finally:
        gc.enable()
