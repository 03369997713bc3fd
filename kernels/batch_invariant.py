"""Batch-invariant forms of the step's ops (the engine's deterministic mode): each row is computed with a
reduction order that depends only on the row itself, never on the other rows of the step, their number, the
row's place in the step, the prefix tree's node boundaries or the token budget.

- Matmuls run on fixed-shape row tiles (`linear`): every GEMM call has the shape [ROW_TILE, K], so the library
  picks the same kernel, K blocking and thread split whatever the step holds (measured on the CPU: the row results
  of torch's fp32 GEMM change with M below 16 rows, and with 2 threads between M=64 and M=129). Where the native
  panel linear runs (fp32 and bf16 weights in an AVX2 build, kernels/linear.py), the linears use it instead: each
  output is one FMA chain over the inputs, invariant by construction to the rows and the thread count.
- Attention (`cascade_attention`) reads every key from the cache (the step's new K/V are stored before it runs)
  in chunks at fixed absolute positions [c * KV_CHUNK, (c + 1) * KV_CHUNK), each chunk an online softmax in key
  tiles from its first key, merged into the row's running (out, lse) in ascending chunk order. A chunk that lies
  inside cached segments shared by many sequences is computed once for all their stacked rows (the cascade's
  sharing), a chunk holding a sequence's new tokens per sequence with a causal limit per row. The segment merge is
  row-invariant in the native CPU op and the Triton kernel (a masked key adds exact zeros; key tiles start at
  fixed offsets of the chunk); the torch reference is not (its GEMMs and softmax take the chunk's rows and keys as
  they come), so where it would run the mode uses `segment_attention_merge`, a torch form on fixed-shape tiles.
  A sliding window (Gemma-3's local layers) cuts each row's chunks at the row's own position (windowed_chunks).
- The target log-prob (`target_logprobs`) runs on fixed [LOGPROB_ROW_TILE x VOCAB_TILE] tiles (rows padded);
  where the native fused LM head runs (an AVX2 build), StepKernels uses that instead: batch-invariant as it is.
RMSNorm, RoPE, SwiGLU and the KV store are row-wise already (one row's arithmetic never sees another row).

The bits are those of one configuration: device, dtype, the library build (panels or row tiles), these tile
sizes, and with row tiles the CPU thread count (torch's fp32 GEMM splits a [64, 1536] tile differently on 1 and 2
threads; Engine.load then runs the mode on 1 thread unless `threads` is given). With the panels the thread count
does not change the bits (StepKernels.thread_invariant; tests/test_deterministic.py), and the mode runs on the
machine's free cores. On more than one thread, torch may also cut a step's elementwise activation (F.silu on the
torch path, Gemma-3's F.gelu on every CPU path) in the middle of a row and round the cut's last elements in its
scalar loop: measured with rows of 100 features on 2 threads and of 128 on 3, never on 1 thread, nor at the real
models' widths (1536) on 2 or 3."""

from __future__ import annotations

import bisect
import itertools

import numpy as np
import torch
import torch.nn.functional as F

from .attention import AttentionPlan, AttentionWindow, Segment, Wave, pack_wave
from .host import index_ranges, index_ranges_np, to_device
from .logprob import VOCAB_TILE, LogProbs, target_logprobs_ref

ROW_TILE = {"cpu": 64, "cuda": 256}  # rows per GEMM call, per device type (a GPU wants larger GEMMs)
KV_CHUNK = 256  # keys per attention chunk (a multiple of every kernel's key tile: 32 native, 64 Triton)
LOGPROB_ROW_TILE = 64
ATTN_ROW_TILE = 16  # query rows per attention GEMM of the torch form (segment_attention_merge)


def _pad_rows(x: torch.Tensor, tile: int) -> torch.Tensor:
    pad = -x.shape[0] % tile
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, tile: int | None = None):
    """F.linear(x, weight, bias) on fixed [tile, K] row blocks (the last one zero-padded)."""
    T = x.shape[0]
    tile = tile or ROW_TILE.get(x.device.type, 64)
    xp = _pad_rows(x, tile)
    out = torch.empty(xp.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    for r in range(0, xp.shape[0], tile):
        out[r : r + tile] = F.linear(xp[r : r + tile], weight, bias)
    return out[:T]


def target_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    top_k: int = 0,
    row_tile: int = LOGPROB_ROW_TILE,
    vocab_tile: int = VOCAB_TILE,
) -> LogProbs:
    """Contract of logprob.target_logprobs_ref, on fixed [row_tile, vocab_tile] tiles (rows zero-padded). On a
    GPU, the Triton kernel with one vocabulary split: each program walks the whole vocabulary for its rows, so no
    cross-program merge depends on the number of rows."""
    N = hidden.shape[0]
    if hidden.is_cuda:
        from .logprob_triton import target_logprobs_triton

        return target_logprobs_triton(hidden, weight, targets, top_k, splits=1)
    out = target_logprobs_ref(
        _pad_rows(hidden, row_tile),
        weight,
        _pad_rows(targets, row_tile),
        top_k=top_k,
        vocab_tile=vocab_tile,
        row_tile=row_tile,
    )
    return out.first(N)


def segment_attention_merge(
    q, rows, k_cache, v_cache, slots, scale, out, lse, limits=None, starts=None, row_tile: int = ATTN_ROW_TILE
):
    """Contract of attention.segment_attention_merge_ref, in torch, with every GEMM, reduction and merge of a fixed
    shape: the deterministic mode's attention step where neither the native op nor Triton runs (StepKernels).

    The reference itself is not batch-invariant: its two GEMMs take as many rows as the segment has (torch's fp32
    GEMM rounds a row differently at 1-3 rows, and at many row counts where the keys are few), its softmax sums as
    many keys as the segment has (the vectorised sum rounds differently when masked keys, exact zeros, are added: a
    chunk's key count depends on how many new tokens its sequence has in the step), and its logaddexp computes a
    tensor's last elements in a scalar loop that rounds differently from the vector one. Here the rows go in tiles of `row_tile` (padding rows see no
    key), the keys in tiles of KV_CHUNK from slots[0] (padding keys masked), and the tile's (out, lse) is merged
    into the row's with exp and log, which round an element the same wherever it lies."""
    R, S = rows.numel(), slots.numel()
    if R == 0 or S == 0:
        return
    H, D = q.shape[1], q.shape[2]
    Hkv = k_cache.shape[1]
    g, n = H // Hkv, -(-R // row_tile)
    pad, Rp = n * row_tile - R, n * row_tile
    lo = starts if starts is not None else torch.zeros_like(rows)
    hi = limits if limits is not None else torch.full_like(rows, S - 1)
    if pad:  # padding rows: q's row 0, seeing no key
        rows, lo, hi = (torch.cat([x, x.new_full((pad,), fill)]) for x, fill in ((rows, 0), (lo, 0), (hi, -1)))
    qt = q[rows].view(n, row_tile, Hkv, g, D).transpose(1, 2).reshape(n, Hkv, row_tile * g, D)
    run_out, run_lse = out[rows], lse[rows]
    for k0 in range(0, S, KV_CHUNK):
        idx = torch.arange(k0, k0 + KV_CHUNK, device=q.device)
        tile = slots[idx.clamp(max=S - 1)]  # padding keys: the last slot again, masked
        mask = (idx[None, :] >= lo[:, None]) & (idx[None, :] <= hi[:, None]) & (idx < S)[None, :]  # [Rp, KV_CHUNK]
        seen = mask.any(1)
        if not bool(seen.any()):
            continue
        s = torch.matmul(qt, k_cache[tile].permute(1, 2, 0)).float().mul_(scale)
        s = s.view(n, Hkv, row_tile, g, KV_CHUNK).masked_fill_(~mask.view(n, 1, row_tile, 1, KV_CHUNK), float("-inf"))
        seen_t = seen.view(n, 1, row_tile, 1)
        top = torch.where(seen_t, s.amax(-1), 0.0)
        p = torch.exp_(s.sub_(top[..., None]))
        total = p.sum(-1)
        tile_lse = top + torch.log(total)  # -inf for rows that see no key (their p: zeros)
        p = p.div_(torch.where(seen_t, total, 1.0)[..., None]).view(n, Hkv, row_tile * g, KV_CHUNK)
        o = torch.matmul(p.to(v_cache.dtype), v_cache[tile].transpose(0, 1)).float()
        o = o.view(n, Hkv, row_tile, g, D).transpose(1, 2).reshape(Rp, H, D)
        tile_lse = tile_lse.transpose(1, 2).reshape(Rp, H)
        top = torch.maximum(run_lse, tile_lse)
        new_lse = top + torch.log(torch.exp(run_lse - top) + torch.exp(tile_lse - top))
        new_out = run_out * torch.exp(run_lse - new_lse)[..., None] + o * torch.exp(tile_lse - new_lse)[..., None]
        run_out = torch.where(seen[:, None, None], new_out, run_out)
        run_lse = torch.where(seen[:, None], new_lse, run_lse)
    out[rows[:R]], lse[rows[:R]] = run_out[:R], run_lse[:R]


def chunk_segments(plan: AttentionPlan, chunk: int = KV_CHUNK) -> list[Segment]:
    """The keys of every row of a step cut at fixed absolute positions, from the step's cascade description.

    Sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1], at consecutive positions from its first (seq_starts[b]);
    its cached keys are the slots of the segments holding its rows, in list order (ancestors root first, as
    engine/step.py builds them), and its new keys are write_slots of its rows. Returns the chunks as Segments in
    ascending chunk order: the rows attend to the slots, each row up to its limit (an index into slots; none where
    every row sees the whole chunk); slot i of a chunk holds the key at absolute position `position` + i.

    Built on the host from what the host knows (the segments' row ranges and sizes, the sequences' first
    positions; a plan without them is read from the device once), then sent in one gather and two copies: a step
    of a thousand sequences has thousands of chunks, and a device read or a small copy per chunk would make the
    host wait for the device at every one."""
    cu, segments, write_slots = plan.cu_seqlens, plan.segments, plan.write_slots
    dev = write_slots.device
    live = _live(cu)
    seq_segs = _segments_of_sequences(segments, cu, live)
    first = _first_positions(plan, live)
    sizes = [seg.slots.numel() for seg in segments]
    offsets = [0]  # of each segment's slots, then of write_slots, in the gathered keys below
    for n in sizes:
        offsets.append(offsets[-1] + n)
    shared: dict = {}  # (chunk, (segment, ...)) -> [row ranges, slot ranges]
    own: list = []  # (chunk, row ranges, slot ranges, the first row's limit)
    for b in live:
        lo, hi = cu[b], cu[b + 1]
        p0 = first[b]
        pieces, start = [], 0  # (first position, segment, offset, keys) of every cached segment, then the new tokens
        for s in seq_segs[b]:
            pieces.append((start, s, offsets[s], sizes[s]))
            start += sizes[s]
        if start != p0:
            raise ValueError(f"sequence {b}: cached segments hold {start} keys, its first new position is {p0}")
        pieces.append((p0, None, offsets[-1] + lo, hi - lo))
        end = p0 + (hi - lo)
        for c0 in range(0, end, chunk):
            c1 = min(c0 + chunk, end)
            parts, key = [], [c0]
            for p, s, off, n in pieces:
                a, z = max(c0, p), min(c1, p + n)
                if a < z:
                    parts.append((off + a - p, z - a))
                    key.append(s)
            if c1 <= p0:  # cached keys only, seen whole by every row of the sequence: shared across sequences
                shared.setdefault(tuple(key), [[], parts])[0].append((lo, hi - lo))
            else:
                first_row = max(lo, lo + c0 - p0)  # rows at positions before c0 do not see this chunk
                own.append((c0, [(first_row, hi - first_row)], parts, p0 + (first_row - lo) - c0))
    entries = [(key[0], rows, parts, None) for key, (rows, parts) in shared.items()] + own
    entries.sort(key=lambda e: e[0])  # stable: ascending chunk order per row is all that matters
    if not entries:
        return []
    row_counts = [sum(n for _, n in e[1]) for e in entries]
    slot_counts = [sum(n for _, n in e[2]) for e in entries]
    rows = to_device(index_ranges(*zip(*(r for e in entries for r in e[1]))), dev).split(row_counts)
    keys = torch.cat([seg.slots for seg in segments] + [write_slots])
    slots = keys[to_device(index_ranges(*zip(*(r for e in entries for r in e[2]))), dev)].split(slot_counts)
    limited = [(e[3], n) for e, n in zip(entries, row_counts) if e[3] is not None]
    limits = iter(to_device(index_ranges(*zip(*limited)), dev).split([n for _, n in limited]) if limited else [])
    return [
        Segment(r, sl, limits=None if e[3] is None else next(limits), position=e[0], row_ranges=tuple(e[1]))
        for e, r, sl in zip(entries, rows, slots)
    ]


def _live(cu: list[int]) -> list[int]:
    """The sequences that hold rows."""
    return [b for b in range(len(cu) - 1) if cu[b + 1] > cu[b]]


def _first_positions(plan: AttentionPlan, live: list[int]) -> dict[int, int]:
    """Each live sequence's first position: the plan's host copy, else one read of the positions."""
    if plan.seq_starts is not None:
        return {b: plan.seq_starts[b] for b in live}
    at = plan.positions[torch.tensor([plan.cu_seqlens[b] for b in live], device=plan.positions.device)].tolist()
    return dict(zip(live, at))


def _segments_of_sequences(segments: list[Segment], cu: list[int], live: list[int]) -> dict[int, list[int]]:
    """For each sequence with rows, the indices of the segments holding its rows, in list order: from the
    segments' row ranges (one per sequence below the segment, starting at the sequence's first row) where every
    segment has them, else from one read of all the rows."""
    out: dict[int, list[int]] = {b: [] for b in live}
    by_first_row = {cu[b]: b for b in live}
    if all(seg.row_ranges is not None for seg in segments) and all(
        r0 in by_first_row for seg in segments for r0, _ in seg.row_ranges
    ):
        for s, seg in enumerate(segments):
            for b in dict.fromkeys(by_first_row[r0] for r0, _ in seg.row_ranges):
                out[b].append(s)
        return out
    flat = torch.cat([seg.rows for seg in segments]).cpu().numpy() if segments else np.zeros(0, dtype=np.int64)
    bounds = np.asarray(cu, dtype=np.int64)
    i = 0
    for s, seg in enumerate(segments):
        n = seg.rows.numel()
        for b in np.unique(np.searchsorted(bounds, flat[i : i + n], side="right") - 1).tolist():
            out[b].append(s)
        i += n
    return out


def windowed_chunks(chunks: list[Segment], window: AttentionWindow, plan: AttentionPlan) -> list[Segment]:
    """The chunks (chunk_segments') under a sliding window: a row at position p sees the chunk's keys from
    position p - window.size + 1 on (starts: indices into slots); rows that see none of a chunk leave it, and
    chunks left without rows. Only the row's own position decides, so the mode stays batch-invariant. Computed on
    the host from the chunks' row ranges and the sequences' first positions (a sequence's new tokens hold
    consecutive positions), the rows, starts and limits sent in one copy each."""
    cu = plan.cu_seqlens
    first = _first_positions(plan, _live(cu))

    def position(row: int) -> int:
        b = bisect.bisect_right(cu, row) - 1  # the sequence holding the row (empty ones share its first row)
        return first[b] + row - cu[b]

    kept, rows, starts, limits = [], [], [], []
    for chunk in chunks:
        n_keys, c0 = chunk.slots.numel(), chunk.position
        counts = [n for _, n in chunk.row_ranges]
        row = index_ranges_np([r0 for r0, _ in chunk.row_ranges], counts)
        pos = index_ranges_np([position(r0) for r0, _ in chunk.row_ranges], counts)
        start = np.maximum(pos - (window.size - 1) - c0, 0)
        limit = pos - c0 if chunk.limits is not None else None  # chunk_segments' limits: a row sees up to itself
        last = np.minimum(n_keys - 1, limit) if limit is not None else n_keys - 1
        seen = start <= last
        if not seen.any():
            continue
        kept.append(chunk)
        rows.append(row[seen])
        starts.append(start[seen])
        limits.append(limit[seen] if limit is not None else None)
    if not kept:
        return []
    dev = kept[0].rows.device
    counts = [len(r) for r in rows]
    rows_d, starts_d = (to_device(torch.from_numpy(np.concatenate(x)), dev).split(counts) for x in (rows, starts))
    limited = [x for x in limits if x is not None]
    limits_d = iter(
        to_device(torch.from_numpy(np.concatenate(limited)), dev).split([len(x) for x in limited]) if limited else []
    )
    return [
        Segment(r, c.slots, st, None if lim is None else next(limits_d), c.position)
        for c, r, st, lim in zip(kept, rows_d, starts_d, limits)
    ]


def chunk_waves(chunks: list[Segment]) -> list[Wave]:
    """The chunks (in ascending chunk order) as waves of one chunk position and one form (with or without row
    limits, and starts): the chunks at one position hold disjoint rows (a row sees each position once), so a
    wave's rows merge it in their ascending chunk order as the chunks one by one would."""
    runs = itertools.groupby(chunks, key=lambda c: (c.position, c.limits is None, c.starts is None))
    return [pack_wave(list(run)) for _, run in runs]


def cascade_attention(
    q, k_cache, v_cache, plan: AttentionPlan, scale, merge, window=None, chunk: int = KV_CHUNK, waves=None
):
    """Attention of every row over the step's fixed key chunks of `chunk` keys (chunk_segments, built once per
    step), merged in order by `merge` (the dispatched segment_attention_merge); with a sliding `window`, over the
    part of each chunk inside the row's window (windowed_chunks). With `waves`, the merge's wave form (the Triton
    kernel's: one launch for many row-disjoint segments, each computed as alone; dispatch.MERGE_WAVES), the chunks
    of one position go in one call (chunk_waves): an ICQS step's 300-462 chunks are 3-5 launches a layer.
    Returns out [T, H, D] in q's dtype."""
    q = q.contiguous()
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float32, device=q.device)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device)
    chunks = plan.derived(f"kv chunks of {chunk}", lambda: chunk_segments(plan, chunk))
    if window is not None:  # every local layer of the step: the same window
        chunks = plan.derived(f"windowed kv chunks of {chunk}", lambda: windowed_chunks(chunks, window, plan), window)
    if waves is not None:
        name = f"kv chunk waves of {chunk}" + ("" if window is None else " windowed")
        for w in plan.derived(name, lambda: chunk_waves(chunks), chunks):
            waves(q, k_cache, v_cache, w, scale, out, lse, plan)
        return out.to(q.dtype)
    for c in chunks:
        merge(q, c.rows, k_cache, v_cache, c.slots, scale, out, lse, c.limits, c.starts)
    return out.to(q.dtype)
