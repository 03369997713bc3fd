"""The prefix cache on its own (no model): page reference counts and its victim indexes stay exact under random
insert / lock / unlock / compute / evict / preempt sequences; eviction and preemption pick the least recently used
victim from their indexes, without walking the tree."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import prefix_cache
from engine.kv_cache import KVCache
from engine.plan import PendingRow
from engine.prefix_cache import Kind, PrefixCache, Span
from engine.work_queue import WorkQueue

CONFIG = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=2, hidden_size=2, sliding_window=None)


def new_cache(pages: int = 12, page_size: int = 4, keep: bool = True) -> PrefixCache:
    return PrefixCache(KVCache(CONFIG, pages, page_size, torch.float32, "cpu"), keep)


def compute(cache: PrefixCache, path) -> bool:
    """Reserve and mark computed every node of a path (as a step would); False when pages run short."""
    cache.tick()
    for node in path:
        if not cache.complete(node):
            if not cache.reserve(node, len(node)):
                return False
            cache.computed(node, len(node))
    return True


def no_walk(*_):
    raise AssertionError("walked the whole tree")


def assert_path_holds(cache: PrefixCache, path, seq: list[int]):
    """An insert's path holds the sequence: each node starts where its parent ends, with the sequence's tokens."""
    pos = 0
    for node in path:
        span = cache.span(node)
        assert span.start == pos and cache.chunk_source(node, 0, span.length).tokens == seq[pos : pos + span.length]
        pos += span.length
    assert pos == len(seq)


def test_an_insert_that_cuts_a_node_past_its_middle_stops_at_the_cut():
    """The cut leaves the node's tail shorter than the match; the walk must still end there, not go on into the
    tail's children (whose keys may equal the sequence's next token): a node would start at the wrong position
    and attend to keys it does not have."""
    cache = new_cache(pages=16)
    cache.match_insert(list(range(1, 11)))
    cache.match_insert(list(range(1, 11)) + [20, 21])
    seq = list(range(1, 8)) + [20, 22]
    assert_path_holds(cache, cache.match_insert(seq).path, seq)


seqs = st.lists(st.integers(0, 3), min_size=1, max_size=14)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs),
        st.tuples(st.just("private"), seqs),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("compute"), st.integers(0, 50)),
        st.tuples(st.just("evict"), st.integers(1, 48)),
        st.tuples(st.just("preempt"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, keep=st.booleans())
def test_refcounts_and_indexes_stay_exact(ops, keep):
    cache = new_cache(keep=keep)
    locked = []  # (leaf, path) of the "requests" holding a lock
    pid = 0
    for op, arg in ops:
        if op == "insert":
            matched = cache.match(arg)  # one walk serves a prefix of the sequence too (Scheduler._add_score)
            for n in range(1, len(arg) + 1):
                assert cache.match_prefix(matched, n) == cache.match(arg[:n])
            path = cache.match_insert(arg, matched).path
            assert_path_holds(cache, path, arg)
            cache.lock(path[-1])
            locked.append(path[-1])
        elif op == "private":
            pid += 1
            leaf = cache.add_private(None, arg, 0, Kind.PRIVATE, ("private", pid))
            cache.lock(leaf)
            locked.append(leaf)
        elif op == "unlock" and locked:
            cache.unlock(locked.pop(arg % len(locked)))
        elif op == "compute" and locked:
            leaf = locked[arg % len(locked)]
            if not compute(cache, cache.lineage(leaf)[::-1]):
                cache.evict(len(leaf))
        elif op == "evict":
            cache.evict(arg)
        elif op == "preempt" and locked:
            leaf = locked[arg % len(locked)]
            cache.preempt({id(n) for n in cache.lineage(leaf)})
        cache.check()
    for leaf in locked:
        cache.unlock(leaf)
    cache.check()
    if not keep:
        assert cache.kv.used_pages == 0 and not cache.children()


def test_an_insert_reports_the_node_it_cut_and_rows_follow_the_cut():
    """The cache calls nobody back: an insert that cuts a node says so in its result, and score rows kept at
    absolute positions move to the new upper node by position alone."""
    cache = new_cache()
    first = cache.match_insert([1, 2, 3, 4, 5])
    assert first.split is None and first.cached == 0 and len(first.path) == 1
    node, queue = first.path[0], WorkQueue(cache)
    for p in range(5):
        queue.wait(node, PendingRow(p, None, p, 0))
    assert cache.reserve(node, 3)
    cache.computed(node, 3)
    second = cache.match_insert([1, 2, 9])
    cut = second.split
    assert cut.lower is node and cut.upper is second.path[0] and cut.at == 2 and second.cached == 2
    assert cache.span(cut.upper) == Span(0, 2, 2, Kind.SHARED) and cache.span(node) == Span(2, 3, 1, Kind.SHARED)
    assert cache.slot(cut.upper, 1) + 1 == cache.slot(node, 2)  # the page holding the cut is shared
    queue.follow(cut)
    assert [r.position for r in queue.take(cut.upper, 0, 2)] == [0, 1]
    assert [r.position for r in queue.take(node, 2, 5)] == [2, 3, 4] and not queue.needs(node)
    cache.check()


def test_evict_takes_the_least_recently_used_leaf_without_walking(monkeypatch):
    cache = new_cache(pages=8, page_size=4, keep=True)
    leaves = []
    for first in (1, 2, 3):  # three cached prefixes of one page each, used in this order
        path = cache.match_insert([first, 9, 9, 9]).path
        cache.lock(path[-1])
        assert compute(cache, path)
        cache.unlock(path[-1])
        leaves.append(path[-1])
    # prefix 1 used again (a step computes a continuation of it): now prefix 2 is the least recently used
    path = cache.match_insert([1, 9, 9, 9, 7, 7]).path
    cache.lock(path[-1])
    assert compute(cache, path) and path[0] is leaves[0]
    cache.unlock(path[-1])
    monkeypatch.setattr(prefix_cache, "walk", no_walk)
    assert cache.evict(cache.free_tokens() + 1) == 1
    assert [cache.tokens(n)[0] for n in cache.children()] == [1, 3]
    assert cache.evict(10**6) == 3 and not cache.children()  # 3, then [7, 7], then its parent [1, 9, 9, 9]


def test_preempt_takes_the_least_recently_used_node_outside_keep(monkeypatch):
    cache = new_cache(pages=8, page_size=4, keep=False)
    paths = []
    for first in (1, 2, 3):
        path = cache.match_insert([first, 5, 5, 5, 5]).path
        cache.lock(path[-1])
        assert compute(cache, path)
        paths.append(path)
    monkeypatch.setattr(prefix_cache, "walk", no_walk)
    victim = cache.preempt({id(paths[0][-1])})  # the oldest is kept: the next oldest goes
    assert victim is paths[1][-1] and not cache.holds_pages(victim) and cache.span(victim).done == 0
    assert cache.preempt(set()) is paths[0][-1]
    assert cache.preempt({id(paths[2][-1])}) is None


@pytest.mark.parametrize("keep", [False, True])
def test_engine_pages_stay_exact_under_random_add_abort_step(tiny_model_dir, keep):
    """The engine's own cache under random scoring, generation and aborts on a cache that must evict and preempt."""
    import random

    from engine import Engine
    from engine.loader import load_model_files

    config, w, tok = load_model_files(str(tiny_model_dir))
    eng = Engine(config, w, tok, dtype=torch.float32, kv_tokens=128, page_size=8, token_budget=24, keep_cache=keep)
    rng = random.Random(3)
    demos = [[rng.randrange(4, 100) for _ in range(rng.randrange(20, 60))] for _ in range(4)]
    handles = []
    for _ in range(120):
        r = rng.random()
        if r < 0.5:
            handles.append(eng.add_score(rng.choice(demos) + [rng.randrange(4, 100)], [rng.randrange(4, 100)]))
        elif r < 0.62:
            handles.append(eng.add_generate(rng.choice(demos)[: rng.randrange(2, 30)], max_tokens=rng.randrange(1, 6)))
        elif r < 0.7 and handles:
            eng.abort(rng.choice(handles))
        else:
            eng.step()
        eng.check_pages()
    eng.run()
    eng.check_pages()
    assert all(h.done for h in handles)
    stats = eng.stats
    assert stats.evicted_nodes + stats.preemptions > 0  # the cache was under pressure
    if not keep:
        assert stats.kv_pages_used == 0
