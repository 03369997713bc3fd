"""The memory policy: pages for a chunk. First evict cached prefixes nobody holds (least recently used first, online
mode only); then, where the step allows it, preempt (free) the least recently used node the step does not depend on.
A preempted node that requests still need goes back on the work queue, to be computed again."""

from __future__ import annotations

from dataclasses import replace

from .prefix_cache import Kind, Node, PrefixCache
from .stats import EngineStats
from .work_queue import WorkQueue


class MemoryPolicy:
    def __init__(self, cache: PrefixCache, queue: WorkQueue):
        self.cache, self.queue = cache, queue
        self.evicted_nodes = 0  # cached prefixes nobody held, evicted for pages (EngineStats has their meanings)
        self.preemptions = 0  # nodes whose pages were freed while still needed
        self.kv_waits = 0  # chunks that found no pages

    def room(self, node: Node, end: int, protected: set[int], may_preempt: bool) -> bool:
        """Pages for node's tokens [0, end); False (nothing allocated, the chunk waits) when there is no room.
        `protected`: ids of the nodes the step reads or writes, never preempted."""
        cache = self.cache
        while not cache.reserve(node, end):
            evicted = cache.evict(end - cache.span(node).done)
            if evicted:
                self.evicted_nodes += evicted
                continue
            victim = cache.preempt(protected | {id(n) for n in cache.lineage(node)}) if may_preempt else None
            if victim is None:
                self.kv_waits += 1
                return False
            self.preemptions += 1
            if cache.span(victim).kind is not Kind.SEQUENCE and (self.queue.needs(victim) or cache.locked(victim)):
                self.queue.push(victim)  # still needed by its own requests (one with children is pushed by them)
        return True

    def counted(self, stats: EngineStats) -> EngineStats:
        """A copy of `stats` with this policy's counters."""
        return replace(stats, evicted_nodes=self.evicted_nodes, preemptions=self.preemptions, kv_waits=self.kv_waits)

    def shortfall(self, node: Node) -> str:
        """Why a node that found no pages in an otherwise empty step can never fit (its requests fail with it)."""
        kv = self.cache.kv
        return (
            f"needs {self.cache.pages_needed(node)} pages of KV cache at once ({self.cache.span(node).end} tokens "
            f"over {len(self.cache.lineage(node))} prefix-tree nodes, each on pages of its own) but the cache "
            f"holds {kv.num_pages} pages of {kv.page_size} tokens: raise kv_tokens"
        )
