"""The memory policy: pages for a chunk. First evict cached prefixes nobody holds (least recently used first, online
mode only); then, where the step allows it, preempt (free) the least recently used node the step does not depend on.
A preempted node that requests still need goes back on the work queue, to be computed again."""
from __future__ import annotations

from .prefix_cache import Kind, Node, PrefixCache
from .stats import EngineStats
from .work_queue import WorkQueue


class MemoryPolicy:
    def __init__(self, cache: PrefixCache, queue: WorkQueue, stats: EngineStats):
        self.cache, self.queue, self.stats = cache, queue, stats

    def room(self, node: Node, end: int, protected: set[int], may_preempt: bool) -> bool:
        """Pages for node's tokens [0, end); False (nothing allocated) when there is no room. `protected`: ids of
        the nodes the step reads or writes, never preempted."""
        cache = self.cache
        while not cache.reserve(node, end):
            evicted = cache.evict(end - cache.span(node).done)
            if evicted:
                self.stats.evicted_nodes += evicted
                continue
            if not may_preempt:
                return False
            victim = cache.preempt(protected | {id(n) for n in cache.lineage(node)})
            if victim is None:
                return False
            self.stats.preemptions += 1
            if cache.span(victim).kind is not Kind.SEQUENCE and (self.queue.needs(victim) or cache.locked(victim)):
                self.queue.push(victim)  # still needed by its own requests (one with children is pushed by them)
        return True

    def shortfall(self, node: Node) -> str:
        """Why a node that found no pages in an otherwise empty step can never fit (its requests fail with it)."""
        kv = self.cache.kv
        return (f"needs {self.cache.pages_needed(node)} pages of KV cache at once ({self.cache.span(node).end} tokens "
                f"over {len(self.cache.lineage(node))} prefix-tree nodes, each on pages of its own) but the cache "
                f"holds {kv.num_pages} pages of {kv.page_size} tokens: raise kv_tokens")
