"""Triton rotary embedding, in place on q and k (rotate-half layout); as rope.apply_rope_ref. The cos/sin
tables (rope.rope_cos_sin) already carry the Llama 3 frequency scaling."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(base, heads, D, c1, c2, s1, s2, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """Rotates `heads` rows of D values at `base` (one token's q or k) in place."""
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, HALF)
    half = D // 2
    mask = (offs_h < heads)[:, None] & (offs < half)[None, :]
    ptr = base + offs_h[:, None] * D + offs[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0)
    x2 = tl.load(ptr + half, mask=mask, other=0.0)
    y1 = x1.to(tl.float32) * c1[None, :] - x2.to(tl.float32) * s1[None, :]
    y2 = x2.to(tl.float32) * c2[None, :] + x1.to(tl.float32) * s2[None, :]
    tl.store(ptr, y1.to(x1.dtype), mask=mask)
    tl.store(ptr + half, y2.to(x1.dtype), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, H, Hkv, D, BLOCK_H: tl.constexpr,
                 BLOCK_HKV: tl.constexpr, HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs = tl.arange(0, HALF)
    half = D // 2
    mask = offs < half
    c1 = tl.load(cos_ptr + pos * D + offs, mask=mask, other=0.0)
    c2 = tl.load(cos_ptr + pos * D + half + offs, mask=mask, other=0.0)
    s1 = tl.load(sin_ptr + pos * D + offs, mask=mask, other=0.0)
    s2 = tl.load(sin_ptr + pos * D + half + offs, mask=mask, other=0.0)
    _rotate_heads(q_ptr + t * H * D, H, D, c1, c2, s1, s2, BLOCK_H, HALF)
    _rotate_heads(k_ptr + t * Hkv * D, Hkv, D, c1, c2, s1, s2, BLOCK_HKV, HALF)


def apply_rope_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor):
    assert q.is_contiguous() and k.is_contiguous(), "rope works in place on contiguous q and k"
    T, H, D = q.shape
    if T:
        _rope_kernel[(T,)](q, k, positions, cos.contiguous(), sin.contiguous(), H, k.shape[1], D,
                           BLOCK_H=triton.next_power_of_2(H), BLOCK_HKV=triton.next_power_of_2(k.shape[1]),
                           HALF=triton.next_power_of_2(D // 2))
