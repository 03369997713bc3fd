"""Dequantisation of GGUF (ggml) Q8_0 and Q4_1 blocks (reference for dequant_triton.py, both checked against the
gguf package). Not on the engine's path: engine/gguf_loader.py dequantizes every weight once at load with gguf.

Block layouts (32 weights each, little-endian):
  Q8_0: fp16 d, 32 x int8 q               -> w = d * q                         (34 bytes)
  Q4_1: fp16 d, fp16 m, 16 bytes of nibbles -> w[j] = d * nib[j] + m; the low nibbles of the 16 bytes are
        weights 0..15, the high nibbles weights 16..31                          (20 bytes)
"""
from __future__ import annotations

import torch

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20}


def _halves(raw: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 stored at byte `at` of every block of raw [nblocks, bytes], as fp32 [nblocks, 1]."""
    return raw[:, at:at + 2].contiguous().view(torch.float16).float()


def dequantize_ref(raw: torch.Tensor, qtype: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """raw: uint8 [..., row_bytes] of whole blocks (as gguf stores a quantised tensor) -> [..., row_weights]."""
    nbytes = BLOCK_BYTES[qtype]
    lead, row_bytes = raw.shape[:-1], raw.shape[-1]
    if row_bytes % nbytes:
        raise ValueError(f"{qtype} rows must hold whole {nbytes}-byte blocks, got {row_bytes} bytes")
    blocks = raw.reshape(-1, nbytes)
    d = _halves(blocks, 0)
    if qtype == "Q8_0":
        w = d * blocks[:, 2:].contiguous().view(torch.int8).float()
    else:
        qs = blocks[:, 4:]
        nib = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()
        w = d * nib + _halves(blocks, 2)
    return w.to(dtype).reshape(*lead, row_bytes // nbytes * BLOCK)
