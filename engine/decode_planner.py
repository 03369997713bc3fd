"""The decode planner: every step, one token (or a recompute chunk, after a preemption) of each generating sequence,
in turn; the sequences the budget leaves out go first next step. A sequence whose prompt is still being computed
waits, its missing ancestor queued for prefill."""

from __future__ import annotations

from dataclasses import dataclass

from .memory_policy import MemoryPolicy
from .plan import SampleRow, StepDraft
from .prefix_cache import Node, PrefixCache
from .request import GenerateRequest
from .work_queue import WorkQueue


@dataclass(slots=True)
class Sequence:
    request: GenerateRequest
    node: Node  # its SEQUENCE node: the prompt's last token, then each token sampled


class DecodePlanner:
    def __init__(self, cache: PrefixCache, memory: MemoryPolicy, queue: WorkQueue):
        self.cache, self.memory, self.queue = cache, memory, queue
        self.sequences: list[Sequence] = []  # in admission order, rotated when the budget runs out

    def add(self, request: GenerateRequest, node: Node):
        self.sequences.append(Sequence(request, node))

    def remove(self, request: GenerateRequest):
        self.sequences = [s for s in self.sequences if s.request is not request]

    def plan(self, draft: StepDraft) -> Node | None:
        """Add the decode chunks and sample rows to the draft; returns a node that found no pages, if any."""
        cache, blocked = self.cache, None
        for i, seq in enumerate(self.sequences):
            node = seq.node
            missing = cache.missing_ancestor(node)
            if missing is not None:  # its prompt is still being computed (or was preempted)
                if id(missing) not in draft.planned:
                    self.queue.push(missing)
                continue
            span = cache.span(node)
            n = min(span.length - span.done, draft.budget)
            if n <= 0:  # the budget is spent: the sequences left out go first next step
                self.sequences = self.sequences[i:] + self.sequences[:i]
                break
            if not self.memory.room(node, span.done + n, draft.protected, may_preempt=True):
                blocked = blocked or node
                continue
            chunk = draft.add_chunk(cache, node, span, n)
            if span.done + n == span.length:
                fed = draft.feeds.get(id(node))  # its last token: sampled by the step in flight?
                chunk.feed = fed[1] if fed is not None and fed[0] is node else -1
                req = seq.request
                draft.add_sample(
                    SampleRow(cache.slot(node, span.end - 1), req, req.temperature, req.top_p, req.generator)
                )
                chunk.keep.add(span.length - 1)
        return blocked
