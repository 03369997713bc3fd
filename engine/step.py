"""Packs the chunks of a step plan into one forward step (`StepBatch`).

A `Chunk` is a node's tokens start..end-1, whose cache slots are already allocated. Every cached segment
a chunk attends to (each ancestor, and the node's own earlier tokens) becomes one cascade segment whose query
rows are the rows of all chunks below it. The final hidden states of the rows a chunk keeps (those a score or a
sample of this step reads) come out, to be kept in the cache beside their K/V (prefix_cache.KVCache)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .model import StepBatch
from .prefix_cache import Node



@dataclass(slots=True)
class Chunk:
    """Tokens start..end-1 of one prefix-tree node, computed in one step; `keep`: the node offsets among them whose
    final hidden states are asked for."""
    node: Node
    start: int
    end: int
    keep: set[int] = field(default_factory=set)


def _long(values) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values, dtype=np.int64))  # numpy: ~4x torch.tensor's rate from a list


def _ranges(starts: list[int], lengths: list[int]) -> torch.Tensor:
    """range(start, start + length) for each pair, concatenated, in a few array ops whatever the count."""
    n = np.asarray(lengths, dtype=np.int64)
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(n) - n)  # value minus output index, per range
    return torch.from_numpy(np.arange(int(n.sum()), dtype=np.int64) + np.repeat(shift, n))


def build_step(chunks: list[Chunk], device) -> StepBatch:
    """The step's index tensors are built once per step from ranges gathered as Python ints (a decode step holds
    one chunk per sequence, each below a few cached segments), not one small tensor per chunk and segment."""
    tokens, pos_starts, lengths, slot_parts, cu, out = [], [], [], [], [0], []
    segments: dict = {}  # key -> (cached slots, row-range starts, row-range lengths)
    for chunk in chunks:
        node, a, b = chunk.node, chunk.start, chunk.end
        r0 = cu[-1]
        tokens += node.tokens[a:b]
        pos_starts.append(node.start + a)
        lengths.append(b - a)
        slot_parts.append(node.slots[a:b])
        for anc in node.ancestors():
            seg = segments.get(id(anc))
            if seg is None:
                seg = segments[id(anc)] = (anc.slots[:len(anc)], [], [])
            seg[1].append(r0)
            seg[2].append(b - a)
        if a > 0:
            segments[(id(node), a)] = (node.slots[:a], [r0], [b - a])
        out += [r0 + off - a for off in sorted(chunk.keep)]
        cu.append(r0 + b - a)
    segs = list(segments.values())
    rows = _ranges([r for seg in segs for r in seg[1]], [n for seg in segs for n in seg[2]]).to(device)
    return StepBatch(
        token_ids=_long(tokens).to(device),
        positions=_ranges(pos_starts, lengths).to(device),
        write_slots=torch.cat(slot_parts).to(device),
        cu_seqlens=cu,
        segments=list(zip(rows.split([sum(seg[2]) for seg in segs]), (seg[0].to(device) for seg in segs))),
        out_rows=_long(out).to(device),
    )
