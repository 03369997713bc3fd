"""Triton KV store: new keys/values into the paged cache through slot indices; as kv_store.store_kv_ref."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slots_ptr, row, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row
    slot = tl.load(slots_ptr + t).to(tl.int64)
    k = tl.load(k_ptr + t * row + offs, mask=mask)
    v = tl.load(v_ptr + t * row + offs, mask=mask)
    tl.store(kc_ptr + slot * row + offs, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + slot * row + offs, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor):
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the cache must be contiguous"
    T = k.shape[0]
    row = k_cache[0].numel()  # Hkv * D
    block = min(1024, triton.next_power_of_2(row))
    if T:
        _store_kv_kernel[(T, triton.cdiv(row, block))](k.contiguous(), v.contiguous(), k_cache, v_cache, slots, row,
                                                      BLOCK=block)
