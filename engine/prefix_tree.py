"""Token-granular prefix tree (radix tree) over token ids; each node owns the KV pages of its tokens.

A node is an edge of the radix tree: a run of tokens at absolute positions start .. start + len - 1. Its K/V sit
at `slots` (one cache slot per token) in pages it allocated itself; a child always starts on pages of its own, so
no page is ever written by two nodes (a split shares the boundary page by reference count, read-only)."""
from __future__ import annotations

import torch

from .kv_cache import KVCache


class Node:
    __slots__ = ("tokens", "parent", "start", "children", "pages", "page_offset", "slots", "done", "rows",
                 "open_children", "queued", "cached", "last_used", "key", "private")

    def __init__(self, tokens: list[int], parent: "Node | None", start: int):
        self.tokens, self.parent, self.start = tokens, parent, start
        self.children: dict = {}  # first token -> Node; ("fork", token) -> a pending node beside a cached one
        self.pages: list[int] = []
        self.page_offset = 0  # offset of tokens[0] inside pages[0]
        self.slots = torch.empty(len(tokens), dtype=torch.long)
        self.done = 0  # tokens whose K/V are in the cache
        self.rows: list[tuple[int, int, int, int]] = []  # (offset, request, index, target) still to score
        self.open_children = 0  # children not yet released
        self.queued = False
        self.cached = False  # kept in the cache after its job (online mode)
        self.last_used = 0
        self.key = tokens[0] if tokens else None  # this node's key in parent.children
        self.private = False  # a generation node, grown token by token by the generation loop

    def __len__(self):
        return len(self.tokens)

    @property
    def complete(self) -> bool:
        return self.done == len(self.tokens)

    def ancestors(self) -> list["Node"]:
        """Ancestors from the root's first child down to the parent (the root itself holds no tokens)."""
        chain, n = [], self.parent
        while n is not None and n.parent is not None:
            chain.append(n)
            n = n.parent
        return chain[::-1]

    def ensure_slots(self, end: int, kv: KVCache) -> bool:
        """Allocate pages so tokens [0, end) have slots. False (nothing allocated) when the pool is short."""
        ps = kv.page_size
        capacity = len(self.pages) * ps - self.page_offset
        if end <= capacity:
            return True
        new = kv.alloc(-(-(end - capacity) // ps))
        if new is None:
            return False
        base = torch.tensor(new, dtype=torch.long).repeat_interleave(ps) * ps + torch.arange(ps).repeat(len(new))
        fill = min(len(base), len(self.slots) - capacity)
        self.slots[capacity:capacity + fill] = base[:fill]
        self.pages += new
        return True

    def release_pages(self, kv: KVCache):
        kv.release(self.pages)
        self.pages, self.page_offset, self.done = [], 0, 0

    def split(self, m: int, kv: KVCache) -> "Node":
        """Cut this complete node after m tokens; returns the new upper node (this one keeps the tail)."""
        ps = kv.page_size
        upper = Node(self.tokens[:m], self.parent, self.start)
        upper.slots, upper.done = self.slots[:m].clone(), m
        upper.page_offset = self.page_offset
        upper.pages = self.pages[:-(-(self.page_offset + m) // ps)]
        upper.cached, upper.last_used = self.cached, self.last_used
        kv.incref(upper.pages)
        first = (self.page_offset + m) // ps
        kv.release(self.pages[:first])
        self.pages, self.page_offset = self.pages[first:], (self.page_offset + m) % ps
        self.tokens, self.slots, self.done = self.tokens[m:], self.slots[m:].clone(), self.done - m
        self.start += m
        upper.key, self.key = self.key, self.tokens[0]
        self.parent.children[upper.key] = upper
        upper.children = {self.key: self}
        upper.open_children = 1
        self.parent = upper
        return upper


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def insert(root: Node, seq: list[int], reuse_limit: int, kv: KVCache) -> tuple[int, list[Node]]:
    """Insert a sequence of input tokens. Cached (complete, from an earlier job) nodes are reused for at most
    `reuse_limit` tokens; beyond that the tokens go to pending nodes (a fork beside the cached node where the
    cache holds them but they must be recomputed because their hidden states are scored).

    Returns (tokens reused from the cache, the nodes of the path from the root's child to the last token)."""
    node, pos, reused, path = root, 0, 0, []
    while pos < len(seq):
        child = node.children.get(seq[pos])
        if child is not None and child.cached:
            m = common_prefix(child.tokens, seq[pos:], reuse_limit - pos)
            if m > 0:
                if m < len(child):
                    child = child.split(m, kv)
                reused, node, pos = reused + m, child, pos + m
                path.append(child)
                continue
            child = node.children.get(("fork", seq[pos]))
            key = ("fork", seq[pos])
        else:
            key = seq[pos]
        if child is None:
            leaf = Node(seq[pos:], node, pos)
            leaf.key = key
            node.children[key] = leaf
            node.open_children += 1
            return reused, path + [leaf]
        m = common_prefix(child.tokens, seq[pos:], len(seq))
        if m < len(child):
            child = _split_pending(child, m)
        node, pos = child, pos + m
        path.append(child)
    return reused, path


def _split_pending(node: Node, m: int) -> Node:
    """Cut a node that has no K/V yet after m tokens; returns the upper part."""
    upper = Node(node.tokens[:m], node.parent, node.start)
    upper.key, node.key = node.key, node.tokens[m]
    node.parent.children[upper.key] = upper
    upper.rows = [r for r in node.rows if r[0] < m]
    node.rows = [(o - m, *rest) for o, *rest in node.rows if o >= m]
    node.tokens, node.slots, node.start, node.parent = node.tokens[m:], node.slots[m:].clone(), node.start + m, upper
    upper.children, upper.open_children = {node.key: node}, 1
    return upper
