"""Packs the chunks of a step plan into one forward step (`StepBatch`).

A `Chunk` (engine/plan.py) is a node's tokens start..end-1, whose cache slots are already allocated; the prefix
cache describes it (`ChunkSource`: its tokens, their slots, the cached runs before them). Every cached run a chunk
attends to (each ancestor, and the node's own earlier tokens) becomes one cascade segment whose query rows are the
rows of all chunks below it. The final hidden states of the rows a chunk keeps (those a score or a sample of this
step reads) come out, to be kept in the cache beside their K/V (engine/kv_cache.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from kernels import Segment, index_ranges, to_device

from .model import StepBatch
from .plan import Chunk
from .prefix_cache import PrefixCache


def _long(values) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values, dtype=np.int64))  # numpy: ~4x torch.tensor's rate from a list


class BuiltStep(NamedTuple):
    """A step's model input, and the host's copy of the slots it writes (`written`) and of those whose final hidden
    states it keeps (`kept`), for the KV store's bookkeeping (KVCache.write_hidden) without reading the device;
    `contexts`: per sequence, the host's slot runs it attends to in position order, its new slots last (what a
    fixed-shape decode step's slot table holds, engine/decode_graphs.py); None where the builder was not asked."""

    batch: StepBatch
    written: torch.Tensor  # [T] int64, on the host
    kept: torch.Tensor  # [N] int64, on the host: written[batch.out_rows]
    contexts: list[list[torch.Tensor]] | None


def build_step(
    chunks: list[Chunk], cache: PrefixCache, device, sampled: torch.Tensor | None = None, contexts: bool = False
) -> BuiltStep:
    """The step's index tensors are built once per step from ranges gathered as Python ints (a decode step holds
    one chunk per sequence, each below a few cached segments), not one small tensor per chunk and segment.
    `sampled`: the tokens the step in flight samples, on the device; a chunk whose last token is one of them
    (Chunk.feed) takes it from there, so the host does not wait for that step to be read. `contexts`: also each
    sequence's slot runs (BuiltStep.contexts, what the fixed-shape decode path reads)."""
    tokens, pos_starts, lengths, slot_parts, cu, out, runs = [], [], [], [], [0], [], []
    fed_rows, fed_from = [], []
    segments: dict = {}  # run key -> (cached slots, row-range starts, row-range lengths, first key position)
    for chunk in chunks:
        src = cache.chunk_source(chunk.node, chunk.start, chunk.end)
        n, r0 = chunk.end - chunk.start, cu[-1]
        tokens += src.tokens
        pos_starts.append(src.position)
        lengths.append(n)
        slot_parts.append(src.slots)
        if contexts:
            runs.append([*(run.slots for run in src.before), src.slots])
        for run in src.before:
            seg = segments.get(run.key)
            if seg is None:
                seg = segments[run.key] = (run.slots, [], [], run.start)
            seg[1].append(r0)
            seg[2].append(n)
        out += [r0 + off - chunk.start for off in sorted(chunk.keep)]
        cu.append(r0 + n)
        if chunk.feed >= 0:
            tokens[-1] = 0  # PENDING until the device's copy below
            fed_rows.append(r0 + n - 1)
            fed_from.append(chunk.feed)
    segs = list(segments.values())
    rows = to_device(index_ranges([r for seg in segs for r in seg[1]], [n for seg in segs for n in seg[2]]), device)
    seg_slots = to_device(torch.cat([seg[0] for seg in segs]), device) if segs else None  # one copy for all
    written, out_rows = torch.cat(slot_parts), _long(out)
    token_ids = to_device(_long(tokens), device)
    if fed_rows:
        if sampled is None:
            raise RuntimeError("a chunk takes a token sampled by a step in flight, but no step is in flight")
        token_ids[to_device(_long(fed_rows), device)] = sampled[to_device(_long(fed_from), device)]
    batch = StepBatch(
        token_ids=token_ids,
        positions=to_device(index_ranges(pos_starts, lengths), device),
        write_slots=to_device(written, device),
        cu_seqlens=cu,
        seq_starts=pos_starts,
        segments=[
            Segment(r, sl, row_ranges=tuple(zip(seg[1], seg[2])), position=seg[3])
            for r, sl, seg in zip(
                rows.split([sum(seg[2]) for seg in segs]), seg_slots.split([len(seg[0]) for seg in segs]), segs
            )
        ]
        if segs
        else [],
        out_rows=to_device(out_rows, device),
    )
    return BuiltStep(batch, written, written[out_rows], runs if contexts else None)
