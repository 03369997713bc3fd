"""Triton attention over the paged KV cache in the cascade form: the new tokens' causal self part (varlen) and
the cached segments merged into it (see attention.py for the contracts and the torch references).

Both kernels are flash-attention loops: one program owns the query rows of a few tokens times the G query heads
of one KV head (GQA: K/V tiles are loaded once for the group), walks its keys in tiles of BLOCK_N with an online
softmax in fp32 (log2 domain). The segment kernel reads K/V rows straight from the cache through slot indices
and starts its online softmax from the running (out, lse) of its rows, which is exactly the log-sum-exp merge of
the cascade. A step's segments are merged in waves (attention.segment_waves: segments that share no query row),
one launch a wave, each program taking one work item (a block of one segment's rows and that segment's slots) from
a table built once per step: a decode step of 64 sequences is one or two launches a layer, not one per segment.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from . import flash_attention
from .attention import AttentionPlan, Segment, Wave, fold_short_segments, segment_starts, segment_waves
from .host import to_device
from .tiles import gpu_tiles

LOG2E = 1.4426950408889634


@triton.jit
def _online_update(q, k, v, valid, acc, m_i, l_i, qk_scale, PRECISION: tl.constexpr):
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet stay empty
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _varlen_causal_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    cu_ptr,
    blk_seq_ptr,
    blk_start_ptr,
    qk_scale,
    H,
    Hkv,
    D,
    window,
    G: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # one program: BLOCK_R // G tokens x the G query heads of KV head kh, stacked as BLOCK_R query rows
    pid = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.load(blk_seq_ptr + pid).to(tl.int64)
    start = tl.load(blk_start_ptr + pid)
    lo = tl.load(cu_ptr + b).to(tl.int64)
    n = tl.load(cu_ptr + b + 1) - lo
    offs_r = tl.arange(0, BLOCK_R)
    tok = start + offs_r // G  # token index within the sequence
    head = kh * G + offs_r % G
    r_mask = (offs_r < (BLOCK_R // G) * G) & (tok < n)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q_off = ((lo + tok)[:, None] * H + head[:, None]) * D + offs_d[None, :]
    q_mask = r_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    # a sliding window (window > 0): the query at token tok sees keys at tokens > tok - window
    first = tl.where(window > 0, tok - window + 1, 0)
    for j0 in range(0, tl.minimum(start + BLOCK_R // G, n), BLOCK_N):  # the sequence's own tokens, causal
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < n
        kv_off = ((lo + offs_n)[:, None] * Hkv + kh) * D + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        valid = n_mask[None, :] & (offs_n[None, :] <= tok[:, None]) & (offs_n[None, :] >= first[:, None])
        acc, m_i, l_i = _online_update(q, k, v, valid, acc, m_i, l_i, qk_scale, PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(out_ptr + q_off, acc / l_safe[:, None], mask=q_mask)
    tl.store(lse_ptr + (lo + tok) * H + head, (m_i + tl.log2(l_safe)) / 1.4426950408889634, mask=r_mask)


@triton.jit
def _segment_merge_kernel(
    q_ptr,
    rows_ptr,
    kc_ptr,
    vc_ptr,
    slots_ptr,
    out_ptr,
    lse_ptr,
    lim_ptr,
    start_ptr,
    items_ptr,
    qk_scale,
    H,
    Hkv,
    D,
    G: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_LIMITS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
):
    # one program: one work item (up to BLOCK_R // G rows of one segment: rows[row_off : row_off + n_rows] over
    # slots[slot_off : slot_off + S]) x the G query heads of KV head kh. The counts are read from the item, not
    # passed as arguments: one compiled kernel serves every segment and wave whatever its size.
    kh = tl.program_id(1)
    item = items_ptr + tl.program_id(0).to(tl.int64) * 4
    row_off = tl.load(item)
    n_rows = tl.load(item + 1)
    slot_off = tl.load(item + 2)
    S = tl.load(item + 3)
    offs_r = tl.arange(0, BLOCK_R)
    i = offs_r // G
    head = kh * G + offs_r % G
    r_mask = (offs_r < (BLOCK_R // G) * G) & (i < n_rows)
    rows = tl.load(rows_ptr + row_off + i, mask=r_mask, other=0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q_off = (rows[:, None] * H + head[:, None]) * D + offs_d[None, :]
    q_mask = r_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    # the running state of these rows: m = lse (log2 domain), l = 1, acc = out
    acc = tl.load(out_ptr + q_off, mask=q_mask, other=0.0)
    m_i = tl.load(lse_ptr + rows * H + head, mask=r_mask, other=float("-inf")) * 1.4426950408889634
    l_i = tl.where(r_mask, 1.0, 0.0)
    if HAS_LIMITS:  # the last slot index each row sees; the keys after it are masked (exact zeros)
        limit = tl.load(lim_ptr + row_off + i, mask=r_mask, other=-1)
    else:
        limit = tl.zeros([BLOCK_R], dtype=tl.int64) + (S - 1)
    if HAS_STARTS:  # the first slot index each row sees (a sliding window); the keys before it are masked
        first = tl.load(start_ptr + row_off + i, mask=r_mask, other=0)
    else:
        first = tl.zeros([BLOCK_R], dtype=tl.int64)
    for j0 in range(0, S, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < S
        slot = tl.load(slots_ptr + slot_off + offs_n, mask=n_mask, other=0).to(tl.int64)
        kv_off = (slot[:, None] * Hkv + kh) * D + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(kc_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + kv_off, mask=kv_mask, other=0.0)
        valid = n_mask[None, :] & (offs_n[None, :] <= limit[:, None]) & (offs_n[None, :] >= first[:, None])
        acc, m_i, l_i = _online_update(q, k, v, valid, acc, m_i, l_i, qk_scale, PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(out_ptr + q_off, acc / l_safe[:, None], mask=q_mask)
    tl.store(lse_ptr + rows * H + head, (m_i + tl.log2(l_safe)) / 1.4426950408889634, mask=r_mask)


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    part_lse_ptr,
    qk_scale,
    table_stride,
    H,
    Hkv,
    D,
    window,
    splits,
    G: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    PARTIAL: tl.constexpr,
):
    # one program: the G query heads of KV head kh of sequence b's one new token, over part s of its slots
    # table[b, lo:n] (parts of whole key tiles; `splits` parts a row, 1: the whole context). n is read from memory,
    # so a captured graph replays it for any context length. PARTIAL: the part's (out, lse) go to
    # out[b, s] / part_lse[b, s] for _paged_decode_combine_kernel; else the output itself
    b = tl.program_id(0).to(tl.int64)
    kh = tl.program_id(1)
    s = tl.program_id(2)
    n = tl.load(lens_ptr + b).to(tl.int64)
    lo = tl.where(window > 0, tl.maximum(n - window, 0), 0)
    per = tl.cdiv(tl.cdiv(n - lo, splits), BLOCK_N) * BLOCK_N
    j_lo = lo + s * per
    j_hi = tl.minimum(j_lo + per, n)
    offs_r = tl.arange(0, BLOCK_R)
    head = kh * G + offs_r
    r_mask = offs_r < G
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q_off = (b * H + head[:, None]) * D + offs_d[None, :]
    q_mask = r_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    for j0 in range(j_lo, j_hi, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < j_hi
        slot = tl.load(table_ptr + b * table_stride + offs_n, mask=n_mask, other=0).to(tl.int64)
        kv_off = (slot[:, None] * Hkv + kh) * D + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(kc_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + kv_off, mask=kv_mask, other=0.0)
        valid = r_mask[:, None] & n_mask[None, :]
        acc, m_i, l_i = _online_update(q, k, v, valid, acc, m_i, l_i, qk_scale, PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    if PARTIAL:  # fp32 parts [B, splits, H, D] and their lse [B, splits, H] (log2 domain; -inf: no key)
        part = (b * splits + s) * H + head
        tl.store(out_ptr + part[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=q_mask)
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_safe), mask=r_mask)
    else:
        tl.store(out_ptr + q_off, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _paged_decode_combine_kernel(
    part_ptr, part_lse_ptr, out_ptr, splits, H, D, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr
):
    # one program: one query head of one sequence, its `splits` parts merged by log-sum-exp (a row whose parts saw
    # no key, a padding row, gives zeros)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    s_mask = offs_s < splits
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    part = (b * splits + offs_s) * H + h
    lse = tl.load(part_lse_ptr + part, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    o = tl.load(part_ptr + part[:, None] * D + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + (b * H + h) * D + offs_d, res.to(out_ptr.dtype.element_ty), mask=d_mask)


def _blocks(q: torch.Tensor, group: int):
    """(BLOCK_R, BLOCK_N, BLOCK_D, precision, num_warps): small tiles under the CPU interpreter, flash-sized ones
    on a GPU; BLOCK_R holds at least one token's group of heads. fp32 inputs are multiplied exactly (no TF32), on
    key tiles of 32: with 64, head_dim 128 needs 224 KiB of shared memory, over an A100's 163 (tests/
    test_kernels_aot.py). Beyond head_dim 128 (Gemma-3's 256) the row and key tiles are halved to stay within
    sm_80's and sm_90's shared memory."""
    bd = max(16, triton.next_power_of_2(q.shape[-1]))
    br, bn, warps = (128, 64 if q.element_size() <= 2 else 32, 8) if gpu_tiles(q) else (16, 16, 4)
    if gpu_tiles(q) and bd > 128:
        br, bn = br // 2, bn // 2
    return max(br, triton.next_power_of_2(group)), bn, bd, "ieee" if q.dtype == torch.float32 else "tf32", warps


SPLIT_MIN_KEYS = 256  # keys a part of a split decode row holds at least (four key tiles of the GPU's)
SPLIT_MAX = 64


@functools.lru_cache(maxsize=16)
def _multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (1 for the interpreter's CPU tensors and the AOT's meta ones: no
    split unless asked)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def decode_splits(rows: int, kv_heads: int, width: int, multiprocessors: int) -> int:
    """Parts to cut each row's keys into (flash-decoding): one program per row and KV head leaves most of the
    chip idle when few sequences decode over long contexts (one sequence of Llama-3-8B: 8 programs on an H100's
    132 multiprocessors). Enough parts for two programs per multiprocessor, a power of 2, each part at least
    SPLIT_MIN_KEYS of the table's `width` slots; 1 where rows x KV heads fill the chip already. It depends on
    shapes only (a captured graph's grid is fixed; each part's keys follow the row's length at replay)."""
    programs = rows * kv_heads
    if programs >= multiprocessors:
        return 1
    want = -(-2 * multiprocessors // programs)
    most = max(1, min(SPLIT_MAX, width // SPLIT_MIN_KEYS))
    return 1 << (min(want, most).bit_length() - 1)


def paged_decode_attention_triton(q, k_cache, v_cache, table, lens, scale, window: int = 0):
    """Contract of attention.paged_decode_attention_ref: (sequences x KV heads x parts) programs, each over a part
    of its row's keys (decode_splits: parts only where too few sequences fill the device; then one more launch
    merges the parts), whose arguments are all device tensors or fixed numbers, so the launches can be captured
    in a CUDA graph and replayed with new tables and lengths (engine/decode_graphs.py)."""
    splits = decode_splits(q.shape[0], k_cache.shape[1], table.shape[1], _multiprocessors(q.device))
    return paged_decode_attention_split(q, k_cache, v_cache, table, lens, scale, window, splits)


def paged_decode_attention_unsplit(q, k_cache, v_cache, table, lens, scale, window: int = 0):
    """paged_decode_attention_triton with one program per row and KV head over all of its keys, whatever the
    shape (the benchmarks' comparison for the split)."""
    return paged_decode_attention_split(q, k_cache, v_cache, table, lens, scale, window, 1)


def paged_decode_attention_split(q, k_cache, v_cache, table, lens, scale, window: int, splits: int):
    """paged_decode_attention_triton with each row's keys cut into `splits` parts (a power of 2)."""
    B, H, D = q.shape
    Hkv = k_cache.shape[1]
    group = H // Hkv
    _, bn, bd, prec, _ = _blocks(q, group)
    out = torch.empty_like(q)
    if not B:
        return out
    parts = lse = out
    if splits > 1:
        parts = torch.empty(B, splits, H, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, splits, H, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(B, Hkv, splits)](
        q.contiguous(),
        k_cache,
        v_cache,
        table,
        lens,
        parts,
        lse,
        scale * LOG2E,
        table.stride(0),
        H,
        Hkv,
        D,
        int(window),
        splits,
        G=group,
        BLOCK_R=max(16, triton.next_power_of_2(group)),
        BLOCK_N=bn,
        BLOCK_D=bd,
        PRECISION=prec,
        PARTIAL=splits > 1,
        num_warps=4,
    )
    if splits > 1:
        _paged_decode_combine_kernel[(B, H)](
            parts, lse, out, splits, H, D, BLOCK_S=max(2, splits), BLOCK_D=bd, num_warps=4
        )
    return out


def _self_blocks(cu_seqlens, tokens: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The varlen kernel's index tensors: cu_seqlens, and per program its sequence and first token (blocks of
    `tokens`), built with numpy and copied to the device once."""
    cu = np.asarray([int(c) for c in cu_seqlens], dtype=np.int64)
    blocks = -(-np.diff(cu) // tokens)
    seq = np.repeat(np.arange(len(blocks), dtype=np.int32), blocks)
    start = ((np.arange(int(blocks.sum())) - np.repeat(np.cumsum(blocks) - blocks, blocks)) * tokens).astype(np.int32)
    return tuple(to_device(torch.from_numpy(x), device) for x in (cu, seq, start))


def varlen_causal_attention_triton(q, k, v, cu_seqlens, scale: float, window: int = 0, plan=None):
    """Contract of attention.varlen_causal_attention_ref: (out fp32 [T, H, D], lse fp32 [T, H]).
    window > 0: keys `window` or more rows before the query (in its sequence) are masked. With the step's
    AttentionPlan, the index tensors are built once per step, not once per layer."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    br, bn, bd, prec, warps = _blocks(q, H // Hkv)
    tokens = br // (H // Hkv)

    def index():
        return _self_blocks(cu_seqlens, tokens, q.device)

    cu_t, seq, start = index() if plan is None else plan.derived(f"triton self blocks of {tokens}", index)
    dev = q.device
    out = torch.empty(T, H, D, dtype=torch.float32, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    if seq.numel():
        _varlen_causal_kernel[(seq.numel(), Hkv)](
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            out,
            lse,
            cu_t,
            seq,
            start,
            scale * LOG2E,
            H,
            Hkv,
            D,
            int(window),
            G=H // Hkv,
            BLOCK_R=br,
            BLOCK_N=bn,
            BLOCK_D=bd,
            PRECISION=prec,
            num_warps=warps,
        )
    return out, lse


def _work_items(row_counts, slot_counts, tokens: int, device) -> torch.Tensor:
    """The merge kernel's work items [n, 4] int64 (row offset, rows, slot offset, slots): each segment's rows cut
    into blocks of `tokens`, segment i being row_counts[i] rows from the running row offset over slot_counts[i]
    slots from the running slot offset. Built on the host in a few array ops, copied to the device once."""
    rc = np.asarray(row_counts, dtype=np.int64)
    sc = np.asarray(slot_counts, dtype=np.int64)
    blocks = -(-rc // tokens)
    seg = np.repeat(np.arange(len(rc)), blocks)
    first_block = np.cumsum(blocks) - blocks
    k = np.arange(int(blocks.sum()), dtype=np.int64) - first_block[seg]  # block index within its segment
    row_base = np.cumsum(rc) - rc
    slot_base = np.cumsum(sc) - sc
    items = np.stack(
        [row_base[seg] + k * tokens, np.minimum(tokens, rc[seg] - k * tokens), slot_base[seg], sc[seg]], axis=1
    )
    return to_device(torch.from_numpy(np.ascontiguousarray(items)), device)


def _merge(q, rows, k_cache, v_cache, slots, items, scale, out, lse, limits=None, starts=None):
    """One launch of the merge kernel over `items` (_work_items): rows, slots, limits and starts are the packed
    arrays the items index."""
    if items.shape[0] == 0:
        return
    H, Hkv, D = q.shape[1], k_cache.shape[1], q.shape[2]
    br, bn, bd, prec, warps = _blocks(q, H // Hkv)
    _segment_merge_kernel[(items.shape[0], Hkv)](
        q,
        rows,
        k_cache,
        v_cache,
        slots,
        out,
        lse,
        rows if limits is None else limits,
        rows if starts is None else starts,
        items,
        scale * LOG2E,
        H,
        Hkv,
        D,
        G=H // Hkv,
        BLOCK_R=br,
        BLOCK_N=bn,
        BLOCK_D=bd,
        PRECISION=prec,
        HAS_LIMITS=limits is not None,
        HAS_STARTS=starts is not None,
        num_warps=warps,
    )


@functools.lru_cache(maxsize=512)
def _one_segment_items(rows: int, slots: int, tokens: int, device) -> torch.Tensor:
    """The work items of one segment, kept by shape: the deterministic mode merges the same chunks at every layer
    of a step, so only the first layer copies them to the device."""
    return _work_items([rows], [slots], tokens, device)


def segment_attention_merge_triton(q, rows, k_cache, v_cache, slots, scale, out, lse, limits=None, starts=None):
    """Rows q[rows] attend to cache[slots] (each from its entry of starts up to its entry of limits, when given);
    the result is merged into out[rows], lse[rows] in place."""
    R, S = rows.numel(), slots.numel()
    if R == 0 or S == 0:
        return
    group = q.shape[1] // k_cache.shape[1]
    items = _one_segment_items(R, S, _blocks(q, group)[0] // group, q.device)
    _merge(q, rows, k_cache, v_cache, slots, items, scale, out, lse, limits, starts)


def wave_merge_triton(q, k_cache, v_cache, wave: Wave, scale, out, lse, plan: AttentionPlan | None = None):
    """segment_attention_merge_triton of every segment of a wave (attention.Wave: row-disjoint segments, each with
    its rows' limits and starts where the wave has them) in one launch: each segment's rows cut into the same
    work items as alone, so each row's result is the one-segment call's. The items are built once per step with
    the step's `plan`."""
    group = q.shape[1] // k_cache.shape[1]

    def items():
        return _wave_work(wave, q, group)

    work = items() if plan is None else plan.derived(f"triton wave items {id(wave)}", items, wave)
    _merge(q, wave.rows, k_cache, v_cache, wave.slots, work, scale, out, lse, wave.limits, wave.starts)


def _wave_work(wave: Wave, q: torch.Tensor, group: int) -> torch.Tensor:
    """A wave's work items on q's device: each segment's rows in blocks of the kernel's row tile."""
    tokens = _blocks(q, group)[0] // group
    return _work_items(wave.row_offsets.diff().tolist(), wave.slot_offsets.diff().tolist(), tokens, q.device)


class _WaveItems(NamedTuple):
    wave: Wave
    items: torch.Tensor


def _wave_items(segments: list[Segment], q: torch.Tensor, group: int) -> list[_WaveItems]:
    """The segments as waves (attention.segment_waves: no two segments of a wave share a row), each wave with its
    work items on q's device."""
    return [_WaveItems(w, _wave_work(w, q, group)) for w in segment_waves(segments)]


def cascade_attention_triton(q, k_new, v_new, k_cache, v_cache, plan: AttentionPlan, scale, window=None):
    """Contract of attention.cascade_attention_ref. The self part runs on flash-attn when it is installed (CUDA,
    fp16/bf16, no sliding window), else on the varlen causal kernel (a sequence's new tokens hold consecutive
    positions, so the window is a distance in rows there). With `window`
    (attention.AttentionWindow), each segment's rows start at their first key inside the window."""
    q, cu_seqlens = q.contiguous(), plan.cu_seqlens
    if window is None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and flash_attention.available():
        out, lse = flash_attention.varlen_causal_attention_flash(q, k_new, v_new, list(cu_seqlens), scale)
    else:
        out, lse = varlen_causal_attention_triton(
            q, k_new, v_new, cu_seqlens, scale, 0 if window is None else window.size, plan
        )
    group = q.shape[1] // k_cache.shape[1]

    def waves():  # once per step (per kind of layer: Gemma-3's local ones see windowed segments)
        segs = fold_short_segments(plan.segments, _blocks(q, group)[1])  # short segments cost a whole key tile
        return _wave_items(segs if window is None else segment_starts(segs, window, plan), q, group)

    name = "triton waves" if window is None else "triton windowed waves"
    for w in plan.derived(name, waves, window):
        _merge(q, w.wave.rows, k_cache, v_cache, w.wave.slots, w.items, scale, out, lse, starts=w.wave.starts)
    return out.to(q.dtype)
