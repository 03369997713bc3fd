"""Every Triton kernel against its torch reference on the device present: on a CUDA GPU the compiled kernels in
fp32 (<= 1e-5) and bf16 (against the fp32 reference on the same bf16 inputs); without one, the Triton interpreter
in fp32 (the bf16 cases skip).

TRITON_INTERPRET must be on when the kernels are decorated, i.e. before kernels.*_triton is imported."""

import os

import torch  # noqa: E402

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

pytest.importorskip("triton")

from attention_problems import cascade_problem, cascade_window, varlen_problem  # noqa: E402

from kernels import attention_triton as AT  # noqa: E402
from kernels.attention import (  # noqa: E402  # noqa: E402
    AttentionPlan,
    AttentionWindow,
    Segment,
    cascade_attention_ref,
    fold_short_segments,
    paged_decode_attention_ref,
    segment_attention_merge_ref,
    segment_waves,
    varlen_causal_attention_ref,
)
from kernels.linear_triton import linear_invariant_triton  # noqa: E402
from kernels.logprob import target_logprobs_ref  # noqa: E402
from kernels.logprob_triton import target_logprobs_triton  # noqa: E402
from kernels.rmsnorm import rms_norm_ref  # noqa: E402
from kernels.rmsnorm_triton import rms_norm_triton  # noqa: E402
from kernels.rope import rope_cos_sin, rope_store_kv_ref  # noqa: E402
from kernels.rope_triton import rope_store_kv_triton  # noqa: E402
from kernels.swiglu import silu_and_mul_ref  # noqa: E402
from kernels.swiglu_triton import silu_and_mul_triton  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not CUDA, reason="bf16: CUDA only"))]


def on(dtype, *tensors):
    """The tensors on the test device, floating ones in dtype."""
    return [t.to(DEVICE, dtype) if t.is_floating_point() else t.to(DEVICE) for t in tensors]


def close(got, want, dtype):
    """A kernel result against the fp32 reference computed on the same (rounded) inputs."""
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), **(TOL if dtype == torch.float32 else BF16_TOL))


def problem_on(p: dict, dtype) -> dict:
    out = {}
    for k, x in p.items():
        if torch.is_tensor(x):
            out[k] = x.to(DEVICE, dtype) if x.is_floating_point() else x.to(DEVICE)
        elif k == "plan":
            out[k] = AttentionPlan(x.cu_seqlens, [Segment(s.rows.to(DEVICE), s.slots.to(DEVICE)) for s in x.segments])
        else:
            out[k] = x
    return out


def fp32(p: dict) -> dict:
    return {k: (x.float() if torch.is_tensor(x) and x.is_floating_point() else x) for k, x in p.items()}


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(with_residual, dtype):
    x, w, res = on(dtype, randn(5, 37), randn(37, seed=1), randn(5, 37, seed=2))
    res = res if with_residual else None
    out, new_res = rms_norm_triton(x, w, 1e-5, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-5, res)
    close(out, ref_out, dtype)
    close(new_res, ref_res, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["default", "llama3"])
def test_rope_store_kv(scaling, dtype):
    """q and k rotated, v copied, k and v in the cache at the slots; qkv's rows strided as a slice of a wider
    projection; the input untouched."""
    H, Hkv, D = 6, 2, 20
    cos, sin = on(torch.float32, *rope_cos_sin(D, 10000.0, scaling, 300))
    wide, positions, slots = on(
        dtype,
        randn(7, (H + 2 * Hkv) * D + 8),
        torch.tensor([0, 1, 2, 150, 299, 64, 5]),
        torch.tensor([5, 0, 9, 3, 7, 11, 2]),
    )
    qkv = wide[:, 4 : 4 + (H + 2 * Hkv) * D]
    before = qkv.clone()
    caches = on(dtype, *[torch.zeros(12, Hkv, D) for _ in range(4)])
    want = rope_store_kv_ref(qkv, positions, cos, sin, caches[0], caches[1], slots, H, Hkv)
    got = rope_store_kv_triton(qkv, positions, cos, sin, caches[2], caches[3], slots, H, Hkv)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.is_contiguous()
        close(g, w, dtype)
    close(caches[2], caches[0], dtype)
    close(caches[3], caches[1], dtype)
    assert torch.equal(caches[3], caches[1]) and caches[0].abs().sum() > 0  # v is copied, k written
    assert torch.equal(qkv, before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    (gate_up,) = on(dtype, randn(3, 5, 2 * 23))
    close(silu_and_mul_triton(gate_up), silu_and_mul_ref(gate_up), dtype)


# odd lengths, a lone token, an empty sequence, a sequence over several key tiles
SEQ_LENS = [5, 1, 0, 19, 40]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_varlen_causal_attention(ratio, window, dtype):
    p = problem_on(varlen_problem(SEQ_LENS, H=ratio, Hkv=1, D=20, seed=ratio), dtype)
    out, lse = AT.varlen_causal_attention_triton(**p, window=window)
    ref_out, ref_lse = varlen_causal_attention_ref(**fp32(p), window=window)
    close(out, ref_out, dtype)
    close(lse, ref_lse, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ratio,D", [(1, 20), (3, 20), (4, 20), (4, 256)])  # 256: Gemma-3's head_dim
def test_cascade_attention(ratio, D, dtype):
    p = problem_on(
        cascade_problem([3, 18, 1], shared_len=21, own_lens=[0, 5, 33], H=ratio, Hkv=1, D=D, seed=ratio), dtype
    )
    close(AT.cascade_attention_triton(**p), cascade_attention_ref(**fp32(p)), dtype)


def tree_problem(dtype, seed=0):
    """A step below a prefix tree, as the ICQS job and decoding make: 12 sequences (1 to 11 new tokens) below a
    3-key root shared by all (shorter than a key tile: folded into the segments below it), 3 demo-set segments
    each shared by 4 sequences (some longer than a block of query rows), and a run of own cached keys for most;
    segments listed root first, as engine/step.py builds them."""
    gen = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(1, 12, (12,), generator=gen)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    H, Hkv, D = 4, 2, 16
    T = cu[-1]
    sizes = [3] + [int(x) for x in torch.randint(5, 40, (3,), generator=gen)]
    own = [int(x) for x in torch.randint(0, 9, (12,), generator=gen)]
    num_slots = sum(sizes) + sum(own) + 5
    slots = torch.randperm(num_slots, generator=gen)
    used, segments = 0, []

    def take(n):
        nonlocal used
        used += n
        return slots[used - n : used]

    segments.append(Segment(torch.arange(T), take(3)))
    for g in range(3):
        segments.append(Segment(torch.arange(cu[4 * g], cu[4 * g + 4]), take(sizes[g + 1])))
    for b, n in enumerate(own):
        if n:
            segments.append(Segment(torch.arange(cu[b], cu[b + 1]), take(n)))
    rand = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    p = dict(
        q=rand(T, H, D),
        k_new=rand(T, Hkv, D),
        v_new=rand(T, Hkv, D),
        k_cache=rand(num_slots, Hkv, D),
        v_cache=rand(num_slots, Hkv, D),
        plan=AttentionPlan(cu, segments),
        scale=D**-0.5,
    )
    return problem_on(p, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cascade_attention_below_a_tree_runs_a_launch_per_wave(dtype, monkeypatch):
    """Segments that share no row go in one launch (a wave): the root (folded into the demo sets below it), the
    demo sets, the own runs: 2 launches of the merge kernel for the step's 14 segments, whatever their number, and the same
    result as the reference. A second layer of the same step reuses the waves."""
    p = tree_problem(dtype)
    segments = p["plan"].segments
    launches = []
    merge = AT._merge
    monkeypatch.setattr(AT, "_merge", lambda *a, **k: launches.append(a[5].shape[0]) or merge(*a, **k))
    want = cascade_attention_ref(**fp32(p))
    close(AT.cascade_attention_triton(**p), want, dtype)
    # what the tiles make of the tree: the key tile sets what folds, the row tile how many items a segment takes
    rows_per_item, key_tile = AT._blocks(p["q"], 2)[0] // 2, AT._blocks(p["q"], 2)[1]
    folded = fold_short_segments(segments, key_tile)
    assert len(segments) == 14 and len(launches) == len(segment_waves(folded)) < len(segments)
    assert sum(launches) == sum(-(-s.rows.numel() // rows_per_item) for s in folded), launches
    if not CUDA:  # the interpreter's tiles (16 keys, 8 rows): the root folds, demo sets and own runs stay apart
        assert len(launches) == 2 and sum(launches) > len(segments) - 1, launches
    n = len(launches)
    close(AT.cascade_attention_triton(**p), want, dtype)
    assert len(launches) == 2 * n


def test_waves_from_row_ranges_match_waves_from_rows():
    """The step builder gives each segment its rows as ranges, one per sequence (chunk) below it: folding and waves
    computed on the ranges are those computed on the rows read from the device."""
    plan = tree_problem(torch.float32)["plan"]
    cu = plan.cu_seqlens

    def ranges(rows):
        r = set(rows.tolist())
        return tuple((cu[b], cu[b + 1] - cu[b]) for b in range(len(cu) - 1) if cu[b] in r)

    # rows on the meta device: the grouping must not read them (it reads the ranges)
    with_ranges = [Segment(s.rows.to("meta"), s.slots, row_ranges=ranges(s.rows)) for s in plan.segments]
    for key_tile in (16, 64):
        a, b = fold_short_segments(plan.segments, key_tile), fold_short_segments(with_ranges, key_tile)
        assert [(s.rows.numel(), s.slots.tolist()) for s in a] == [(s.rows.numel(), s.slots.tolist()) for s in b]
        wa, wb = segment_waves(a), segment_waves(b)
        assert len(wa) == len(wb) >= 2
        for x, y in zip(wa, wb):
            assert x.row_offsets.tolist() == y.row_offsets.tolist() and x.slots.tolist() == y.slots.tolist()


def test_cascade_attention_without_cache():
    p = problem_on(cascade_problem([4, 7], shared_len=0, own_lens=[0, 0], H=2, Hkv=2, D=16), torch.float32)
    assert p["plan"].segments == []
    close(AT.cascade_attention_triton(**p), cascade_attention_ref(**p), torch.float32)


@pytest.mark.parametrize("size", [1, 7, 30, 1000])
@pytest.mark.parametrize("D", [16, 256])
def test_windowed_cascade_attention(size, D):
    """Gemma-3's sliding window: windows shorter than the new tokens and than the shared segment (rows then take
    nothing from it), and one longer than everything; head_dim 256 as Gemma-3-270M has."""
    own = [0, 5, 12]
    p = problem_on(cascade_problem([3, 18, 1], shared_len=21, own_lens=own, H=4, Hkv=1, D=D, seed=size), torch.float32)
    window = cascade_window(p, 21, own, size)
    window = type(window)(size, window.positions.to(DEVICE), window.slot_positions.to(DEVICE))
    want = cascade_attention_ref(**p, window=window)
    close(AT.cascade_attention_triton(**p, window=window), want, torch.float32)
    if size < 1000:  # the window changes the result (the test can fail)
        assert not torch.allclose(want.cpu(), cascade_attention_ref(**p).cpu(), atol=1e-3)


def test_segment_merge_with_row_starts_and_limits():
    """The deterministic mode's merge under a window: each row sees the keys from its start to its limit; a row
    whose range is empty keeps its (out, lse)."""
    p = problem_on(cascade_problem([12], shared_len=40, own_lens=[0], H=4, Hkv=2, D=16), torch.float32)
    rows, slots = p["plan"].segments[0].rows, p["plan"].segments[0].slots
    limits = torch.tensor([0, 3, 39, 17, 31, 32, 33, 5, 16, 15, 38, 1], device=DEVICE)
    starts = torch.tensor([0, 2, 30, 17, 0, 33, 1, 6, 16, 9, 0, 1], device=DEVICE)
    outs = []
    for merge, args in ((AT.segment_attention_merge_triton, p), (segment_attention_merge_ref, fp32(p))):
        out = torch.randn(12, 4, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        lse = torch.randn(12, 4, generator=torch.Generator().manual_seed(6)).to(DEVICE)
        merge(args["q"], rows, args["k_cache"], args["v_cache"], slots, p["scale"], out, lse, limits, starts)
        outs.append((out, lse))
    close(outs[0][0], outs[1][0], torch.float32)
    close(outs[0][1], outs[1][1], torch.float32)
    keep = starts > limits  # rows 5 and 7: nothing to see
    assert torch.equal(
        outs[0][0][keep], torch.randn(12, 4, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)[keep]
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_segment_merge_with_row_limits(dtype):
    """The deterministic mode's merge: each row sees the segment's keys up to its own limit."""
    p = problem_on(cascade_problem([12], shared_len=40, own_lens=[0], H=4, Hkv=2, D=16), dtype)
    rows, slots = p["plan"].segments[0].rows, p["plan"].segments[0].slots
    limits = torch.tensor([0, 3, 39, 17, 31, 32, 33, 5, 16, 15, 38, 1], device=DEVICE)
    outs = []
    for merge, args in ((AT.segment_attention_merge_triton, p), (segment_attention_merge_ref, fp32(p))):
        out = torch.randn(12, 4, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        lse = torch.randn(12, 4, generator=torch.Generator().manual_seed(6)).to(DEVICE)
        merge(args["q"], rows, args["k_cache"], args["v_cache"], slots, p["scale"], out, lse, limits)
        outs.append((out, lse))
    close(outs[0][0], outs[1][0], dtype)
    close(outs[0][1], outs[1][1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 3])
def test_target_logprobs(splits, dtype):
    hidden, weight = randn(19, 40), randn(301, 40, seed=1)
    targets = torch.randint(0, 301, (19,), generator=torch.Generator().manual_seed(2))
    targets[0] = 300  # last vocabulary entry (in the last, partial tile)
    hidden, weight, targets = on(dtype, hidden, weight, targets)
    targets[1] = int((hidden[1].float() @ weight.float().T).argmax())  # one greedy row
    out, ref = (
        target_logprobs_triton(hidden, weight, targets, splits=splits),
        target_logprobs_ref(hidden, weight, targets, vocab_tile=64, row_tile=8),
    )
    lp, greedy, ref_lp, ref_greedy = out.logprob, out.greedy, ref.logprob, ref.greedy
    close(lp, ref_lp, dtype)
    assert torch.equal(greedy.cpu(), ref_greedy.cpu()) and bool(greedy[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_deterministic_chunks_merge_in_waves_with_the_bits_of_one_by_one(dtype):
    """The deterministic mode's key chunks (batch_invariant.chunk_segments) merged a position at a time in one
    launch each (the merge's wave form) give every row the bits of merging the chunks one by one, and the
    reference's values: each chunk's rows are cut into the same work items either way."""
    import kernels.dispatch
    from kernels import batch_invariant

    seq_lens, own = [5, 1, 9, 3], [300, 0, 40, 270]  # chunks of 256 keys: shared, own, and the new tokens' own
    p = problem_on(cascade_problem(seq_lens, shared_len=280, own_lens=own, H=8, Hkv=2, D=64, seed=3), dtype)
    cu, segments = p["plan"].cu_seqlens, p["plan"].segments
    N, T = p["k_cache"].shape[0], p["q"].shape[0]
    k_cache, v_cache = torch.cat([p["k_cache"], p["k_new"]]), torch.cat([p["v_cache"], p["v_new"]])
    write = torch.arange(N, N + T, device=DEVICE)
    cached = [280 + own[b] for b in range(len(seq_lens))]
    positions = torch.cat([torch.arange(cached[b], cached[b] + seq_lens[b]) for b in range(len(seq_lens))])

    def plan():
        return AttentionPlan(cu, segments, positions.to(DEVICE), write, seq_starts=cached)

    merge = AT.segment_attention_merge_triton
    assert kernels.dispatch._wave_form(merge) is AT.wave_merge_triton  # what the deterministic mode passes
    waves = batch_invariant.cascade_attention(
        p["q"], k_cache, v_cache, plan(), p["scale"], merge, chunk=64, waves=AT.wave_merge_triton
    )
    each = batch_invariant.cascade_attention(p["q"], k_cache, v_cache, plan(), p["scale"], merge, chunk=64)
    assert torch.equal(waves, each)
    chunks = batch_invariant.chunk_segments(plan(), 64)
    kinds = {(c.position, c.limits is None) for c in chunks}  # a launch per position and form, not per chunk
    assert len(batch_invariant.chunk_waves(chunks)) == len(kinds) < len(chunks)
    ref = batch_invariant.cascade_attention(
        p["q"].float(), k_cache.float(), v_cache.float(), plan(), p["scale"], segment_attention_merge_ref, chunk=64
    )
    close(waves, ref, dtype)


def paged_decode_problem(B=6, H=4, Hkv=1, D=20, shared=37, seed=0):
    """A decode step as the fixed-shape path sees it: B sequences sharing a `shared`-slot prompt, each with cached
    keys of its own after it (0 to 80), its new token's key stored last; table [B, W] padded past each row's
    length with junk slots (never read), one padding row of length 0. Also the same step in the cascade's form."""
    gen = torch.Generator().manual_seed(seed)
    own = [int(x) for x in torch.randint(0, 81, (B - 1,), generator=gen)] + [0]
    lens = [shared + o + 1 for o in own[:-1]] + [0]
    num_slots = shared + sum(o + 1 for o in own) + 8
    perm = torch.randperm(num_slots, generator=gen)  # slots scattered over the cache, as pages are
    k_cache = torch.randn(num_slots, Hkv, D, generator=gen)
    v_cache = torch.randn(num_slots, Hkv, D, generator=gen)
    W = max(lens) + 5
    table = torch.full((B, W), int(perm[-1]), dtype=torch.int32)
    nxt, rows = shared, []
    for b in range(B - 1):
        mine = perm[nxt : nxt + own[b] + 1]
        nxt += own[b] + 1
        rows.append(torch.cat([perm[:shared], mine]))
        table[b, : lens[b]] = rows[-1].int()
    q = torch.randn(B, H * Hkv, D, generator=gen)
    return q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32), rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "ratio,D,window,splits",
    [(1, 20, 0, 1), (4, 20, 0, 1), (3, 64, 0, 1), (4, 20, 16, 1), (1, 256, 40, 1), (4, 20, 0, 4), (3, 64, 40, 8)],
)
def test_paged_decode_attention(ratio, D, window, splits, dtype):
    """The kernel over whole rows, and with each row's keys cut into parts merged by a second launch
    (flash-decoding): rows of 38 to 118 keys in parts of whole 16-key tiles, so that some parts of the shorter rows
    (and every part of the padding row) see no key."""
    q, kc, vc, table, lens, _ = paged_decode_problem(H=ratio, D=D, seed=ratio + D)
    q, kc, vc, table, lens = on(dtype, q, kc, vc, table, lens)
    got = AT.paged_decode_attention_split(q, kc, vc, table, lens, D**-0.5, window, splits)
    want = paged_decode_attention_ref(q.float(), kc.float(), vc.float(), table, lens, D**-0.5, window)
    close(got, want, dtype)
    assert not got[-1].any(), "a padding row (length 0) gives zeros"
    if splits == 1:
        assert torch.equal(got, AT.paged_decode_attention_triton(q, kc, vc, table, lens, D**-0.5, window))


def test_decode_splits_fill_the_device_only_where_rows_do_not():
    """Llama-3-8B (8 KV heads) on an H100 (132 multiprocessors): one sequence over a 8,192-slot table in 32 parts
    of 256 keys; 64 sequences fill the device unsplit; a short table caps the parts at 256 keys each; a power of
    2 always (the combine kernel's tile)."""
    assert AT.decode_splits(1, 8, 8192, 132) == 32
    assert AT.decode_splits(64, 8, 8192, 132) == 1
    assert AT.decode_splits(1, 8, 1024, 132) == 4
    assert AT.decode_splits(1, 8, 256, 132) == 1
    assert AT.decode_splits(4, 8, 1 << 20, 132) == 8
    assert AT.decode_splits(1, 1, 1 << 20, 132) == AT.SPLIT_MAX
    for rows in range(1, 40):
        n = AT.decode_splits(rows, 3, 4096, 100)
        assert n & (n - 1) == 0 and 1 <= n <= 16
    assert AT.decode_splits(6, 1, 118, AT._multiprocessors(torch.device("cpu"))) == 1  # the interpreter: whole rows


@pytest.mark.parametrize("window", [0, 16])
def test_paged_decode_reference_is_the_cascade_of_a_decode_step(window):
    """The fixed-shape form computes what the engine's cascade computes for the same decode step: each sequence's
    new token causally over itself (k_new) and its cached keys as one segment (under a window, by position)."""
    q, kc, vc, table, lens, rows = paged_decode_problem(H=4, Hkv=2, D=16, seed=3)
    B = len(rows)
    last = torch.stack([r[-1] for r in rows])
    segs = [Segment(torch.tensor([b]), r[:-1]) for b, r in enumerate(rows)]
    plan = AttentionPlan(list(range(B + 1)), segs)
    win = None
    if window:
        slot_pos = torch.zeros(kc.shape[0], dtype=torch.int64)
        for r in rows:
            slot_pos[r] = torch.arange(len(r))
        win = AttentionWindow(window, torch.tensor([len(r) - 1 for r in rows]), slot_pos)
    want = cascade_attention_ref(q[:B], kc[last], vc[last], kc, vc, plan, 0.25, win)
    got = paged_decode_attention_ref(q, kc, vc, table, lens, 0.25, window)
    torch.testing.assert_close(got[:B], want, **TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "M,K,N,bias", [(1, 48, 24, False), (7, 70, 50, True), (40, 64, 96, False), (69, 33, 130, True)]
)
def test_linear_invariant_matches_f_linear(M, K, N, bias, dtype):
    """The batch-invariant Triton linear computes F.linear: K and N past whole tiles, a bias, 1 to 69 rows."""
    gen = torch.Generator().manual_seed(M + K)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen) * 0.1
    b = torch.randn(N, generator=gen) if bias else None
    x, w = on(dtype, x, w)
    b = None if b is None else b.to(DEVICE, dtype)
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    close(linear_invariant_triton(x, w, b), want, dtype)
    close(linear_invariant_triton(x.view(1, M, K), w, b)[0], want, dtype)  # any leading shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_invariant_rows_are_bitwise_the_same_in_any_batch(dtype):
    """A row's output alone and inside batches of 2 to 200 rows: the same bits (the deterministic mode's contract; a
    K split across programs, or tiles chosen by M, would break it). On a GPU at any place in the batch. Under the
    interpreter each tl.dot is a numpy matmul, whose BLAS rounds a row by its place inside the tile (not what a
    GPU's MMA does), so there the row keeps its place in a tile: the batch's size and the other rows change."""
    gen = torch.Generator().manual_seed(3)
    K, N = 100, 70
    x, w = on(dtype, torch.randn(200, K, generator=gen), torch.randn(N, K, generator=gen) * 0.1)
    row = x[17:18]
    alone = linear_invariant_triton(row, w)[0]
    tile = 32  # the interpreter's BLOCK_M (linear_triton._tiles)
    for n in (2, 33, 200):
        for at in (0, n // 2, n - 1) if CUDA else sorted({0, (n // 2) // tile * tile, (n - 1) // tile * tile}):
            others = torch.cat([x[:17], x[18:]])[: n - 1]
            batch = torch.cat([others[:at], row, others[at:]])
            assert torch.equal(linear_invariant_triton(batch, w)[at], alone), (n, at)
