"""Optional CUDA path for the cascade's self part (contiguous varlen causal prefill) through flash-attn 2
(`pip install .[cuda]`). The engine runs without it: attention_triton uses its own kernel when it is absent."""

from __future__ import annotations

import functools

import torch

from .host import to_device


@functools.cache
def available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def varlen_causal_attention_flash(q, k, v, cu_seqlens: list[int], scale: float):
    """Contract of attention.varlen_causal_attention_ref: q [T, H, D], k/v [T, Hkv, D] (fp16/bf16, CUDA) ->
    (out fp32 [T, H, D], lse fp32 [T, H])."""
    from flash_attn import flash_attn_varlen_func

    cu = to_device(torch.tensor(cu_seqlens, dtype=torch.int32), q.device)  # no wait for the queued work
    longest = max(b - a for a, b in zip(cu_seqlens, cu_seqlens[1:]))
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cu, cu, longest, longest, softmax_scale=scale, causal=True, return_attn_probs=True
    )
    if lse.shape != (q.shape[1], q.shape[0]):
        raise RuntimeError(f"flash-attn returned softmax_lse of shape {tuple(lse.shape)}; flash-attn>=2.5 is needed")
    return out.float().contiguous(), lse.t().float().contiguous()
