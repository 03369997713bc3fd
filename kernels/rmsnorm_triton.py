"""Triton RMSNorm fused with the residual add; same contract as rmsnorm.rms_norm_ref."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0)
    if HAS_RES:
        x = x + tl.load(res_ptr + row * n + offs, mask=mask, other=0.0)  # rounded to x's dtype, as the reference
        tl.store(res_out_ptr + row * n + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    normed = (xf * rstd).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * n + offs, w * normed, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if residual is not None:
        res = residual.reshape(-1, n).contiguous()
        res_out = torch.empty_like(x2)
    else:
        res, res_out = x2, x2
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, res, weight, out, res_out, n, eps, HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n)
        )
    new_res = res_out.view(x.shape) if residual is not None else x
    return out.view(x.shape), new_res
