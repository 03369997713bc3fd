"""RMSNorm, optionally fused with the residual add that precedes it in every Llama block."""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Returns (normed, new_residual). With `residual`, x + residual is normalised and also returned as the new
    residual stream; without it, x itself is the residual. Statistics in fp32, as HF Llama does."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), x
