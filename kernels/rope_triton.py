"""Triton rotary embedding fused with the KV-cache store; as rope.rope_store_kv_ref. One program per token reads
its row of the fused q/k/v projection once: q and k rotated (rotate-half layout) into contiguous outputs, v copied
out, k and v written into the paged cache at the token's slot. The cos/sin tables (rope.rope_cos_sin) already
carry the Llama 3 frequency scaling."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _halves(base, heads, D, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """Pointers to the first halves of `heads` rows of D values at `base` (the second halves are D // 2 further),
    their mask, and D // 2."""
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, HALF)
    half = D // 2
    mask = (offs_h < heads)[:, None] & (offs < half)[None, :]
    return base + offs_h[:, None] * D + offs[None, :], mask, half


@triton.jit
def _load_halves(base, heads, D, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    ptr, mask, half = _halves(base, heads, D, BLOCK_H, HALF)
    return tl.load(ptr, mask=mask, other=0.0), tl.load(ptr + half, mask=mask, other=0.0)


@triton.jit
def _store_halves(base, x1, x2, heads, D, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    ptr, mask, half = _halves(base, heads, D, BLOCK_H, HALF)
    tl.store(ptr, x1.to(base.dtype.element_ty), mask=mask)
    tl.store(ptr + half, x2.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rotate(x1, x2, c1, c2, s1, s2):
    """x * cos + rotate_half(x) * sin in fp32, rounded back to x's dtype."""
    y1 = x1.to(tl.float32) * c1[None, :] - x2.to(tl.float32) * s1[None, :]
    y2 = x2.to(tl.float32) * c2[None, :] + x1.to(tl.float32) * s2[None, :]
    return y1.to(x1.dtype), y2.to(x1.dtype)


@triton.jit
def _rope_store_kv_kernel(
    qkv_ptr,
    row_stride,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slots_ptr,
    H,
    Hkv,
    D,
    BLOCK_H: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    offs = tl.arange(0, HALF)
    half = D // 2
    mask = offs < half
    c1 = tl.load(cos_ptr + pos * D + offs, mask=mask, other=0.0)
    c2 = tl.load(cos_ptr + pos * D + half + offs, mask=mask, other=0.0)
    s1 = tl.load(sin_ptr + pos * D + offs, mask=mask, other=0.0)
    s2 = tl.load(sin_ptr + pos * D + half + offs, mask=mask, other=0.0)
    row = qkv_ptr + t * row_stride
    q1, q2 = _load_halves(row, H, D, BLOCK_H, HALF)
    q1, q2 = _rotate(q1, q2, c1, c2, s1, s2)
    _store_halves(q_ptr + t * H * D, q1, q2, H, D, BLOCK_H, HALF)
    k1, k2 = _load_halves(row + H * D, Hkv, D, BLOCK_HKV, HALF)
    k1, k2 = _rotate(k1, k2, c1, c2, s1, s2)
    _store_halves(k_ptr + t * Hkv * D, k1, k2, Hkv, D, BLOCK_HKV, HALF)
    _store_halves(kc_ptr + slot * Hkv * D, k1, k2, Hkv, D, BLOCK_HKV, HALF)
    v1, v2 = _load_halves(row + (H + Hkv) * D, Hkv, D, BLOCK_HKV, HALF)
    _store_halves(v_ptr + t * Hkv * D, v1, v2, Hkv, D, BLOCK_HKV, HALF)
    _store_halves(vc_ptr + slot * Hkv * D, v1, v2, Hkv, D, BLOCK_HKV, HALF)


def rope_store_kv_triton(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
):
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the cache must be contiguous"
    T = qkv.shape[0]
    D = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    if T > 1:
        assert qkv.stride(1) == 1, "qkv rows must be contiguous"
    q = torch.empty(T, num_heads, D, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(T, num_kv_heads, D, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty_like(k)
    if T:
        _rope_store_kv_kernel[(T,)](
            qkv,
            qkv.stride(0),
            positions,
            cos.contiguous(),
            sin.contiguous(),
            q,
            k,
            v,
            k_cache,
            v_cache,
            slots,
            num_heads,
            num_kv_heads,
            D,
            BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_HKV=triton.next_power_of_2(num_kv_heads),
            HALF=triton.next_power_of_2(D // 2),
        )
    return q, k, v
