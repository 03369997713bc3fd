"""Prefix sharing changes how much is computed, never the scores: sharing on/off, request order, step budget,
KV pressure (preemption), and the online cache across calls all give the same log-probs (fp32, 1e-5)."""

from __future__ import annotations

import random

import pytest
import torch

from engine import Engine
from engine.loader import load_model_files


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_files(str(tiny_model_dir))


def icqs_shaped(vocab: int, seed: int = 0, demo_sets: int = 3, questions: int = 4, answers: int = 3):
    """demo set -> question -> answer, as an ICQS job lays out its requests."""
    rng = random.Random(seed)
    toks = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    demos = [toks(rng.randrange(30, 60)) for _ in range(demo_sets)]
    qs = [toks(rng.randrange(3, 9)) for _ in range(questions)]
    ans = [[toks(rng.randrange(1, 5)) for _ in range(answers)] for _ in qs]
    return [(d + q, a) for d in demos for q, aa in zip(qs, ans) for a in aa]


def engine(tiny, **opts):
    config, weights, tok = tiny
    return Engine(config, weights, tok, dtype=torch.float32, **{"kv_tokens": 4096, **opts})


def logprobs(eng, reqs, **kw):
    return [r.logprob for r in eng.score(reqs, **kw)]


def test_sharing_order_and_budget_invariance(tiny):
    reqs = icqs_shaped(tiny[0].vocab_size)
    base = logprobs(engine(tiny), reqs, share_prefix=False)
    for budget in (5, 37, 4096):
        for seed in range(3):
            order = list(range(len(reqs)))
            random.Random(seed).shuffle(order)
            got = logprobs(engine(tiny, token_budget=budget), [reqs[i] for i in order])
            back = [0.0] * len(reqs)
            for pos, i in enumerate(order):
                back[i] = got[pos]
            assert back == pytest.approx(base, abs=1e-5)


def test_tokens_computed_near_unique_tokens(tiny):
    reqs = icqs_shaped(tiny[0].vocab_size, seed=1)
    eng = engine(tiny, token_budget=64)
    eng.score(reqs)
    s = eng.last_stats
    unique = set()
    for ctx, cont in reqs:
        seq = ctx + cont
        unique |= {tuple(seq[:i]) for i in range(1, len(seq))}  # every distinct input prefix = one token computed
    assert s.tokens_computed <= 1.1 * len(unique)
    assert s.tokens_requested == sum(len(c) + len(a) - 1 for c, a in reqs)
    assert s.tokens_computed < s.tokens_requested / 5
    assert eng.kv.used_pages == 0  # exact lifetimes: everything freed at the end


@pytest.mark.parametrize("budget", [64, 200, 4096])
def test_a_step_fills_its_budget_across_tree_levels(tiny, budget):
    """A node planned to its end brings the nodes below it into the same step (each layer stores the step's K/V
    before its attention reads the cache): an ICQS-shaped job runs in as many forward steps as its unique tokens
    fill budgets, not one tree level per step (3 levels: demo set, question, answer), with the unshared scores."""
    reqs = icqs_shaped(tiny[0].vocab_size, seed=4, demo_sets=4)
    base = logprobs(engine(tiny), reqs, share_prefix=False)
    eng = engine(tiny, token_budget=budget)
    assert logprobs(eng, reqs) == pytest.approx(base, abs=1e-5)
    stats = eng.last_stats
    assert stats.forward_steps == -(-stats.tokens_computed // budget), (stats.forward_steps, stats.tokens_computed)


def test_kv_exhaustion_preempts_and_recomputes(tiny):
    """6 pages, as many as the largest request needs at once: the planner runs out and preempts. (With 10, the
    job fits: a step takes a demo set's questions and answers with the demo set, depth first, so its subtree
    finishes and frees its pages before the next starts.)"""
    reqs = icqs_shaped(tiny[0].vocab_size, seed=2, demo_sets=6)
    base = logprobs(engine(tiny), reqs, share_prefix=False)
    eng = engine(tiny, kv_tokens=96, page_size=16, token_budget=512)
    assert logprobs(eng, reqs) == pytest.approx(base, abs=1e-5)
    assert eng.last_stats.preemptions > 0
    assert eng.last_stats.peak_kv_pages <= 6
    assert eng.kv.used_pages == 0


def test_online_cache_reuses_and_evicts(tiny):
    reqs = icqs_shaped(tiny[0].vocab_size, seed=3)
    base = logprobs(engine(tiny), reqs, share_prefix=False)
    eng = engine(tiny, keep_cache=True, token_budget=64)
    first = logprobs(eng, reqs[: len(reqs) // 2])
    assert first == pytest.approx(base[: len(reqs) // 2], abs=1e-5)
    again = logprobs(eng, reqs)
    assert again == pytest.approx(base, abs=1e-5)
    assert eng.last_stats.cache_hit_tokens > 0
    assert eng.kv.used_pages > 0  # kept for the next call
    small = engine(tiny, keep_cache=True, kv_tokens=128, token_budget=64)  # cannot keep everything: LRU evicts
    for chunk in range(0, len(reqs), 6):
        assert logprobs(small, reqs[chunk : chunk + 6]) == pytest.approx(base[chunk : chunk + 6], abs=1e-5)
    assert small.last_stats.evicted_nodes > 0


def test_generation_shares_prompt_prefix(tiny):
    eng = engine(tiny)
    prompt = list(range(10, 60))
    greedy = eng.generate([prompt, prompt + [7]], max_tokens=6)
    single = [eng.generate([p], max_tokens=6)[0].token_ids for p in (prompt, prompt + [7])]
    assert [g.token_ids for g in greedy] == single
    a = eng.generate([prompt] * 3, max_tokens=8, temperature=1.0, top_p=0.9, seed=11)
    b = eng.generate([prompt] * 3, max_tokens=8, temperature=1.0, top_p=0.9, seed=11)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 1
    assert eng.kv.used_pages == 0


def test_generation_evicts_cached_prefixes_when_full(tiny):
    eng = engine(tiny, keep_cache=True, kv_tokens=96, page_size=16)
    eng.score([(list(range(10, 70)), [5])])  # fills 4 of 6 pages with a cached prefix
    out = eng.generate([list(range(100, 140))], max_tokens=20)  # needs more pages than are free
    fresh = engine(tiny).generate([list(range(100, 140))], max_tokens=20)
    assert out[0].token_ids == fresh[0].token_ids
    assert eng.last_stats.evicted_nodes > 0


def test_positions_computed_without_their_hidden_states_are_computed_again(tiny):
    """The last layer's o-projection and MLP run only on the rows a step's requests ask for, so a cached context
    keeps no hidden states but those; a later request whose continuation starts inside it shares the context up to
    there and computes the rest in a node of its own, with the log-probs of a cold engine."""
    rng = random.Random(5)
    ctx = [rng.randrange(4, tiny[0].vocab_size) for _ in range(40)]
    cont = [rng.randrange(4, tiny[0].vocab_size) for _ in range(3)]
    eng = engine(tiny, keep_cache=True, token_budget=64)
    eng.score([(ctx, cont)])
    s = eng.last_stats
    assert (s.tokens_computed, s.hidden_rows) == (len(ctx) + len(cont) - 1, len(cont))
    later = [(ctx[:25], ctx[25:] + cont), (ctx, cont[:1] + [9, 8])]  # the second needs only kept states
    base = logprobs(engine(tiny), later, share_prefix=False)
    assert logprobs(eng, later) == pytest.approx(base, abs=1e-5)
    s = eng.last_stats
    assert s.cache_hit_tokens == 24 + len(ctx) + 1  # position 24 on computed anew for the first
    assert s.tokens_computed == (len(ctx) + len(cont) - 1 - 24) + 1
    assert logprobs(eng, later) == pytest.approx(base, abs=1e-5)  # again: the same, from the same cache
    assert eng.kv.used_pages > 0


def test_the_last_layer_runs_on_the_rows_asked_for(tiny):
    reqs = icqs_shaped(tiny[0].vocab_size, seed=4)
    eng = engine(tiny)
    eng.score(reqs)
    s = eng.last_stats
    # one row per distinct (scored position) of the job: the answers' positions under each demo set and question
    needed = {tuple((c + a)[: p + 1]) for c, a in reqs for p in range(len(c) - 1, len(c) + len(a) - 1)}
    assert s.hidden_rows == len(needed) < s.tokens_computed / 3
