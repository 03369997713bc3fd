"""Deterministic mode: a request's log-probs are bitwise the same (max diff 0.0) whatever else the job holds.

The same 20 requests are scored alone, mixed into 200 others, shuffled, with prefix sharing off, under token
budgets 5 / 37 / 1024, from a warm online cache and from a cold one, and in the engine loop arriving a few at a
time between steps beside other scoring requests and greedy generations, in bf16 and fp32. Contexts are long enough
(up to ~420 tokens) to cross the attention's fixed KV chunks, and requests share demo prefixes of different lengths
so node boundaries fall inside chunks. The kernel-level tests check each batch-invariant op on its own.

The same holds on the torch reference path (no native library, or ENGINE_KERNELS=torch): smaller jobs of several
sizes and orders, and the CLI's chunked, resumed run against the same rows scored alone."""

from __future__ import annotations

import json
import random

import pytest
import torch
from attention_problems import cascade_problem, with_segments
from tensor_reads import refused_tensor_reads

import kernels.dispatch
import kernels.linear
from engine import Engine
from engine.loader import load_model_files
from kernels import StepKernels, batch_invariant, native_ops
from kernels.attention import AttentionPlan, Segment, cascade_attention_ref, segment_attention_merge_ref

needs_native = pytest.mark.skipif(not native_ops.load(), reason="the batch-invariant CPU attention is the native op")
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_files(str(tiny_model_dir))


def jobs(vocab: int, seed: int = 0):
    """(targets, others): ICQS-shaped requests, demo set x question x answer, demo sets sharing a first part."""
    rng = random.Random(seed)
    toks = lambda n: [rng.randrange(4, vocab) for _ in range(n)]  # noqa: E731
    common = toks(140)
    demos = [common + toks(rng.randrange(20, 260)) for _ in range(6)]
    reqs = []
    for d in demos:
        for _ in range(10):
            q = toks(rng.randrange(3, 12))
            reqs += [(d + q, toks(rng.randrange(1, 5))) for _ in range(rng.randrange(3, 6))]
    rng.shuffle(reqs)
    return reqs[:20], reqs[20:220]


def engine(tiny, dtype, **opts):
    config, weights, tok = tiny
    return Engine(config, weights, tok, dtype=dtype, deterministic=True, **{"kv_tokens": 16384, **opts})


def token_logprobs(results):
    return [r.token_logprobs for r in results]


@pytest.fixture(params=["panels", "row tiles"])
def linear_form(request, monkeypatch):
    """The deterministic mode's linears: the native panels (AVX2 builds) or F.linear on fixed row tiles (the
    other builds; forced here by hiding the panels)."""
    if request.param == "panels" and not kernels.linear.panels_available():
        pytest.skip("the native panels run only in an AVX2 build of the library")
    if request.param == "row tiles":
        monkeypatch.setattr(kernels.linear, "panels_available", lambda: False)
    return request.param


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_scores_bitwise_independent_of_the_job(tiny, dtype, linear_form):
    targets, others = jobs(tiny[0].vocab_size)
    assert len(others) == 200
    alone = token_logprobs(engine(tiny, dtype).score(targets))
    mixed = targets + others
    order = list(range(len(mixed)))
    random.Random(1).shuffle(order)
    cases = {}
    for budget in (5, 37, 1024):
        got = engine(tiny, dtype, token_budget=budget).score([mixed[i] for i in order])
        back = {i: got[pos] for pos, i in enumerate(order)}
        cases[f"mixed, shuffled, budget {budget}"] = token_logprobs([back[i] for i in range(20)])
    cases["mixed, sharing off"] = token_logprobs(engine(tiny, dtype).score(mixed, share_prefix=False)[:20])
    warm = engine(tiny, dtype, keep_cache=True, token_budget=37)
    warm.score(others)
    cases["warm online cache"] = token_logprobs(warm.score(targets))
    assert warm.last_stats.cache_hit_tokens > 0
    cases["same engine again (cache hits on every request)"] = token_logprobs(warm.score(targets[::-1]))[::-1]
    cases["engine loop, interleaved arrivals with generations"] = interleaved(tiny, dtype, targets, others)
    for name, got in cases.items():
        diff = max(abs(a - b) for x, y in zip(got, alone) for a, b in zip(x, y))
        assert got == alone, f"{name}: max diff {diff}"


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_sliding_window_scores_bitwise_independent_of_the_job(tiny_model_dirs, dtype):
    """Gemma-3's local layers (a window of 8, far shorter than the prompts and the shared demo prefixes) in the
    batch-invariant mode: each row's keys cut by its own position, so a score keeps its bits whatever the job."""
    gemma = load_model_files(str(tiny_model_dirs["gemma3"]))
    assert gemma[0].sliding_window == 8 and any(gemma[0].sliding_layers)
    targets, others = jobs(gemma[0].vocab_size, seed=3)
    targets, others = targets[:8], others[:80]
    alone = token_logprobs(engine(gemma, dtype).score(targets))
    mixed = targets + others
    order = list(range(len(mixed)))
    random.Random(2).shuffle(order)
    for budget in (7, 1024):
        got = engine(gemma, dtype, token_budget=budget).score([mixed[i] for i in order])
        back = {i: got[pos] for pos, i in enumerate(order)}
        assert token_logprobs([back[i] for i in range(8)]) == alone, f"budget {budget}"
    assert token_logprobs(engine(gemma, dtype).score(mixed, share_prefix=False)[:8]) == alone


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_scores_bitwise_the_same_at_any_thread_count_where_the_panels_run(tiny, dtype):
    """Where StepKernels.thread_invariant says so (the linears on the panels), 1 and 2 threads give the same bits,
    so Engine.load runs the mode on the machine's free cores instead of one."""
    if not StepKernels.thread_invariant(dtype, "cpu"):
        pytest.skip("the linears are not on the native panels in this build")
    targets, others = jobs(tiny[0].vocab_size, seed=5)
    job = targets + others[:60]
    threads = torch.get_num_threads()
    got = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got[n] = token_logprobs(engine(tiny, dtype, token_budget=97).score(job))
    finally:
        torch.set_num_threads(threads)
    assert got[1] == got[2]


@needs_native
def test_engine_load_fixes_one_thread_only_where_the_bits_depend_on_it(tiny_model_dir, monkeypatch):
    import engine.engine as engine_module

    monkeypatch.setattr(engine_module, "default_threads", lambda: 2)
    threads = torch.get_num_threads()
    try:
        Engine.load(str(tiny_model_dir), dtype="float32", deterministic=True, kv_tokens=1024)
        assert torch.get_num_threads() == (2 if StepKernels.thread_invariant(torch.float32, "cpu") else 1)
        monkeypatch.setattr(kernels.linear, "panels_available", lambda: False)
        Engine.load(str(tiny_model_dir), dtype="float32", deterministic=True, kv_tokens=1024)
        assert torch.get_num_threads() == 1
        Engine.load(str(tiny_model_dir), dtype="float32", deterministic=True, kv_tokens=1024, threads=2)
        assert torch.get_num_threads() == 2  # named threads are the user's choice
        Engine.load(str(tiny_model_dir), dtype="float32", kv_tokens=1024)
        assert torch.get_num_threads() == 2  # the fast mode: the free cores
    finally:
        torch.set_num_threads(threads)


def interleaved(tiny, dtype, targets, others):
    """Engine.add_score / add_generate / step: requests arrive 0-4 at a time between steps, greedy generations
    from prompts sharing the demo prefixes mixed in; returns the targets' token log-probs."""
    eng = engine(tiny, dtype, token_budget=53)
    rng = random.Random(4)
    items = [("score", i, r) for i, r in enumerate(targets)] + [("score", None, r) for r in others[:120]]
    items += [("generate", None, (ctx, None)) for ctx, _ in others[120:140]]
    rng.shuffle(items)
    handles = {}
    while items or eng.has_pending():
        for _ in range(rng.randrange(0, 5)):
            if items:
                kind, i, (ctx, cont) = items.pop()
                h = eng.add_score(ctx, cont) if kind == "score" else eng.add_generate(ctx, max_tokens=6)
                if i is not None:
                    handles[i] = h
        eng.step()
    return token_logprobs([handles[i].result() for i in range(len(targets))])


@needs_native
def test_deterministic_mode_matches_the_default_engine(tiny):
    """The batch-invariant ops compute the same function (fp32, 1e-5)."""
    targets, _ = jobs(tiny[0].vocab_size, seed=3)
    config, weights, tok = tiny
    default = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=16384).score(targets)
    det = engine(tiny, torch.float32).score(targets)
    assert [r.logprob for r in det] == pytest.approx([r.logprob for r in default], abs=1e-5)


@needs_native
def test_the_steps_key_chunks_are_built_from_the_hosts_facts(tiny, monkeypatch):
    """chunk_segments builds an engine step's chunks from the segments' row ranges and the sequences' first
    positions (host facts) without reading a tensor back (a read from the GPU waits for the device), and gives
    the chunks it builds by reading the rows and positions when a plan lacks those facts."""
    plans = []
    real = batch_invariant.chunk_segments

    def spy(plan, chunk=batch_invariant.KV_CHUNK):
        with refused_tensor_reads("chunk_segments"):
            out = real(plan, chunk)
        plans.append((plan, chunk, out))
        return out

    monkeypatch.setattr(batch_invariant, "chunk_segments", spy)
    targets, others = jobs(tiny[0].vocab_size, seed=4)
    engine(tiny, torch.float32, token_budget=37).score(targets + others)
    assert len(plans) > 5 and sum(len(out) for *_, out in plans) > 5 * len(plans)
    for plan, chunk, out in plans:
        bare = AttentionPlan(
            plan.cu_seqlens, [Segment(s.rows, s.slots) for s in plan.segments], plan.positions, plan.write_slots
        )
        read = real(bare, chunk)
        assert len(read) == len(out)
        for a, b in zip(read, out):
            assert torch.equal(a.rows, b.rows) and torch.equal(a.slots, b.slots) and a.position == b.position
            assert (a.limits is None and b.limits is None) or torch.equal(a.limits, b.limits)


def _windowed_by_reading(chunks, window):
    """The reference of batch_invariant.windowed_chunks: every row's position read from the device."""
    out = []
    for c in chunks:
        starts = (window.positions[c.rows] - (window.size - 1) - c.position).clamp(min=0)
        last = torch.full_like(starts, c.slots.numel() - 1)
        last = last if c.limits is None else last.minimum(c.limits)
        seen = starts <= last
        if bool(seen.any()):
            out.append(Segment(c.rows[seen], c.slots, starts[seen], None if c.limits is None else c.limits[seen]))
    return out


def test_windowed_chunks_are_built_from_the_hosts_facts(tiny_model_dirs, monkeypatch):
    """Gemma-3's local layers cut each row's chunks at its window on the host (the chunks' row ranges, the
    sequences' first positions), reading no tensor back, and keep exactly the rows, starts and limits that reading
    every row's position gives, at the engine's chunk size and at small ones (many chunk positions)."""
    seen_plans = []
    real = batch_invariant.windowed_chunks

    def spy(chunks, window, plan):
        with refused_tensor_reads("windowed_chunks"):
            out = real(chunks, window, plan)
        seen_plans.append((plan, window))
        return out

    monkeypatch.setattr(batch_invariant, "windowed_chunks", spy)
    config, weights, tok = load_model_files(str(tiny_model_dirs["gemma3"]))
    targets, others = jobs(config.vocab_size, seed=6)
    Engine(config, weights, tok, dtype=torch.float32, deterministic=True, kv_tokens=16384, token_budget=37).score(
        targets + others[:60]
    )
    assert seen_plans
    for plan, window in seen_plans:
        for size in (batch_invariant.KV_CHUNK, 16, 3):
            chunks = batch_invariant.chunk_segments(plan, size)
            got, want = real(chunks, window, plan), _windowed_by_reading(chunks, window)
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert torch.equal(a.rows, b.rows) and torch.equal(a.starts, b.starts) and a.slots is b.slots
                assert (a.limits is None and b.limits is None) or torch.equal(a.limits, b.limits)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_linear_row_tiles_are_batch_invariant(dtype):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 80, generator=g).to(dtype), torch.randn(300, 80, generator=g).to(dtype)
    full = batch_invariant.linear(x, w)
    for lo, hi in ((0, 1), (5, 6), (3, 20), (7, 70), (0, 129), (100, 300)):
        assert torch.equal(batch_invariant.linear(x[lo:hi], w), full[lo:hi]), (lo, hi)
    torch.testing.assert_close(full.float(), torch.nn.functional.linear(x, w).float(), atol=1e-2, rtol=1e-2)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_target_logprobs_row_tiles_are_batch_invariant(dtype):
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(150, 32, generator=g).to(dtype), torch.randn(500, 32, generator=g).to(dtype)
    t = torch.randint(0, 500, (150,), generator=g)
    out = batch_invariant.target_logprobs(h, w, t, vocab_tile=128)
    full, greedy = out.logprob, out.greedy
    for lo, hi in ((0, 1), (9, 10), (3, 40), (64, 150)):
        part = batch_invariant.target_logprobs(h[lo:hi], w, t[lo:hi], vocab_tile=128)
        lp, gr = part.logprob, part.greedy
        assert torch.equal(lp, full[lo:hi]) and torch.equal(gr, greedy[lo:hi])


def _chunked_attention(p, rows_of_interest, chunk):
    """Rows of one problem through chunk_segments + the native merge, the new K/V stored first."""
    q, T, N = p["q"], p["q"].shape[0], p["k_cache"].shape[0]
    k_cache, v_cache = torch.cat([p["k_cache"], p["k_new"]]), torch.cat([p["v_cache"], p["v_new"]])
    write = torch.arange(N, N + T)  # the step's new K/V, stored in fresh slots before attention
    cu, segments = p["plan"].cu_seqlens, p["plan"].segments
    cached = [sum(s.slots.numel() for s in segments if bool((s.rows == cu[b]).any())) for b in range(len(cu) - 1)]
    positions = torch.cat([torch.arange(cached[b], cached[b] + cu[b + 1] - cu[b]) for b in range(len(cu) - 1)])
    plan = AttentionPlan(cu, segments, positions, write)
    out = batch_invariant.cascade_attention(
        q, k_cache, v_cache, plan, p["scale"], native_ops.segment_attention_merge_native, chunk=chunk
    )
    ref = batch_invariant.cascade_attention(
        q, k_cache, v_cache, plan, p["scale"], segment_attention_merge_ref, chunk=chunk
    )
    return out[rows_of_interest], ref[rows_of_interest]


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_chunked_attention_is_batch_invariant_and_exact(dtype):
    """One sequence's rows alone, beside other sequences, and with its cache cut at other node boundaries."""
    kw = dict(H=6, Hkv=2, D=32, dtype=dtype)
    # sequence 0 below a shared segment of 50 and its own cached 30: 80 cached keys, 25 new tokens
    base = cascade_problem([25], shared_len=50, own_lens=[30], seed=1, **kw)
    slots = torch.cat([s.slots for s in base["plan"].segments])
    variants = []
    for cut in (50, 17, 64, 79):  # the same 80 cached keys split into two segments at another boundary
        p = with_segments(base, [Segment(torch.arange(25), slots[:cut]), Segment(torch.arange(25), slots[cut:])])
        variants.append(_chunked_attention(p, torch.arange(25), chunk=32)[0])
    more = cascade_problem([25, 9, 40], shared_len=50, own_lens=[30, 3, 70], seed=1, **kw)  # same first sequence
    for name in ("q", "k_new", "v_new"):
        more[name][:25] = base[name][:25]
    pad = torch.arange(base["k_cache"].shape[0], base["k_cache"].shape[0] + 73)  # the other sequences' caches
    more["k_cache"] = torch.cat([base["k_cache"], torch.randn(73, 2, 32).to(dtype)])
    more["v_cache"] = torch.cat([base["v_cache"], torch.randn(73, 2, 32).to(dtype)])
    more = with_segments(
        more,
        [
            Segment(torch.arange(74), slots[:50]),
            Segment(torch.arange(25), slots[50:]),
            Segment(torch.arange(25, 34), pad[:3]),
            Segment(torch.arange(34, 74), pad[3:73]),
        ],
    )
    got, ref = _chunked_attention(more, torch.arange(25), chunk=32)
    variants.append(got)
    for v in variants[1:]:
        assert torch.equal(v, variants[0])
    want = cascade_attention_ref(
        **{k: (x.float() if torch.is_tensor(x) and x.is_floating_point() else x) for k, x in base.items()}
    )
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(variants[0].float(), want, **tol)
    torch.testing.assert_close(ref.float(), want, **tol)


@pytest.fixture
def torch_kernels():
    """The torch reference kernels for every op: what runs where the native library is absent or stale, and under
    ENGINE_KERNELS=torch; on one thread, as Engine.load runs the mode where the linears are F.linear on row tiles
    (a row tile's bits depend on the thread count, not on the job)."""
    threads = torch.get_num_threads()
    kernels.dispatch.set_backend("torch")
    torch.set_num_threads(1)
    yield
    kernels.dispatch.set_backend(None)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_torch_reference_scores_bitwise_independent_of_the_job(tiny_model_dirs, arch, dtype, torch_kernels):
    """Each target scored in a job of its own, then inside jobs of other sizes and orders (first, last, shuffled
    among others), under token budgets that cut it across steps, and with prefix sharing off; Gemma-3's local
    layers (a window of 8) too."""
    tiny = load_model_files(str(tiny_model_dirs[arch]))
    assert arch != "gemma3" or (tiny[0].sliding_window == 8 and any(tiny[0].sliding_layers))
    targets, others = jobs(tiny[0].vocab_size, seed=7)
    targets, others = targets[:6], others[:40]
    alone = [token_logprobs(engine(tiny, dtype).score([t]))[0] for t in targets]
    cases = {"targets together": token_logprobs(engine(tiny, dtype).score(targets))}
    cases["targets reversed after 3 others"] = token_logprobs(engine(tiny, dtype).score(others[:3] + targets[::-1]))[
        3:
    ][::-1]
    mixed = targets + others
    order = list(range(len(mixed)))
    random.Random(8).shuffle(order)
    for budget in (5, 37, 1024):
        got = engine(tiny, dtype, token_budget=budget).score([mixed[i] for i in order])
        back = {i: got[pos] for pos, i in enumerate(order)}
        cases[f"mixed, shuffled, budget {budget}"] = token_logprobs([back[i] for i in range(len(targets))])
    cases["mixed, sharing off"] = token_logprobs(engine(tiny, dtype).score(mixed, share_prefix=False)[: len(targets)])
    for name, got in cases.items():
        diff = max(abs(a - b) for x, y in zip(got, alone) for a, b in zip(x, y))
        assert got == alone, f"{name}: max diff {diff}"


def test_torch_reference_resumed_cli_run_bitwise_as_whole(tiny_model_dir, tmp_path, monkeypatch, capsys, torch_kernels):
    """`python -m engine score --deterministic` in chunks of 3 rows over 8 pairs, against rows 3..7 scored by a
    run of their own (what a resumed run does): the same per-token log-probs, bit for bit."""
    import commands.engine_cli

    monkeypatch.setattr(commands.engine_cli, "CHUNK_ROWS", 3)
    rows = [
        json.dumps({"context": f"Reading is a quiet way {i % 3} of thinking", "continuation": f" with someone {i}"})
        for i in range(8)
    ]
    (tmp_path / "all.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "tail.jsonl").write_text("\n".join(rows[3:]) + "\n")
    for name in ("all", "tail"):
        args = ["--model", tiny_model_dir, "--dtype", "float32", "--quiet", "--deterministic"]
        args += ["--input", tmp_path / f"{name}.jsonl", "--output", tmp_path / f"{name}.out.jsonl"]
        assert commands.engine_cli.main(["score", *map(str, args)]) == 0, capsys.readouterr().err
    whole, tail = (
        [json.loads(x)["token_logprobs"] for x in (tmp_path / f"{n}.out.jsonl").read_text().splitlines()]
        for n in ("all", "tail")
    )
    assert whole[3:] == tail


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_torch_segment_merge_is_batch_invariant(dtype):
    """batch_invariant.segment_attention_merge (the torch form): 5 rows with their key limits and starts give the
    same bits alone, one at a time, among other rows at other places (1 to 300 rows in the call), and with more
    keys past every row's limit in the chunk (a sequence with more new tokens in the step); and the values of the
    reference."""
    g = torch.Generator().manual_seed(0)
    H, Hkv, D, T = 6, 2, 16, 400
    q = torch.randn(T, H, D, generator=g).to(dtype)
    k_cache, v_cache = (torch.randn(1000, Hkv, D, generator=g).to(dtype) for _ in range(2))
    slots = torch.randperm(1000, generator=g)[:256]
    rows = torch.tensor([7, 100, 3, 250, 399])
    limits = torch.tensor([0, 40, 17, 59, 33])
    starts = torch.tensor([0, 2, 17, 0, 30])
    prior_out, prior_lse = torch.randn(T, H, D, generator=g), torch.randn(T, H, generator=g)

    def merged(rows, limits, starts, n_slots):
        out, lse = prior_out.clone(), prior_lse.clone()
        batch_invariant.segment_attention_merge(
            q, rows, k_cache, v_cache, slots[:n_slots], 0.25, out, lse, limits, starts
        )
        return out, lse

    want = merged(rows, limits, starts, 60)
    others = torch.tensor([r for r in range(T) if r not in rows.tolist()])
    cases = [(rows[i : i + 1], limits[i : i + 1], starts[i : i + 1], 60) for i in range(5)]  # each alone
    cases += [(rows, limits, starts, n) for n in (61, 100, 256)]
    for n_other, at in ((1, 0), (2, 1), (11, 3), (40, 5), (295, 2)):
        o = others[:n_other]
        cases.append(
            (
                torch.cat([o[:at], rows, o[at:]]),
                torch.cat([torch.full((at,), 59), limits, torch.full((n_other - at,), 59)]),
                torch.cat([torch.zeros(at, dtype=torch.long), starts, torch.zeros(n_other - at, dtype=torch.long)]),
                200,
            )
        )
    for r, lim, st, n in cases:
        out, lse = merged(r, lim, st, n)
        mine = rows[torch.isin(rows, r)]
        assert torch.equal(out[mine], want[0][mine]) and torch.equal(lse[mine], want[1][mine]), (len(r), n)
    ref_out, ref_lse = prior_out.clone(), prior_lse.clone()
    segment_attention_merge_ref(q, rows, k_cache, v_cache, slots[:60], 0.25, ref_out, ref_lse, limits, starts)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(want[0], ref_out, **tol)
    torch.testing.assert_close(want[1], ref_lse, **tol)
