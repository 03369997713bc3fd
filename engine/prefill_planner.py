"""The prefill planner: chunks of the nodes on the work queue (depth first) up to the step's token budget, with the
score rows their positions answer. A node whose chunk completes it brings the nodes below it into the same step
(the forward stores each layer's K/V before that layer's attention reads the cache), so a step fills its budget
across the levels of the prefix tree instead of one level per step. Prefill of new work never preempts: it waits
until pages free up, unless the step would otherwise be empty."""

from __future__ import annotations

from .memory_policy import MemoryPolicy
from .plan import ScoreRow, StepDraft
from .prefix_cache import Node, PrefixCache
from .work_queue import WorkQueue


class PrefillPlanner:
    def __init__(self, cache: PrefixCache, memory: MemoryPolicy, queue: WorkQueue):
        self.cache, self.memory, self.queue = cache, memory, queue

    def plan(self, draft: StepDraft) -> Node | None:
        """Add prefill chunks and their score rows to the draft; returns the node that found no pages in an
        otherwise empty step, if any."""
        cache, queue = self.cache, self.queue
        while queue.stack and draft.budget > 0:
            node = queue.top()
            if not cache.live(node):
                queue.pop()
                continue
            missing = cache.missing_ancestor(node, draft.completing)
            if missing is not None:  # an ancestor was split off unfinished, or preempted: compute it first
                queue.pop()  # pushed again with the ancestor's frontier when the ancestor completes
                if id(missing) not in draft.planned:
                    queue.push(missing)
                continue
            span = cache.span(node)
            n = min(span.length - span.done, draft.budget)
            if not self.memory.room(node, span.done + n, draft.protected, may_preempt=draft.empty):
                return node if draft.empty else None
            queue.pop()
            chunk = draft.add_chunk(cache, node, span, n)
            end = chunk.position + n
            for r in queue.take(node, chunk.position, end):
                draft.add_score(
                    ScoreRow(
                        cache.slot(node, r.position),
                        r.request,
                        r.index,
                        r.target,
                        cache.slot(node, r.position + 1) if r.position + 1 < end else -1,
                    )
                )
                chunk.keep.add(r.position - span.start)
            if id(node) in draft.completing:  # its children may follow in this step, on top of the stack
                queue.below(node)
        return None
