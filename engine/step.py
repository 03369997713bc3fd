"""Packs the chunks of a step plan into one forward step (`StepBatch`).

A `Chunk` is a node's tokens start..end-1, whose cache slots are already allocated. Every cached segment
a chunk attends to (each ancestor, and the node's own earlier tokens) becomes one cascade segment whose query
rows are the rows of all chunks below it. The final hidden states of the rows a chunk keeps (those a score or a
sample of this step reads) come out, to be kept in the cache beside their K/V (prefix_cache.KVCache)."""
from __future__ import annotations

from dataclasses import dataclass, field

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


def build_step(chunks: list[Chunk], device) -> StepBatch:
    tokens, positions, slots, cu, out = [], [], [], [0], []
    segments: dict = {}
    for chunk in chunks:
        node, a, b = chunk.node, chunk.start, chunk.end
        r0 = cu[-1]
        tokens += node.tokens[a:b]
        positions.append(torch.arange(node.start + a, node.start + b))
        slots.append(node.slots[a:b])
        for anc in node.ancestors():
            segments.setdefault(id(anc), [anc.slots[:len(anc)], []])[1].append(torch.arange(r0, r0 + b - a))
        if a > 0:
            segments[(id(node), a)] = [node.slots[:a], [torch.arange(r0, r0 + b - a)]]
        out += [r0 + off - a for off in sorted(chunk.keep)]
        cu.append(r0 + b - a)
    return StepBatch(
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        positions=torch.cat(positions).to(device),
        write_slots=torch.cat(slots).to(device),
        cu_seqlens=cu,
        segments=[(torch.cat(rows).to(device), s.to(device)) for s, rows in segments.values()],
        out_rows=torch.tensor(out, dtype=torch.long, device=device),
    )
