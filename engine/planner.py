"""Schedules the pending nodes of a prefix tree into forward steps: each node is computed exactly once.

The walk is depth-first (a stack), so a demo set's subtree is finished before the next demo set starts and memory
stays bounded by the tree's frontier. A step packs chunks of ready nodes (all ancestors computed) up to a token
budget. A node's pages are freed as soon as it and all its descendants are done (exact lifetimes), unless the
cache keeps it for later jobs (online mode), in which case unreferenced leaves are evicted LRU under pressure.
When pages run out anyway, a computed node is preempted (its pages freed) and recomputed when next needed."""
from __future__ import annotations

from collections.abc import Callable

from .kv_cache import KVCache
from .prefix_tree import Node
from .step import Chunk


def frontier(node: Node) -> list[Node]:
    """Pending nodes below `node` whose ancestors are all computed, in depth-first order."""
    out = []
    for child in node.children.values():
        if child.private:  # driven by the generation loop, not the planner
            continue
        if child.complete:
            out += frontier(child)
        else:
            out.append(child)
    return out


class Planner:
    def __init__(self, root: Node, kv: KVCache, token_budget: int, keep_cache: bool, stats: dict):
        self.root, self.kv, self.budget, self.keep_cache, self.stats = root, kv, token_budget, keep_cache, stats
        self.clock = 0
        self.stack: list[Node] = []

    def push(self, nodes: list[Node]):
        for n in reversed(nodes):
            if not n.queued:
                n.queued = True
                self.stack.append(n)

    def run(self, execute: Callable[[list[Chunk]], None]):
        self.push(frontier(self.root))
        while self.stack:
            chunks = self._next_step()
            execute(chunks)
            self.clock += 1
            self.stats["forward_steps"] += 1
            self.stats["tokens_computed"] += sum(b - a for _, a, b in chunks)
            self.stats["peak_kv_pages"] = max(self.stats["peak_kv_pages"], self.kv.used_pages)
            for node, a, b in reversed(chunks):
                node.done, node.last_used = b, self.clock
                for anc in node.ancestors():
                    anc.last_used = self.clock
                if node.complete:
                    node.rows = []
                    if node.children:
                        self.push(frontier(node))
                    else:
                        self._finish(node)
                else:
                    self.push([node])

    def _next_step(self) -> list[Chunk]:
        chunks, budget = [], self.budget
        while self.stack and budget > 0:
            node = self.stack[-1]
            missing = next((a for a in node.ancestors() if not a.complete), None)
            if missing is not None:  # an ancestor was preempted: recompute it first
                self.stack.pop()
                node.queued = False
                self.push([missing])
                continue
            n = min(len(node) - node.done, budget)
            if not node.ensure_slots(node.done + n, self.kv):
                if self.evict_cached(n) or (not chunks and self._preempt(node)):
                    continue
                if chunks:
                    break
                raise MemoryError(f"KV cache too small: a node of {len(node)} tokens does not fit")
            self.stack.pop()
            node.queued = False
            chunks.append((node, node.done, node.done + n))
            budget -= n
        return chunks

    def _finish(self, node: Node):
        """A node and all its descendants are done: free it (offline) or keep it as a cached leaf (online)."""
        while node is not self.root and node.complete and node.open_children == 0 and not node.cached:
            if self.keep_cache and not isinstance(node.key, tuple):
                return  # stays; marked cached when the job ends (keep_cached)
            node.release_pages(self.kv)
            parent = node.parent
            del parent.children[node.key]
            parent.open_children -= 1
            node = parent

    def make_room(self, node: Node, tokens: int) -> bool:
        """Free pages for `tokens` more tokens of `node`: evict cached leaves, else preempt."""
        return self.evict_cached(tokens) or self._preempt(node)

    def finish_private(self, node: Node):
        """A generation node is done: free it and whatever above it nothing else needs."""
        node.tokens = node.tokens[:node.done]
        self._finish(node)

    def evict_cached(self, tokens: int) -> bool:
        """Free least-recently-used cached leaves (no children, so no job depends on them)."""
        leaves = [n for n in _walk(self.root) if n.cached and not n.children]
        freed = False
        while leaves and self.kv.page_size * len(self.kv.free_pages) < tokens:
            victim = min(leaves, key=lambda n: n.last_used)
            leaves.remove(victim)
            parent = victim.parent
            victim.release_pages(self.kv)
            del parent.children[victim.key]
            parent.open_children -= 1
            self.stats["evicted_nodes"] += 1
            freed = True
            if parent.cached and not parent.children:
                leaves.append(parent)
        return freed

    def _preempt(self, wanted: Node) -> bool:
        """Free the least-recently-used computed node that `wanted` does not depend on; it is recomputed later."""
        keep = set(map(id, wanted.ancestors())) | {id(wanted)}
        victims = [n for n in _walk(self.root) if n.pages and id(n) not in keep and n.complete]
        if not victims:
            return False
        victim = min(victims, key=lambda n: n.last_used)
        victim.release_pages(self.kv)
        victim.cached = False
        self.stats["preemptions"] += 1
        return True


def keep_cached(node: Node, kv: KVCache):
    """End of a job: complete shared nodes stay in the cache for later jobs; anything else is freed."""
    for child in list(node.children.values()):
        if child.complete and not isinstance(child.key, tuple):
            child.cached = True
            keep_cached(child, kv)
        else:
            drop(child, kv)


def drop(node: Node, kv: KVCache):
    """Remove a node and its subtree from the tree, freeing their pages."""
    for child in list(node.children.values()):
        drop(child, kv)
    node.release_pages(kv)
    del node.parent.children[node.key]
    node.parent.open_children -= 1


def _walk(node: Node):
    for child in node.children.values():
        yield child
        yield from _walk(child)
