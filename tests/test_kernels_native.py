"""The native CPU ops (kernels/native, built by `pip install` through CMakeLists.txt) against the torch references:
attention in fp32 to 1e-5 and in bf16 against the fp32 reference on the same (bf16-rounded) inputs; the row-wise
ops (RMSNorm, RoPE with the KV store, SwiGLU, greedy decoding's argmax) and the LM head fused with the target's
log-softmax in fp32 and bf16.

The library must be built; set ICQS_NO_NATIVE=1 to skip these tests on a machine without a C++ toolchain."""

import os

import pytest
import torch
from attention_problems import cascade_problem, cascade_window, upcast, varlen_problem, with_segments

from kernels import native_ops
from kernels.attention import (
    Segment,
    cascade_attention_ref,
    fold_short_segments,
    segment_attention_merge_ref,
    segment_waves,
    varlen_causal_attention_ref,
)

if os.environ.get("ICQS_NO_NATIVE") == "1":
    pytest.skip("ICQS_NO_NATIVE=1", allow_module_level=True)

TOL = dict(atol=1e-5, rtol=1e-5)
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
SEQ_LENS = [5, 1, 0, 19, 70, 300]  # a lone token, an empty sequence, several work items


def test_library_is_built():
    assert native_ops.load(), f"libicqs_native.so missing in {native_ops.LIB_DIR}: run `pip install -e .` or cmake"


@pytest.mark.parametrize("D", [20, 64, 256])
@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_varlen_causal_attention_fp32(ratio, window, D):
    assert native_ops.load()
    p = varlen_problem(SEQ_LENS, H=2 * ratio, Hkv=2, D=D, seed=ratio)
    out, lse = native_ops.varlen_causal_attention_native(**p, window=window)
    ref_out, ref_lse = varlen_causal_attention_ref(**p, window=window)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)


@pytest.mark.parametrize("D", [20, 64, 256])
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_cascade_attention_fp32(ratio, D):
    assert native_ops.load()
    # 100 stacked rows x 4 heads span several work items; segments of 1, 5, 33 and 70 keys cover partial tiles
    p = cascade_problem([3, 18, 1, 78], shared_len=70, own_lens=[1, 5, 33, 0], H=ratio, Hkv=1, D=D, seed=ratio)
    torch.testing.assert_close(native_ops.cascade_attention_native(**p), cascade_attention_ref(**p), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_attention_decode_step(dtype):
    """One new token per sequence (the self part's lone-token path: out = v, lse = the score), under a shared
    segment and own segments of 0-9 keys, GQA 3."""
    assert native_ops.load()
    p = cascade_problem([1] * 6, shared_len=40, own_lens=[3, 0, 9, 1, 0, 5], H=6, Hkv=2, D=64, dtype=dtype)
    out = native_ops.cascade_attention_native(**p)
    torch.testing.assert_close(
        out.float(), cascade_attention_ref(**upcast(p)), **(TOL if dtype == torch.float32 else BF16_TOL)
    )
    alone = cascade_problem([1, 1], shared_len=0, own_lens=[0, 0], H=4, Hkv=2, D=32, dtype=dtype)
    out, lse = native_ops.varlen_causal_attention_native(
        alone["q"], alone["k_new"], alone["v_new"], alone["plan"].cu_seqlens, alone["scale"]
    )
    assert torch.equal(out, alone["v_new"].float().repeat_interleave(2, dim=1))
    want = (alone["q"].float() * alone["k_new"].float().repeat_interleave(2, dim=1)).sum(-1) * alone["scale"]
    torch.testing.assert_close(lse, want, **TOL)


def test_cascade_attention_without_cache():
    assert native_ops.load()
    p = cascade_problem([4, 7], shared_len=0, own_lens=[0, 0], H=2, Hkv=2, D=16)
    torch.testing.assert_close(native_ops.cascade_attention_native(**p), cascade_attention_ref(**p), **TOL)


@pytest.mark.parametrize("ratio", [1, 3])
def test_bf16_against_fp32_reference(ratio):
    assert native_ops.load()
    p = cascade_problem([3, 40], shared_len=50, own_lens=[7, 0], H=3 * ratio, Hkv=3, D=64, dtype=torch.bfloat16)
    out = native_ops.cascade_attention_native(**p)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), cascade_attention_ref(**upcast(p)), **BF16_TOL)
    pv = varlen_problem(SEQ_LENS, H=3 * ratio, Hkv=3, D=64, dtype=torch.bfloat16)
    out, lse = native_ops.varlen_causal_attention_native(**pv)
    ref_out, ref_lse = varlen_causal_attention_ref(**upcast(pv))
    torch.testing.assert_close(out, ref_out, **BF16_TOL)
    torch.testing.assert_close(lse, ref_lse, **BF16_TOL)


def test_segment_merge_reads_the_cache_in_place():
    """The merge updates only the given rows and leaves the cache untouched."""
    assert native_ops.load()
    p = cascade_problem([6, 6], shared_len=9, own_lens=[0, 0], H=2, Hkv=1, D=16)
    k_before = p["k_cache"].clone()
    out = torch.zeros(12, 2, 16)
    lse = torch.full((12, 2), float("-inf"))
    rows, slots = torch.arange(6, 12), p["plan"].segments[0].slots
    torch.ops.icqs_native.segment_attention_merge_(
        p["q"], rows, p["k_cache"], p["v_cache"], slots, p["scale"], out, lse
    )
    assert torch.equal(p["k_cache"], k_before)
    assert torch.all(out[:6] == 0) and torch.all(lse[:6] == float("-inf"))
    assert torch.isfinite(lse[6:]).all()


# --- row-wise ops: fp32 to 1e-5; bf16 to one bf16 rounding step (the references compute in bf16 as well) ---
DTYPE_TOL = {torch.float32: TOL, torch.bfloat16: dict(atol=1e-6, rtol=8e-3)}


def randn(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    assert native_ops.load()
    from kernels.rmsnorm import rms_norm_ref

    x, w = randn(70, 37, dtype=dtype), randn(37, dtype=dtype, seed=1)
    res = randn(70, 37, dtype=dtype, seed=2) if with_residual else None
    out, new_res = native_ops.rms_norm_native(x, w, 1e-5, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-5, res)
    torch.testing.assert_close(out, ref_out, **DTYPE_TOL[dtype])
    torch.testing.assert_close(new_res, ref_res, **DTYPE_TOL[dtype])
    assert with_residual or new_res is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
    ids=["default", "llama3"],
)
@pytest.mark.parametrize("T", [9, 1, 0])
def test_rope_store_kv(dtype, scaling, T):
    """The reference (split, RoPE in place, index_copy_ into the cache; v bitwise), from rows strided as a slice of
    a wider projection; other cache slots and the input untouched."""
    assert native_ops.load()
    from kernels.rope import rope_cos_sin, rope_store_kv_ref

    H, Hkv, D = 6, 2, 20
    cos, sin = rope_cos_sin(D, 10000.0, scaling, 300)
    qkv = randn(T, (H + 2 * Hkv) * D + 8, dtype=dtype)[:, 3 : 3 + (H + 2 * Hkv) * D]
    positions = torch.tensor([0, 1, 2, 150, 299, 64, 5, 7, 7])[:T]
    slots = torch.tensor([5, 0, 9, 3, 7, 11, 2, 4, 13])[:T]
    before = qkv.clone()
    caches = [randn(14, Hkv, D, dtype=dtype, seed=i) for i in range(2)]
    caches += [c.clone() for c in caches]
    want = rope_store_kv_ref(qkv, positions, cos, sin, caches[0], caches[1], slots, H, Hkv)
    got = native_ops.rope_store_kv_native(qkv, positions, cos, sin, caches[2], caches[3], slots, H, Hkv)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g, w, **DTYPE_TOL[dtype])
    torch.testing.assert_close(caches[2], caches[0], **DTYPE_TOL[dtype])
    assert torch.equal(got[2], want[2]) and torch.equal(caches[3], caches[1])
    untouched = torch.ones(14, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(caches[2][untouched], caches[0][untouched])
    assert torch.equal(qkv, before)


def test_rope_store_kv_rejects_out_of_range_slots_and_positions():
    assert native_ops.load()
    from kernels.rope import rope_cos_sin

    cos, sin = rope_cos_sin(8, 10000.0, None, 16)
    qkv, cache = randn(2, 4 * 8, dtype=torch.float32), torch.zeros(4, 1, 8)
    with pytest.raises(RuntimeError, match="slot out of the cache"):
        native_ops.rope_store_kv_native(
            qkv, torch.tensor([0, 1]), cos, sin, cache, cache.clone(), torch.tensor([0, 4]), 2, 1
        )
    with pytest.raises(RuntimeError, match="position out of the rope table"):
        native_ops.rope_store_kv_native(
            qkv, torch.tensor([0, 16]), cos, sin, cache, cache.clone(), torch.tensor([0, 1]), 2, 1
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(dtype):
    assert native_ops.load()
    from kernels.swiglu import silu_and_mul_ref

    gate_up = randn(3, 5, 2 * 23, dtype=dtype) * 4
    torch.testing.assert_close(native_ops.silu_and_mul_native(gate_up), silu_and_mul_ref(gate_up), **DTYPE_TOL[dtype])
    # the ends of the vector exp2 (its exponent built from bits on AVX2, scalef on AVX-512): underflow to exactly
    # 0 and overflow to inf, so silu(g) is g for large g and -0 for very negative g, never NaN
    gate = torch.tensor(
        [-1e4, -300.0, -130.0, -90.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 90.0, 130.0, 300.0, 1e4, 3.0, -3.0, 7.5, 0.5],
        dtype=dtype,
    )
    gate_up = torch.cat([gate, torch.full_like(gate, 1.5)]).view(1, -1)
    got, want = native_ops.silu_and_mul_native(gate_up), silu_and_mul_ref(gate_up)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, **DTYPE_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segment_waves_match_reference(dtype):
    """cascade_attention_native merges the segments of a wave (no shared rows) in one call, the one-token rows
    key by key (sweep_direct): against the reference, with a tree three levels deep (a shared root, two branches,
    own segments) as a decode step of many sequences has."""
    assert native_ops.load()
    p = cascade_problem(
        [1, 1, 3, 1, 2, 1], shared_len=40, own_lens=[5, 0, 9, 1, 33, 2], H=6, Hkv=2, D=32, dtype=dtype, seed=7
    )
    root, own = p["plan"].segments[0], p["plan"].segments[1:]
    branch = [
        Segment(torch.arange(0, 4), torch.randperm(p["k_cache"].shape[0])[:11]),
        Segment(torch.arange(5, 9), torch.randperm(p["k_cache"].shape[0])[:17]),
    ]
    segments = [root] + branch + own
    waves = segment_waves(segments)
    assert len(waves) == 3
    seen = []  # per row, the waves of its segments, in segment order
    for w, wave in enumerate(waves):
        rows, row_off, slots, slot_off = wave.rows, wave.row_offsets, wave.slots, wave.slot_offsets
        assert wave.starts is None
        assert len(set(rows.tolist())) == rows.numel()  # no row twice in one wave
        assert row_off[-1] == rows.numel() and slot_off[-1] == slots.numel()
        seen += [(r, w) for r in rows.tolist()]
    for r in range(9):
        assert [w for row, w in seen if row == r] == sorted(w for row, w in seen if row == r)
    got = native_ops.cascade_attention_native(**with_segments(p, segments))
    torch.testing.assert_close(
        got.float(),
        cascade_attention_ref(**upcast(with_segments(p, segments))).float(),
        **(TOL if dtype == torch.float32 else BF16_TOL),
    )


# --- the sliding window (Gemma-3's local layers) ---
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size", [1, 6, 40, 75, 1000])
@pytest.mark.parametrize("D", [64, 256])
def test_windowed_cascade_matches_reference(size, dtype, D):
    """Windows shorter than the new tokens, than the shared segment, and longer than everything; rows whose
    window ends before a segment take nothing from it; tiles of the bf16 micro-kernel cut by the window."""
    assert native_ops.load()
    own = [0, 12, 3, 45]
    p = cascade_problem([1, 37, 70, 5], shared_len=90, own_lens=own, H=4, Hkv=1, D=D, dtype=dtype, seed=size)
    window = cascade_window(p, 90, own, size)
    got = native_ops.cascade_attention_native(**p, window=window)
    want = cascade_attention_ref(**upcast(p), window=window)
    torch.testing.assert_close(got.float(), want, **(TOL if dtype == torch.float32 else BF16_TOL))
    if size < 1000:  # the window changes the result (the test can fail)
        assert not torch.allclose(want, cascade_attention_ref(**upcast(p)).float(), **BF16_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segment_merge_starts_and_limits(dtype):
    """Each row sees slots[start:limit + 1]: as the reference over that slice, row by row; a row with an empty
    range keeps its running (out, lse)."""
    assert native_ops.load()
    p = cascade_problem([40], shared_len=70, own_lens=[0], H=6, Hkv=2, D=64, dtype=dtype, seed=3)
    rows, slots = torch.arange(40), p["plan"].segments[0].slots
    gen = torch.Generator().manual_seed(1)
    starts = torch.randint(0, 70, (40,), generator=gen)
    limits = torch.clamp(starts + torch.randint(-3, 70, (40,), generator=gen), max=69)
    out0 = torch.randn(40, 6, 64, generator=gen)
    lse0 = torch.randn(40, 6, generator=gen)
    out, lse = out0.clone(), lse0.clone()
    native_ops.segment_attention_merge_native(
        p["q"], rows, p["k_cache"], p["v_cache"], slots, p["scale"], out, lse, limits, starts
    )
    q, kc, vc = (p[k].float() for k in ("q", "k_cache", "v_cache"))
    tol = TOL if dtype == torch.float32 else BF16_TOL
    for r in range(40):
        o, l = out0[r : r + 1].clone(), lse0[r : r + 1].clone()
        lo, hi = int(starts[r]), int(limits[r])
        if hi >= lo:
            oo, ll = out0.clone(), lse0.clone()
            segment_attention_merge_ref(q, torch.tensor([r]), kc, vc, slots[lo : hi + 1], p["scale"], oo, ll)
            o, l = oo[r : r + 1], ll[r : r + 1]
        torch.testing.assert_close(out[r : r + 1], o, **tol)
        torch.testing.assert_close(lse[r : r + 1], l, **tol)


@pytest.mark.parametrize("own_lens", [[40, 35, 5], [40, 35, 0]])
def test_short_segments_fold_into_the_segments_below(own_lens):
    """A 4-key root over every sequence's own segment folds into them (its keys come first in each); with a
    sequence that has nothing below the root, it stays. A short segment with nothing below it stays. The
    results are the reference's either way."""
    assert native_ops.load()
    p = cascade_problem([3, 4, 2], shared_len=4, own_lens=own_lens, H=6, Hkv=2, D=32, seed=5)
    segments = p["plan"].segments
    folded = fold_short_segments(segments)
    root_slots = segments[0].slots
    if 0 not in own_lens:
        assert len(folded) == 3
        for (rows, slots), (rows0, slots0) in (
            ((a.rows, a.slots), (b.rows, b.slots)) for a, b in zip(folded, segments[1:])
        ):
            assert torch.equal(rows, rows0) and torch.equal(slots, torch.cat([root_slots, slots0]))
    else:
        assert len(folded) == len(segments)
        assert all(torch.equal(a.slots, b.slots) for a, b in zip(folded, segments))
    torch.testing.assert_close(native_ops.cascade_attention_native(**p), cascade_attention_ref(**p), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 17, 49152])
def test_greedy_logprobs(dtype, V):
    """Greedy decoding's argmax (the first index on ties, as torch.argmax) and its log-softmax, against the
    reference on the same logits."""
    assert native_ops.load()
    from kernels.logprob import greedy_logprobs_ref

    x = (randn(5, V, dtype=torch.float32) * 6).to(dtype)
    if V > 20:
        x[2, 40] = x[2, 7] = x[2, 30000 % V] = 100.0  # a tie: the first index wins
        x[4, V - 1] = 90.0  # the largest at the last position (the vector loop's tail)
    tokens, logprobs = native_ops.greedy_logprobs_native(x)
    ref_tokens, ref_logprobs = greedy_logprobs_ref(x)
    assert torch.equal(tokens, ref_tokens)
    if V > 20:
        assert tokens[2] == 7 and tokens[4] == V - 1
    torch.testing.assert_close(logprobs, ref_logprobs, atol=2e-6, rtol=1e-6)


needs_avx2 = pytest.mark.skipif(
    not (native_ops.load() and native_ops.simd() != "none"), reason="the fused LM head needs an AVX2 build"
)


@needs_avx2
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V,K", [(1, 64), (17, 20), (4096, 64), (9001, 36), (49152, 576)])
def test_target_logprobs_fused_head(dtype, V, K):
    """The LM head fused with the target's log-softmax against the reference (an fp32 product of the same
    inputs): log-probs to fp32 rounding, is_greedy exactly (ties and the largest logit as the target included);
    vocabularies of one chunk, several (4096 rows each) and a partial one, K not a multiple of 8."""
    from kernels.logprob import target_logprobs_ref

    n = 9
    h = randn(n, K, dtype=torch.float32, seed=1).to(dtype)
    w = (randn(V, K, dtype=torch.float32, seed=2) * (0.3 if K > 100 else 1)).to(dtype)
    t = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(3))
    logits = h.float() @ w.float().T
    t[0] = logits[0].argmax()  # greedy
    t[1] = logits[1].argmin()  # not greedy (unless V == 1)
    out, ref = native_ops.target_logprobs_native(h, w, t), target_logprobs_ref(h, w, t)
    lp, greedy, ref_lp, ref_greedy = out.logprob, out.greedy, ref.logprob, ref.greedy
    assert lp.dtype == torch.float32 and greedy.dtype == torch.bool
    assert torch.equal(greedy, ref_greedy) and bool(greedy[0])
    torch.testing.assert_close(lp, ref_lp, atol=2e-5, rtol=1e-5)
    if V == 1:
        assert torch.equal(lp, torch.zeros(n))


@needs_avx2
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_target_logprobs_rows_and_threads_do_not_change_the_bits(dtype):
    """A row's log-prob is bitwise the same alone, at any place among other rows (the 4-row register blocks and
    their tails) and at 1 or 2 threads (fixed vocabulary chunks merged in order): the deterministic mode uses
    the op as it is."""
    h = randn(11, 64, dtype=torch.float32, seed=4).to(dtype)
    w = randn(10000, 64, dtype=torch.float32, seed=5).to(dtype)
    t = torch.randint(0, 10000, (11,), generator=torch.Generator().manual_seed(6))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_ops.target_logprobs_native(h, w, t).logprob
        torch.set_num_threads(2)
        two = native_ops.target_logprobs_native(h, w, t).logprob
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    for lo, hi in [(0, 1), (3, 4), (5, 11), (2, 9), (10, 11)]:
        part = native_ops.target_logprobs_native(h[lo:hi], w, t[lo:hi]).logprob
        assert torch.equal(part, one[lo:hi]), (lo, hi)
    empty = native_ops.target_logprobs_native(h[:0], w, t[:0])
    assert empty.logprob.shape == (0,) and empty.greedy.shape == (0,)


@needs_avx2
def test_target_logprobs_rejects_bad_arguments():
    h, w = torch.randn(2, 8), torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        native_ops.target_logprobs_native(h, w, torch.tensor([0, 5]))
    with pytest.raises(RuntimeError, match="both float32 or both bfloat16"):
        torch.ops.icqs_native.target_logprobs(h.bfloat16(), w, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="int64"):
        native_ops.target_logprobs_native(h, w, torch.tensor([0, 1], dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size", [None, 3])
def test_decode_step_one_token_per_sequence(dtype, size):
    """A decode step: every sequence has one new token (its self part is itself alone), below a shared prefix
    and its own cached tokens; with and without a sliding window."""
    assert native_ops.load()
    own = [4, 0, 9, 2]
    p = cascade_problem([1, 1, 1, 1], shared_len=20, own_lens=own, H=6, Hkv=2, D=64, dtype=dtype, seed=9)
    window = None if size is None else cascade_window(p, 20, own, size)
    got = native_ops.cascade_attention_native(**p, window=window)
    want = cascade_attention_ref(**upcast(p), window=window)
    torch.testing.assert_close(got.float(), want.float(), **(TOL if dtype == torch.float32 else BF16_TOL))


def test_step_with_an_empty_sequence_is_not_a_decode_step():
    """As many new tokens as sequences, but one sequence has none and another two: the second token must still
    see the first (not the one-token-per-sequence shortcut)."""
    assert native_ops.load()
    p = cascade_problem([0, 2], shared_len=5, own_lens=[0, 0], H=2, Hkv=1, D=16, seed=2)
    torch.testing.assert_close(native_ops.cascade_attention_native(**p), cascade_attention_ref(**p), **TOL)
