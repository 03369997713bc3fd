"""Rotary position embeddings (rotate-half layout, as HF Llama/Qwen2), with Llama 3 frequency scaling, and the
op the model calls: a layer's attention inputs from its fused q/k/v projection, rotated and stored in the KV cache
(`rope_store_kv_ref`)."""

from __future__ import annotations

import math

import torch

from .kv_store import store_kv_ref


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling {kind!r}")
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(head_dim: int, theta: float, scaling: dict | None, max_position: int, device=None):
    """fp32 tables [max_position, head_dim] of cos and sin, duplicated over the two halves."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
    freqs = torch.outer(torch.arange(max_position, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def apply_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """In place on q [T, H, D] and k [T, Hkv, D]; positions [T] index the fp32 cos/sin tables."""
    c = cos[positions].to(q.dtype).unsqueeze(1)
    s = sin[positions].to(q.dtype).unsqueeze(1)
    q.copy_(_rotate(q, c, s))
    k.copy_(_rotate(k, c, s))


def rope_store_kv_ref(
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
    """A layer's attention inputs from its fused projection qkv [T, (H + 2 Hkv) * D]: q and k rotated
    (apply_rope_ref), k and v written into the cache at `slots` (store_kv_ref). Returns contiguous q [T, H, D],
    k and v [T, Hkv, D]; qkv is not modified."""
    T, H, Hkv = qkv.shape[0], num_heads, num_kv_heads
    D = qkv.shape[1] // (H + 2 * Hkv)
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=1)  # column slices, copied below: qkv stays as it is
    dense = torch.contiguous_format
    q = q.reshape(T, H, D).clone(memory_format=dense)
    k, v = k.reshape(T, Hkv, D).clone(memory_format=dense), v.reshape(T, Hkv, D).clone(memory_format=dense)
    apply_rope_ref(q, k, positions, cos, sin)
    store_kv_ref(k, v, k_cache, v_cache, slots)
    return q, k, v
