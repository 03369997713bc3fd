"""The prefill work queue: the prefix-cache nodes waiting to be computed, on a depth-first stack (so a demo set's
subtree is finished before the next one starts and memory stays bounded by the tree's frontier), and the score rows
waiting for a node's positions to be computed (kept by node, at absolute positions)."""

from __future__ import annotations

from .plan import PendingRow
from .prefix_cache import Node, PrefixCache, Span, Split
from .request import Request


class WorkQueue:
    def __init__(self, cache: PrefixCache):
        self.cache = cache
        self.stack: list[Node] = []  # pending nodes, depth-first (the top is next)
        self.queued: set[Node] = set()  # the nodes on the stack
        self.rows: dict[Node, list[PendingRow]] = {}  # score rows waiting for a node's positions to be computed

    def insert(self, seq: list[int], matched=None) -> tuple[int, list[Node]]:
        """Insert a sequence into the prefix cache (`matched`: its PrefixCache.match, if walked already): (tokens
        already computed, its path); rows kept on a node the insert cut follow the cut."""
        res = self.cache.match_insert(seq, matched)
        if res.split is not None:
            self.follow(res.split)
        return res.cached, res.path

    def push(self, node: Node):
        if node not in self.queued and not self.cache.complete(node):
            self.queued.add(node)
            self.stack.append(node)

    def top(self) -> Node:
        return self.stack[-1]

    def pop(self) -> Node:
        node = self.stack.pop()
        self.queued.discard(node)
        return node

    def computed(self, node: Node, span: Span):
        """After a step computed some of a node: the rest of it next, or, complete, the pending nodes below it
        (first child on top)."""
        if not span.complete:
            self.push(node)
            return
        self.below(node)

    def below(self, node: Node):
        """The pending nodes below a node that is computed, or planned to its end in the step being planned (first
        child on top)."""
        for child in reversed(self.cache.frontier(node)):
            self.push(child)

    # ---- score rows ------------------------------------------------------------------------------------------------
    def wait(self, node: Node, row: PendingRow):
        self.rows.setdefault(node, []).append(row)

    def needs(self, node: Node) -> bool:
        """Whether score rows wait for the node's positions."""
        return node in self.rows

    def take(self, node: Node, lo: int, hi: int) -> list[PendingRow]:
        """The rows of the node at absolute positions lo .. hi - 1 (now planned), in the order they came."""
        rows = self.rows.get(node)
        if not rows:
            return []
        now = [r for r in rows if lo <= r.position < hi]
        if now:
            rest = [r for r in rows if not lo <= r.position < hi]
            if rest:
                self.rows[node] = rest
            else:
                del self.rows[node]
        return now

    def follow(self, split: Split):
        """An insert cut a node: its rows before the cut now wait on the new upper node."""
        rows = self.rows.pop(split.lower, None)
        if rows:
            above = [r for r in rows if r.position < split.at]
            below = [r for r in rows if r.position >= split.at]
            if above:
                self.rows[split.upper] = above
            if below:
                self.rows[split.lower] = below

    def forget(self, request: Request, nodes: list[Node]):
        """Drop a request's rows from these nodes (the ones its rows can wait on)."""
        for node in nodes:
            rows = self.rows.get(node)
            if rows:
                rows = [r for r in rows if r.request is not request]
                if rows:
                    self.rows[node] = rows
                else:
                    del self.rows[node]
