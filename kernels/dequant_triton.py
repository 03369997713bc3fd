"""Triton dequantisation of Q8_0 / Q4_1 blocks; same contract as dequant.dequantize_ref (layouts there)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .aot import gpu_tiles
from .dequant import BLOCK, BLOCK_BYTES


@triton.jit
def _fp16_at(ptr, mask):
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _dequant_kernel(src_ptr, out_ptr, nblocks, Q4_1: tl.constexpr, NBYTES: tl.constexpr, BLOCKS: tl.constexpr):
    offs_b = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    b_mask = offs_b < nblocks
    base = src_ptr + offs_b.to(tl.int64) * NBYTES
    d = _fp16_at(base, b_mask)
    offs_e = tl.arange(0, 32)
    mask = b_mask[:, None] & (offs_e[None, :] < 32)
    if Q4_1:
        m = _fp16_at(base + 2, b_mask)
        byte = tl.load(base[:, None] + 4 + offs_e[None, :] % 16, mask=mask, other=0)
        q = ((byte >> ((offs_e[None, :] // 16) * 4).to(tl.uint8)) & 0x0F).to(tl.float32)
        w = d[:, None] * q + m[:, None]
    else:
        q = tl.load(base[:, None] + 2 + offs_e[None, :], mask=mask, other=0).to(tl.int8, bitcast=True)
        w = d[:, None] * q.to(tl.float32)
    tl.store(out_ptr + offs_b[:, None].to(tl.int64) * 32 + offs_e[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask)


def dequantize_triton(raw: torch.Tensor, qtype: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    nbytes = BLOCK_BYTES[qtype]
    lead, row_bytes = raw.shape[:-1], raw.shape[-1]
    if row_bytes % nbytes:
        raise ValueError(f"{qtype} rows must hold whole {nbytes}-byte blocks, got {row_bytes} bytes")
    nblocks = raw.numel() // nbytes
    out = torch.empty(nblocks * BLOCK, dtype=dtype, device=raw.device)
    blocks = 64 if gpu_tiles(raw) else 16
    if nblocks:
        _dequant_kernel[(triton.cdiv(nblocks, blocks),)](raw.contiguous(), out, nblocks, Q4_1=qtype == "Q4_1",
                                                         NBYTES=nbytes, BLOCKS=blocks)
    return out.reshape(*lead, row_bytes // nbytes * BLOCK)
