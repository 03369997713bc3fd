"""Triton linear layer, batch-invariant by construction: the contract of linear.linear_ref (F.linear), one launch
for any number of rows, each output row computed from its own input row only, in an order that does not depend
on how many rows the call holds.

One program owns a [BLOCK_M x BLOCK_N] output tile: it walks the K dimension in BLOCK_K steps from 0, each step
one tl.dot accumulated in fp32, with no split of K across programs; the tile sizes depend on the dtype and the
device only. Rows past M are loaded as zeros and never stored, so a row's bits are the same alone or inside any
batch (tests/test_kernels_triton.py; on a GPU, benchmarks/gpu_check.py's `parity.deterministic_ops`).

It is a candidate for the deterministic mode's linears on a GPU (kernels/batch_invariant.linear: cuBLAS on fixed
256-row tiles, 32 calls per linear at 8,192 tokens, each call small enough at the down and output projections that
it may leave SMs idle: reasoned, not measured); the GPU check times it against cuBLAS on the whole step and against
those row tiles, at the engine's shapes, before the mode uses it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import gpu_tiles


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # output tiles in groups of GROUP_M row blocks (the weight's column blocks reused from L2); which program
    # computes a tile changes with M, how a tile is computed does not
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None]  # the weight's [BLOCK_K, BLOCK_N] transposed tile
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _tiles(x: torch.Tensor) -> tuple[int, int, int, int, int, str]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, precision) for x's dtype and device: tensor-core tiles for
    16-bit inputs on a GPU; fp32 multiplied exactly (no TF32) on smaller ones; small tiles under the CPU
    interpreter (it pays per operation)."""
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    if not gpu_tiles(x):
        return 32, 32, 32, 4, 1, prec
    if x.element_size() <= 2:
        return 128, 128, 64, 8, 4, prec
    return 64, 64, 32, 4, 2, prec


def linear_invariant_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Contract of linear.linear_ref: x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N] in x's dtype, each row's
    bits independent of the other rows of the call."""
    K, N = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M and N:
        bm, bn, bk, warps, stages, prec = _tiles(x2)
        _linear_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
            x2,
            w,
            w if bias is None else bias.contiguous(),
            y,
            M,
            N,
            K,
            x2.stride(0),
            w.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=8,
            PRECISION=prec,
            num_warps=warps,
            num_stages=stages,
        )
    return y.view(*x.shape[:-1], N)
