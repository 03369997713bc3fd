"""Where each continuation token of a new score request gets its log-prob, decided when the request is added:
- pending: its position is not computed yet; the row waits on the prefix-cache node that holds the position
  (engine/work_queue.py) and becomes a score row when a chunk computes it;
- known: the same (position, target) was scored before and its log-prob is memoized in the KV store at the target's
  slot: the same numbers, no LM head;
- ready: the position's hidden state is in the cache: scored through the LM head in the next step."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernels import TokenLogProb

from .kv_cache import KVCache
from .plan import PendingRow, ScoreRow
from .prefix_cache import Node, PrefixCache
from .request import ScoreRequest


@dataclass(slots=True)
class AddedRows:
    pending: list[tuple[Node, PendingRow]] = field(default_factory=list)
    known: list[tuple[int, TokenLogProb]] = field(default_factory=list)  # (continuation index, memoized log-prob)
    ready: list[ScoreRow] = field(default_factory=list)


def rows_of(cache: PrefixCache, kv: KVCache, req: ScoreRequest, path: list[Node], first: int) -> AddedRows:
    """The rows of a request inserted along `path` (root to leaf), whose continuation's first token is predicted by
    the hidden state at absolute position `first`: each node from the leaf up, until the one holding `first`."""
    out, full = AddedRows(), req.full
    for node in reversed(path):
        span = cache.span(node)
        computed = span.start + span.done
        for p in range(max(first, span.start), span.end):
            if p >= computed:
                out.pending.append((node, PendingRow(p, req, p - first, full[p + 1])))
                continue
            target_slot = cache.slot(node, p + 1) if p + 1 < computed else -1
            known = kv.memo_get(target_slot, req.top_k) if target_slot >= 0 else None
            if known is not None:
                out.known.append((p - first, known))
            else:
                out.ready.append(ScoreRow(cache.slot(node, p), req, p - first, full[p + 1], target_slot))
        if span.start <= first:
            break
    return out
