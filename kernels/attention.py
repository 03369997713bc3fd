"""Attention over the paged KV cache as the engine computes it: cascade form.

A forward step packs the new tokens of many sequences. Each sequence attends (a) causally to its own new tokens
and (b) to the cached tokens before them, which are a chain of prefix-tree segments shared with other sequences.
For each segment, the queries of every sequence below it are stacked and attend to the segment's K/V in one
batched matmul; the partial results are merged by log-sum-exp. All softmax statistics are fp32.

The step's description is typed: a `Segment` (query rows, cache slots, and per row the first and last slot it
sees) and an `AttentionPlan` (the sequences, the segments, the new tokens' positions and slots), built once per step
and passed to every layer; it keeps what an implementation derives from it for the step's other layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .host import index_ranges, to_device

SELF_WINDOW = 256  # new tokens per dense block-diagonal window in the self-attention part


@dataclass(frozen=True, slots=True)
class Segment:
    """Query rows of a step that attend to cached keys: row i of `rows` sees slots[starts[i]] .. slots[limits[i]]
    (from the first slot where starts is None, up to the last where limits is None). `position`: the absolute
    position of slots[0], where the builder knows it (the slots then hold consecutive positions: a prefix-tree
    node's run, or the deterministic mode's fixed key chunks); None where it does not."""

    rows: torch.Tensor  # [R] int64 into the step's query rows
    slots: torch.Tensor  # [S] int64 cache slots, in increasing position
    starts: torch.Tensor | None = None  # [R] int64
    limits: torch.Tensor | None = None  # [R] int64
    position: int | None = None
    # the rows as (first row, count) ranges, where the step's builder knows them (engine/step.py: one range per
    # chunk below the segment; two segments' ranges are equal or disjoint): the per-step grouping of segments
    # (fold_short_segments, segment_waves) then works on ranges instead of reading every row to the host
    row_ranges: tuple[tuple[int, int], ...] | None = None


class AttentionPlan:
    """One step's attention, built once and passed to every layer: sequence b owns the new-token rows
    cu_seqlens[b]:cu_seqlens[b+1] (`positions` and `write_slots`: their absolute positions and cache slots, given
    where a mode needs them), and `segments` are the cascade's cached segments, each shared by the rows below it.
    `seq_starts`: each sequence's first position on the host, where the step's builder knows it (a sequence's new
    tokens hold consecutive positions), so that a mode needing positions does not read them from the device.
    `derived(name, build, *keys)` keeps what an implementation computes from the plan (waves, fixed chunks,
    windowed forms) for the step's other layers, rebuilt when one of `keys` is another object."""

    __slots__ = ("cu_seqlens", "segments", "positions", "write_slots", "seq_starts", "_derived")

    def __init__(
        self,
        cu_seqlens: list[int],
        segments: list[Segment],
        positions: torch.Tensor | None = None,
        write_slots: torch.Tensor | None = None,
        seq_starts: list[int] | None = None,
    ):
        self.cu_seqlens, self.segments = cu_seqlens, segments
        self.positions, self.write_slots, self.seq_starts = positions, write_slots, seq_starts
        self._derived: dict[str, tuple] = {}

    def derived(self, name: str, build, *keys):
        hit = self._derived.get(name)
        if hit is None or len(hit[0]) != len(keys) or any(a is not b for a, b in zip(hit[0], keys)):
            hit = self._derived[name] = (keys, build())
        return hit[1]


@dataclass(frozen=True)
class AttentionWindow:
    """A sliding window (Gemma-3 local layers): a query at position p sees keys at positions > p - size.
    positions [T]: the absolute positions of the step's new tokens; slot_positions [num_slots]: of each cache slot.
    The mask depends on absolute positions only, so a shared prefix's K/V and results are the same for every
    sequence below it."""

    size: int
    positions: torch.Tensor
    slot_positions: torch.Tensor


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None):
    """q [R, H, D], k/v [S, Hkv, D], mask [R, S] bool (True = may attend) -> out [R, H, D] fp32, lse [R, H] fp32."""
    R, H, D = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    g = H // Hkv
    qg = q.reshape(R, Hkv, g, D).permute(1, 0, 2, 3).reshape(Hkv, R * g, D)
    s = torch.bmm(qg, k.permute(1, 2, 0)).float().mul_(scale).view(Hkv, R, g, S)
    if mask is not None:
        s.masked_fill_(~mask.view(1, R, 1, S), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [Hkv, R, g]
    p = torch.exp(s - lse.unsqueeze(-1)).view(Hkv, R * g, S)
    o = torch.bmm(p.to(v.dtype), v.permute(1, 0, 2)).float()  # [Hkv, R * g, D]
    out = o.view(Hkv, R, g, D).permute(1, 0, 2, 3).reshape(R, H, D)
    return out, lse.permute(1, 0, 2).reshape(R, H)


def segment_attention_ref(q, k_cache, v_cache, slots, scale, limits=None, starts=None):
    """Stacked queries q [R, H, D] of all sequences that share one cached segment attend to all of it.

    k_cache, v_cache: [num_slots, Hkv, D] (one layer); slots: [S] int64, S > 0; limits (optional) [R]: the last
    index into slots each row may see; starts (optional) [R]: the first. Every row must see at least one key.
    Returns (out fp32, lse fp32)."""
    mask = None
    idx = torch.arange(slots.numel(), device=q.device)[None, :]
    if limits is not None:
        mask = idx <= limits.to(q.device)[:, None]
    if starts is not None:
        after = idx >= starts.to(q.device)[:, None]
        mask = after if mask is None else mask & after
    return _attend(q, k_cache[slots], v_cache[slots], scale, mask)


def segment_attention_merge_ref(q, rows, k_cache, v_cache, slots, scale, out, lse, limits=None, starts=None):
    """Rows q[rows] attend to cache[slots] (each from its start up to its limit, when given); merged into
    out[rows], lse[rows]. A row whose range is empty keeps its (out, lse)."""
    if rows.numel() == 0 or slots.numel() == 0:
        return
    if limits is not None or starts is not None:
        hi = limits if limits is not None else torch.full_like(rows, slots.numel() - 1)
        lo = starts if starts is not None else torch.zeros_like(rows)
        seen = (lo <= hi) & (lo < slots.numel())  # a limit may lie past the last slot, a start too
        if not bool(seen.all()):
            rows, lo, hi = rows[seen], lo[seen], hi[seen]
            limits = hi if limits is not None else None
            starts = lo if starts is not None else None
        if rows.numel() == 0:
            return
    o, l = segment_attention_ref(q[rows], k_cache, v_cache, slots, scale, limits, starts)
    out[rows], lse[rows] = merge_attention_ref(out[rows], lse[rows], o, l)


def segment_starts(
    segments: list[Segment], window: AttentionWindow, plan: AttentionPlan | None = None
) -> list[Segment]:
    """The cascade's segments under a sliding window, each row's first slot in it set (`starts`: a segment's slots
    hold increasing positions); rows that see none of a segment are dropped from it, and segments left without
    rows. With the step's `plan` and segments whose builder gave their row ranges and first key position (the
    engine's), the starts come from those host facts (_window_starts_on_host), without reading the device."""
    if (
        plan is not None
        and plan.seq_starts is not None
        and all(s.row_ranges is not None and s.position is not None for s in segments)
    ):
        return _window_starts_on_host(segments, window.size, plan)
    out = []
    for seg in segments:
        rows, slots = seg.rows, seg.slots
        if rows.numel() == 0 or slots.numel() == 0:
            continue
        kpos = window.slot_positions[slots]
        starts = torch.searchsorted(kpos, window.positions[rows] - (window.size - 1))
        seen = starts < slots.numel()
        if not bool(seen.all()):
            rows, starts = rows[seen], starts[seen]
        if rows.numel():
            out.append(Segment(rows, slots, starts))
    return out


def _window_starts_on_host(segments: list[Segment], size: int, plan: AttentionPlan) -> list[Segment]:
    """segment_starts from host facts: a segment's keys hold consecutive positions from `position`, and each row
    range (r0, n) is the new tokens of the sequence starting at row r0, at consecutive positions from its
    seq_starts entry. A row at position p sees the keys from p - size + 1 on: its start is that minus the
    segment's first position, at least 0. A segment no row sees is dropped; a row of a seen segment that sees none
    of it keeps a start past its last key (the merge kernels then leave its state as it was), so the segments'
    row ranges stay as they were (equal or disjoint) and the waves are still grouped on them. All starts go to
    the device in one copy."""
    first_pos = {r0: p for r0, p in zip(plan.cu_seqlens, plan.seq_starts)}
    kept, parts = [], []
    for seg in segments:
        n_keys = seg.slots.numel()
        if not seg.row_ranges or n_keys == 0:
            continue
        lo = [first_pos[r0] - size + 1 - seg.position for r0, _ in seg.row_ranges]  # the first row's start
        if all(s >= n_keys for s in lo):  # the lowest start of a range is its first row's
            continue
        kept.append(seg)
        parts.append(index_ranges(lo, [n for _, n in seg.row_ranges]).clamp_(0, n_keys))
    if not kept:
        return []
    starts = to_device(torch.cat(parts), kept[0].rows.device).split([len(x) for x in parts])
    return [
        Segment(seg.rows, seg.slots, st, row_ranges=seg.row_ranges, position=seg.position)
        for seg, st in zip(kept, starts)
    ]


def _row_units(segments: list[Segment]) -> list[list]:
    """Each segment's rows as hashable units that two segments either share or not: its row ranges where every
    segment has them (equal or disjoint by Segment's contract), else its rows as Python ints, read in one copy for
    the whole list (one device sync on a GPU, not one per segment)."""
    if not segments:
        return []
    if all(s.row_ranges is not None for s in segments):
        return [list(s.row_ranges) for s in segments]
    flat = torch.cat([s.rows for s in segments]).cpu().tolist()
    out, i = [], 0
    for s in segments:
        n = s.rows.numel()
        out.append(flat[i : i + n])
        i += n
    return out


FOLD_BELOW = 32  # keys in a key tile of the native kernel (the Triton one passes its own tile)


def fold_short_segments(segments: list[Segment], min_slots: int = FOLD_BELOW) -> list[Segment]:
    """The segments with each one shorter than `min_slots` keys prepended to the segments right below it, where
    that is exact: every row of the short segment has a next segment, and every row of those next segments has
    the short one just before it. A row then sweeps the same keys in fewer, longer segments (a 4-key root shared
    by 1,000 rows otherwise costs each row a whole key tile and one more merge)."""
    live = [s for s in segments if s.rows.numel() and s.slots.numel()]
    segs = [[s.rows, s.slots, s.position] for s in live]
    if not any(slots.numel() < min_slots for _, slots, _ in segs):
        return [Segment(s.rows, s.slots, row_ranges=s.row_ranges, position=s.position) for s in live]
    chain: dict = {}  # row (or row range) -> its segments, in merge order
    rows_of = _row_units(live)
    for i, rows in enumerate(rows_of):
        for r in rows:
            chain.setdefault(r, []).append(i)
    alive = [True] * len(segs)
    for i in range(len(segs) - 1, -1, -1):  # deepest first: a row's later segments lie below its earlier ones
        if segs[i][1].numel() >= min_slots:
            continue
        nxt = set()
        for r in rows_of[i]:
            c = chain[r]
            k = c.index(i)
            if k + 1 == len(c):
                break
            nxt.add(c[k + 1])
        else:
            if all(chain[r][chain[r].index(c) - 1] == i for c in nxt for r in rows_of[c]):
                for c in nxt:  # the short segment's keys come right before c's: c now starts where it did
                    segs[c][1] = torch.cat([segs[i][1], segs[c][1]])
                    segs[c][2] = segs[i][2]
                for r in rows_of[i]:
                    chain[r].remove(i)
                alive[i] = False
    return [
        Segment(rows, slots, row_ranges=s.row_ranges, position=position)
        for (rows, slots, position), s, keep in zip(segs, live, alive)
        if keep
    ]


@dataclass(frozen=True, slots=True)
class Wave:
    """Segments that share no query row, concatenated for one kernel call: segment i is rows[row_offsets[i]:
    row_offsets[i + 1]] over slots[slot_offsets[i]:slot_offsets[i + 1]], each row from its entry of starts (up to
    its entry of limits). rows, slots, starts and limits are on the segments' device; the offsets are int64 CPU
    tensors."""

    rows: torch.Tensor
    row_offsets: torch.Tensor
    slots: torch.Tensor
    slot_offsets: torch.Tensor
    starts: torch.Tensor | None
    limits: torch.Tensor | None = None


def pack_wave(segments: list[Segment]) -> Wave:
    """Row-disjoint segments as one Wave (each with starts, or none; likewise limits)."""
    row_off, slot_off = (
        torch.tensor([0] + [len(x) for x in xs]).cumsum(0)
        for xs in ([s.rows for s in segments], [s.slots for s in segments])
    )
    first = segments[0]
    return Wave(
        torch.cat([s.rows for s in segments]),
        row_off,
        torch.cat([s.slots for s in segments]),
        slot_off,
        torch.cat([s.starts for s in segments]) if first.starts is not None else None,
        torch.cat([s.limits for s in segments]) if first.limits is not None else None,
    )


def segment_waves(segments: list[Segment]) -> list[Wave]:
    """Groups the segments into waves in which no two share a query row, keeping each row's segments in list
    order (segment i goes to the wave after the last one holding any of its rows): one kernel call a wave (a
    step's many small segments, one or two per sequence when decoding, fall into a few waves). Rows are compared
    as the segments' row ranges where they have them (_row_units)."""
    level: dict = {}  # per row (or row range): the wave after its latest segment's
    waves: list[list[Segment]] = []
    live = [s for s in segments if s.rows.numel() and s.slots.numel()]
    for seg, units in zip(live, _row_units(live)):
        w = max(level.get(u, 0) for u in units)
        for u in units:
            level[u] = w + 1
        if w == len(waves):
            waves.append([])
        waves[w].append(seg)
    return [pack_wave(wave) for wave in waves]


def varlen_causal_attention_ref(q, k, v, cu_seqlens: list[int], scale, window: int = 0):
    """Self part: q [T, H, D], k/v [T, Hkv, D] hold the new tokens of sequences packed back to back, sequence b
    being rows cu_seqlens[b]:cu_seqlens[b+1]. Each token attends to itself and the earlier new tokens of its own
    sequence. Computed in dense windows of whole sequences (block-diagonal causal mask). window > 0: keys `window`
    or more positions before the query are masked too (a sequence's new tokens hold consecutive positions, so the
    window is a distance in rows). Returns (out [T, H, D] fp32, lse [T, H] fp32)."""
    T, H, D = q.shape
    out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    b, nseq = 0, len(cu_seqlens) - 1
    while b < nseq:
        e = b + 1
        while e < nseq and cu_seqlens[e + 1] - cu_seqlens[b] <= SELF_WINDOW:
            e += 1
        lo, hi = cu_seqlens[b], cu_seqlens[e]
        seq = torch.repeat_interleave(
            torch.arange(e - b, device=q.device),
            torch.tensor([cu_seqlens[i + 1] - cu_seqlens[i] for i in range(b, e)], device=q.device),
        )
        idx = torch.arange(hi - lo, device=q.device)
        mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
        if window > 0:
            mask &= (idx[:, None] - idx[None, :]) < window
        out[lo:hi], lse[lo:hi] = _attend(q[lo:hi], k[lo:hi], v[lo:hi], scale, mask)
        b = e
    return out, lse


def paged_decode_attention_ref(q, k_cache, v_cache, table, lens, scale, window: int = 0):
    """A decode step's attention in fixed shapes (the form a captured CUDA graph replays): q [B, H, D] holds one
    new token per sequence, whose K/V are already in the cache; row b attends to the cache slots table[b, :lens[b]]
    (its whole context in position order, its own key last; table [B, W] int32 or int64, lens [B] int32). With
    window > 0, to the last `window` of them only (a sliding window: the slot at index j holds position j). A row
    with lens 0 (padding) gives zeros. Returns out [B, H, D] in q's dtype; softmax statistics in fp32."""
    B, H, D = q.shape
    out = torch.zeros(B, H, D, dtype=torch.float32, device=q.device)
    for b, n in enumerate(lens.tolist()):
        if n <= 0:
            continue
        slots = table[b, max(0, n - window) if window > 0 else 0 : n].long()
        out[b : b + 1] = _attend(q[b : b + 1], k_cache[slots], v_cache[slots], scale, None)[0]
    return out.to(q.dtype)


def merge_attention_ref(out_a, lse_a, out_b, lse_b):
    """Log-sum-exp merge of two partial attentions over disjoint key sets. out [R, H, D], lse [R, H] (fp32)."""
    lse = torch.logaddexp(lse_a, lse_b)
    wa = torch.exp(lse_a - lse).unsqueeze(-1)
    wb = torch.exp(lse_b - lse).unsqueeze(-1)
    return out_a * wa + out_b * wb, lse


def cascade_attention_ref(
    q, k_new, v_new, k_cache, v_cache, plan: AttentionPlan, scale, window: AttentionWindow | None = None
):
    """Full step attention: the new tokens of plan.cu_seqlens' sequences causally among themselves, and each
    plan.segments' rows over its cached slots. Returns out [T, H, D] in q's dtype. With a sliding `window`, each
    cached segment's keys are masked by absolute position; a row whose keys in a segment are all outside the
    window takes nothing from it."""
    out, lse = varlen_causal_attention_ref(
        q, k_new, v_new, plan.cu_seqlens, scale, 0 if window is None else window.size
    )
    for seg in plan.segments:
        rows, slots = seg.rows, seg.slots
        if window is None:
            segment_attention_merge_ref(q, rows, k_cache, v_cache, slots, scale, out, lse)
            continue
        if rows.numel() == 0 or slots.numel() == 0:
            continue
        qpos = window.positions.to(q.device)[rows]
        kpos = window.slot_positions.to(q.device)[slots]
        mask = (qpos[:, None] - kpos[None, :]) < window.size
        seen = mask.any(dim=1)
        if not bool(seen.any()):
            continue
        r = rows[seen]
        o, l = _attend(q[r], k_cache[slots], v_cache[slots], scale, mask[seen])
        out[r], lse[r] = merge_attention_ref(out[r], lse[r], o, l)
    return out.to(q.dtype)
