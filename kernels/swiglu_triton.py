"""Triton SwiGLU: silu(gate) * up on the fused [.., 2 * intermediate] projection; as swiglu.silu_and_mul_ref."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(gu_ptr + row * 2 * inter + offs, mask=mask, other=0.0)
    up = tl.load(gu_ptr + row * 2 * inter + inter + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # rounded like F.silu's output before the product
    tl.store(out_ptr + row * inter + offs, silu * up, mask=mask)


def silu_and_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    inter = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * inter).contiguous()
    out = torch.empty(gu.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    if gu.shape[0]:
        _silu_and_mul_kernel[(gu.shape[0], triton.cdiv(inter, block))](gu, out, inter, BLOCK=block)
    return out.view(*gate_up.shape[:-1], inter)
