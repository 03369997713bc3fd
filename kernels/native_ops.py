"""The native CPU ops (kernels/native/*.cpp, built by CMakeLists.txt into kernels/native/libicqs_native.so) as
Python functions with the signatures of their torch references: the cascade attention, its varlen causal self part
and its segments read from the KV cache in place (attention.cpp); RMSNorm, RoPE with the KV-cache store, SwiGLU
and greedy decoding's argmax (pointwise.cpp); fp32 and bf16 linear layers on packed weight panels, and the LM head
fused with the log-softmax of each row's target (linear.cpp). `load()` is False when the library is absent."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from .attention import AttentionPlan, fold_short_segments, segment_starts, segment_waves
from .logprob import LogProbs

log = logging.getLogger(__name__)
LIB_DIR = Path(__file__).parent / "native"


# every op this module calls: a library built from older sources lacks some (a renamed op)
OPS = (
    "varlen_causal_attention",
    "segment_attention_merge_",
    "segments_attention_merge_",
    "rms_norm",
    "rope_store_kv",
    "silu_and_mul",
    "greedy_logprobs",
    "linear_panels",
    "target_logprobs",
    "simd",
)


@functools.cache
def load() -> bool:
    """Loads the library once (the newest build: cmake's libicqs_native.so or setuptools'
    libicqs_native.<abi>.so); True when every op in OPS is registered."""
    libs = sorted(LIB_DIR.glob("libicqs_native*.so"), key=lambda p: p.stat().st_mtime)
    if not libs:
        return False
    try:
        torch.ops.load_library(str(libs[-1]))
    except OSError as e:
        log.warning("native CPU ops present but not loadable (%s): using the torch references", e)
        return False
    missing = [op for op in OPS if not hasattr(_ops(), op)]
    if missing:
        log.warning(
            "native CPU ops in %s were built from older sources (no %s): using the torch references; "
            "rebuild them (pip install -e . or cmake, CMakeLists.txt)",
            libs[-1],
            ", ".join(missing),
        )
        return False
    return True


def _ops():
    return torch.ops.icqs_native


@functools.cache
def simd() -> str:
    """The vector instruction set the library was built for ("avx512bf16", "avx512", "avx2", "none"; "" when it
    is absent)."""
    return _ops().simd() if load() else ""


def varlen_causal_attention_native(q, k, v, cu_seqlens, scale: float, window: int = 0, plan=None):
    """Contract of attention.varlen_causal_attention_ref (the cascade's self part). Returns (out fp32, lse fp32).
    With the step's AttentionPlan, cu_seqlens' tensor is built once per step."""

    def index():
        return torch.as_tensor(cu_seqlens, dtype=torch.long)

    cu = index() if plan is None else plan.derived("native self part", index)
    return _ops().varlen_causal_attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, float(scale), int(window))


def segment_attention_merge_native(q, rows, k_cache, v_cache, slots, scale, out, lse, limits=None, starts=None):
    """Contract of attention.segment_attention_merge_ref (q contiguous; out, lse fp32, updated in place)."""
    if rows.numel() and slots.numel():
        _ops().segment_attention_merge_(q, rows, k_cache, v_cache, slots, float(scale), out, lse, limits, starts)


def cascade_attention_native(q, k_new, v_new, k_cache, v_cache, plan: AttentionPlan, scale, window=None):
    """Same contract as attention.cascade_attention_ref; segment K/V are read from the cache in place, the
    segments of a wave (segment_waves) in one parallel call, the waves built once per step. `window`
    (attention.AttentionWindow): keys at window.size or more positions before the query are masked, by absolute
    position."""
    q = q.contiguous()
    out, lse = varlen_causal_attention_native(
        q, k_new, v_new, plan.cu_seqlens, scale, 0 if window is None else window.size, plan
    )

    def waves():
        segs = fold_short_segments(plan.segments)
        return segment_waves(segs if window is None else segment_starts(segs, window, plan))

    # a model with local and global layers (Gemma-3) keeps the waves of both kinds for the step
    name = "native waves" if window is None else "native windowed waves"
    for w in plan.derived(name, waves, window):
        _ops().segments_attention_merge_(
            q, w.rows, w.row_offsets, k_cache, v_cache, w.slots, w.slot_offsets, float(scale), out, lse, w.starts
        )
    return out.to(q.dtype)


def linear_panels_native(x, panels, n: int, bias=None):
    """F.linear(x [M, K], W, bias) for W [n, K] packed as kernels.linear.Panels (`panels` its tensor), x, W and
    the bias all fp32 or all bf16 (summed in fp32, rounded to bf16 once)."""
    return _ops().linear_panels(x, panels, int(n), bias)


def target_logprobs_native_runs(hidden, weight, top_k: int = 0) -> bool:
    """Whether target_logprobs_native runs the native op for these arguments (else the torch reference)."""
    return top_k == 0 and hidden.dtype in (torch.float32, torch.bfloat16) and weight.dtype == hidden.dtype


def target_logprobs_native(hidden, weight, targets, top_k: int = 0) -> LogProbs:
    """Contract of logprob.target_logprobs_ref: the LM head fused with the log-softmax of each row's target
    (linear.cpp), fp32 logits summed in a fixed order per row, so a row's result does not depend on the other
    rows or the thread count. The top k and dtypes other than fp32 and bf16 go to the reference."""
    if not target_logprobs_native_runs(hidden, weight, top_k):
        from .logprob import target_logprobs_ref

        return target_logprobs_ref(hidden, weight, targets, top_k)
    return LogProbs(*_ops().target_logprobs(hidden, weight, targets))


def rms_norm_native(x, weight, eps, residual=None):
    """Contract of rmsnorm.rms_norm_ref, for a weight in x's dtype (the engine's case; the op has no other)."""
    if weight.dtype != x.dtype:
        raise TypeError(f"rms_norm_native: weight {weight.dtype} and x {x.dtype} differ (use rms_norm_ref)")
    x = x.contiguous()
    out, new_res = _ops().rms_norm(
        x, weight.contiguous(), float(eps), None if residual is None else residual.contiguous()
    )
    return out, (x if residual is None else new_res)


def rope_store_kv_native(qkv, positions, cos, sin, k_cache, v_cache, slots, num_heads: int, num_kv_heads: int):
    """Contract of rope.rope_store_kv_ref, in one pass over each token's row (the cache in qkv's dtype)."""
    return _ops().rope_store_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, num_heads, num_kv_heads)


def silu_and_mul_native(gate_up):
    """Contract of swiglu.silu_and_mul_ref."""
    return _ops().silu_and_mul(gate_up.contiguous())


def greedy_logprobs_native(logits):
    """Contract of logprob.greedy_logprobs_ref (two reads of each row, no log-softmax written out)."""
    return _ops().greedy_logprobs(logits.contiguous())
