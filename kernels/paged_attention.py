"""Paged prefix-prefill attention: the new tokens of many sequences attend causally to themselves and to their
cached prefix, read through a block table (GQA, variable lengths).

Sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1] of q / k_new / v_new, and prefix_lens[b] cached tokens whose
token j lives in cache slot block_table[b, j // page_size] * page_size + j % page_size. The cache is one layer,
[num_slots, Hkv, D] with slot = page * page_size + offset (page_size 1 makes the block table a slot list).
"""
from __future__ import annotations

import torch

from .attention import _attend


def prefix_slots(block_table: torch.Tensor, prefix_len: int, page_size: int) -> torch.Tensor:
    """Cache slots of the first prefix_len tokens of one sequence, from its block-table row."""
    j = torch.arange(prefix_len, device=block_table.device)
    return block_table[j // page_size].long() * page_size + j % page_size


def paged_prefill_attention_lse_ref(q, k_new, v_new, cu_seqlens, k_cache, v_cache, block_table, prefix_lens,
                                    page_size: int, scale: float):
    """q [T, H, D], k_new/v_new [T, Hkv, D], cu_seqlens [B + 1], block_table [B, P], prefix_lens [B].
    Returns (out [T, H, D] fp32, lse [T, H] fp32)."""
    T, H, D = q.shape
    out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    cu = [int(c) for c in cu_seqlens]
    for b in range(len(cu) - 1):
        lo, hi, p = cu[b], cu[b + 1], int(prefix_lens[b])
        if hi == lo:
            continue
        slots = prefix_slots(block_table[b], p, page_size)
        k = torch.cat([k_cache[slots].to(q.dtype), k_new[lo:hi]])
        v = torch.cat([v_cache[slots].to(q.dtype), v_new[lo:hi]])
        n = hi - lo
        mask = torch.arange(p + n, device=q.device)[None, :] <= p + torch.arange(n, device=q.device)[:, None]
        out[lo:hi], lse[lo:hi] = _attend(q[lo:hi], k, v, scale, mask)
    return out, lse
