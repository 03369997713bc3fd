"""Writes new keys and values into the paged KV cache through slot indices (slot = page * page_size + offset)."""

from __future__ import annotations

import torch


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor):
    """k, v: [T, Hkv, D]; k_cache, v_cache: [num_slots, Hkv, D] (one layer, pages flattened); slots: [T] int64."""
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))
