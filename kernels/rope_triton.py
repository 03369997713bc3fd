"""Triton rotary embedding, in place on q and k (rotate-half layout); as rope.apply_rope_ref. The cos/sin
tables (rope.rope_cos_sin) already carry the Llama 3 frequency scaling."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, H, Hkv, D, HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs = tl.arange(0, HALF)
    half = D // 2
    mask = offs < half
    c1 = tl.load(cos_ptr + pos * D + offs, mask=mask, other=0.0)
    c2 = tl.load(cos_ptr + pos * D + half + offs, mask=mask, other=0.0)
    s1 = tl.load(sin_ptr + pos * D + offs, mask=mask, other=0.0)
    s2 = tl.load(sin_ptr + pos * D + half + offs, mask=mask, other=0.0)
    if h < H:
        base = q_ptr + (t * H + h) * D
    else:
        base = k_ptr + (t * Hkv + (h - H)) * D
    x1 = tl.load(base + offs, mask=mask, other=0.0)
    x2 = tl.load(base + half + offs, mask=mask, other=0.0)
    y1 = x1.to(tl.float32) * c1 - x2.to(tl.float32) * s1
    y2 = x2.to(tl.float32) * c2 + x1.to(tl.float32) * s2
    tl.store(base + offs, y1.to(x1.dtype), mask=mask)
    tl.store(base + half + offs, y2.to(x1.dtype), mask=mask)


def apply_rope_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor):
    assert q.is_contiguous() and k.is_contiguous(), "rope works in place on contiguous q and k"
    T, H, D = q.shape
    if T:
        _rope_kernel[(T, H + k.shape[1])](q, k, positions, cos.contiguous(), sin.contiguous(), H, k.shape[1], D,
                                         HALF=triton.next_power_of_2(D // 2))
