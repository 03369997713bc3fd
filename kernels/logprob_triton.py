"""Triton fused target log-prob; same contract as logprob.target_logprobs_ref (top_k included).

A program owns BLOCK_M rows and one slice of the vocabulary: it computes the logits of that slice tile by tile
(hidden x LM-head rows, K-looped over the model dimension), keeps an online max / sum of exp, the target's logit
and, with TOP_K > 0, a running top-k (each tile merged into it by TOP_K max-extractions, ties to the lower token
id), and writes only those numbers per row. The slices are merged on the host side of the launch (log-sum-exp,
and a stable sort of the slices' top-k). No [tokens x vocab] tensor exists at any point."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .logprob import LogProbs
from .tiles import gpu_tiles


@triton.jit
def _target_logprob_kernel(
    h_ptr,
    w_ptr,
    t_ptr,
    m_ptr,
    l_ptr,
    tgt_ptr,
    topv_ptr,
    topi_ptr,
    N,
    V,
    Dm,
    v_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
):
    split = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < N
    target = tl.load(t_ptr + offs_m, mask=m_mask, other=-1)
    offs_k = tl.arange(0, BLOCK_K)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    tgt = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    cols = tl.arange(0, KP)
    best_v = tl.full([BLOCK_M, KP], float("-inf"), dtype=tl.float32)
    best_i = tl.zeros([BLOCK_M, KP], dtype=tl.int32)
    v_lo = split * v_per_split
    v_hi = tl.minimum(V, v_lo + v_per_split)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        v_mask = offs_v < v_hi
        logits = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
        for k0 in range(0, Dm, BLOCK_K):
            k_mask = (k0 + offs_k) < Dm
            h = tl.load(
                h_ptr + offs_m[:, None].to(tl.int64) * Dm + k0 + offs_k[None, :],
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            w = tl.load(
                w_ptr + offs_v[:, None].to(tl.int64) * Dm + k0 + offs_k[None, :],
                mask=v_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            logits = tl.dot(h, tl.trans(w), acc=logits, input_precision=PRECISION)
        logits = tl.where(v_mask[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, 1))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), 1)
        m_i = m_new
        hit = offs_v[None, :] == target[:, None]
        tgt = tl.maximum(tgt, tl.max(tl.where(hit, logits, float("-inf")), 1))
        if TOP_K > 0:  # merge: take the larger head of (this tile, running best) TOP_K times
            cand = logits
            new_v = tl.full([BLOCK_M, KP], float("-inf"), dtype=tl.float32)
            new_i = tl.zeros([BLOCK_M, KP], dtype=tl.int32)
            for j in tl.static_range(TOP_K):
                m_tile = tl.max(cand, 1)
                m_best = tl.max(best_v, 1)
                tile_id = tl.min(tl.where(cand == m_tile[:, None], offs_v[None, :], 2147483647), 1)
                pos = tl.min(tl.where(best_v == m_best[:, None], cols[None, :], KP), 1)
                best_id = tl.sum(tl.where(cols[None, :] == pos[:, None], best_i, 0), 1)
                take = m_tile > m_best  # on a tie the running best holds the lower token id
                at_j = cols[None, :] == j
                new_v = tl.where(at_j, tl.where(take, m_tile, m_best)[:, None], new_v)
                new_i = tl.where(at_j, tl.where(take, tile_id, best_id)[:, None], new_i)
                cand = tl.where(take[:, None] & (offs_v[None, :] == tile_id[:, None]), float("-inf"), cand)
                best_v = tl.where((take == 0)[:, None] & (cols[None, :] == pos[:, None]), float("-inf"), best_v)
            best_v, best_i = new_v, new_i
    out = split * N + offs_m
    tl.store(m_ptr + out, m_i, mask=m_mask)
    tl.store(l_ptr + out, l_i, mask=m_mask)
    tl.store(tgt_ptr + out, tgt, mask=m_mask)
    if TOP_K > 0:
        top = out[:, None].to(tl.int64) * KP + cols[None, :]
        tl.store(topv_ptr + top, best_v, mask=m_mask[:, None])
        tl.store(topi_ptr + top, best_i, mask=m_mask[:, None])


def target_logprobs_triton(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, top_k: int = 0, splits: int | None = None
) -> LogProbs:
    """splits: vocabulary slices run in parallel (default: enough programs to fill a GPU, 1 elsewhere)."""
    N, Dm = hidden.shape
    V = weight.shape[0]
    k = min(top_k, V)
    if gpu_tiles(hidden):
        bm, bv, bk = 64, 128, 64
    else:  # the interpreter pays per operation, not per element: few, large tiles (still several on small shapes)
        bm = 16
        bv = min(2048, max(16, triton.next_power_of_2(V) // 8))
        bk = min(256, max(16, triton.next_power_of_2(Dm) // 2))
    row_blocks = triton.cdiv(N, bm)
    if splits is None:
        splits = min(triton.cdiv(V, bv), triton.cdiv(512, row_blocks)) if gpu_tiles(hidden) else 1
    v_per_split = triton.cdiv(triton.cdiv(V, splits), bv) * bv
    splits = triton.cdiv(V, v_per_split)
    kp = max(2, triton.next_power_of_2(k)) if k else 1
    m = torch.empty(splits, N, dtype=torch.float32, device=hidden.device)
    l, tgt = torch.empty_like(m), torch.empty_like(m)
    top_v = torch.empty(splits, N, kp, dtype=torch.float32, device=hidden.device)
    top_i = torch.empty(splits, N, kp, dtype=torch.int32, device=hidden.device)
    if N:
        prec = "ieee" if hidden.dtype == torch.float32 else "tf32"
        _target_logprob_kernel[(row_blocks, splits)](
            hidden.contiguous(),
            weight.contiguous(),
            targets.contiguous(),
            m,
            l,
            tgt,
            top_v,
            top_i,
            N,
            V,
            Dm,
            v_per_split,
            BLOCK_M=bm,
            BLOCK_V=bv,
            BLOCK_K=bk,
            PRECISION=prec,
            TOP_K=k,
            KP=kp,
        )
    run_max = m.max(0).values
    log_sum = torch.log((l * torch.exp(m - run_max)).sum(0))
    target_logit = tgt.max(0).values
    logprob, greedy = target_logit - run_max - log_sum, target_logit >= run_max
    if top_k <= 0:
        return LogProbs(logprob, greedy)
    # slices in vocabulary order, each sorted best first: a stable sort keeps the lower token id on ties
    vals = top_v[:, :, :k].permute(1, 0, 2).reshape(N, splits * k)
    ids = top_i[:, :, :k].permute(1, 0, 2).reshape(N, splits * k).long()
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices[:, :k]
    best = vals.gather(1, order)
    return LogProbs(logprob, greedy, ids.gather(1, order), best - run_max[:, None] - log_sum[:, None])
