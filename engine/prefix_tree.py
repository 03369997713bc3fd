"""Token-granular prefix tree (radix tree) over token ids; each node owns the KV pages of its tokens.

A node is an edge of the radix tree: a run of tokens at absolute positions start .. start + len - 1. Its K/V (and
the final hidden state of each token, see kv_cache.py) sit at `slots` (one cache slot per token) in pages it
allocated itself. A split cuts a node in two wherever its computed part ends; the page holding the cut is then
shared by reference count, each half writing only its own slots.

Node kinds are explicit (`Kind`): only SHARED nodes are found by a lookup; PRIVATE and SEQUENCE nodes belong to one
request (keyed ("private", request id) in their parent)."""
from __future__ import annotations

import enum

import torch

from .kv_cache import KVCache


class Kind(enum.Enum):
    SHARED = "shared"  # the radix tree proper: found by later requests, kept as cache in online mode
    PRIVATE = "private"  # one request's tokens, scored without prefix sharing
    SEQUENCE = "sequence"  # a generating sequence: its prompt's last token, then each token it samples


class Node:
    __slots__ = ("tokens", "parent", "start", "kind", "key", "children", "pages", "page_offset", "slots", "done",
                 "rows", "users", "queued", "last_used")

    def __init__(self, tokens: list[int], parent: "Node | None", start: int, kind: Kind = Kind.SHARED,
                 key=None, capacity: int | None = None):
        self.tokens, self.parent, self.start, self.kind = tokens, parent, start, kind
        self.key = key if key is not None else (tokens[0] if tokens else None)  # this node's key in parent.children
        self.children: dict = {}  # SHARED children by first token; the others by ("private", request id)
        self.pages: list[int] = []
        self.page_offset = 0  # offset of tokens[0] inside pages[0]
        self.slots = torch.empty(capacity or len(tokens), dtype=torch.long)
        self.done = 0  # tokens whose K/V (and hidden states) are in the cache
        self.rows: list = []  # the scheduler's PendingRows at this node's positions
        self.users = 0  # requests whose last node this is (they keep it, and so its ancestors, alive)
        self.queued = False  # on the scheduler's stack
        self.last_used = 0

    def __len__(self):
        return len(self.tokens)

    def __repr__(self):
        return f"Node({self.kind.value}, start={self.start}, len={len(self)}, done={self.done}, users={self.users})"

    @property
    def complete(self) -> bool:
        return self.done == len(self.tokens)

    @property
    def attached(self) -> bool:
        return self.parent is not None and self.parent.children.get(self.key) is self

    def ancestors(self) -> list["Node"]:
        """Ancestors from the root's first child down to the parent (the root itself holds no tokens)."""
        chain, n = [], self.parent
        while n is not None and n.parent is not None:
            chain.append(n)
            n = n.parent
        return chain[::-1]

    def slot(self, offset: int) -> int:
        return int(self.slots[offset])

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
        if not self.pages:
            self.page_offset = 0
        fill = min(len(base), len(self.slots) - capacity)
        self.slots[capacity:capacity + fill] = base[:fill]
        self.pages += new
        return True

    def release_pages(self, kv: KVCache):
        kv.release(self.pages)
        self.pages, self.page_offset, self.done = [], 0, 0

    def split(self, m: int, kv: KVCache) -> "Node":
        """Cut this SHARED node after m tokens (0 < m < len); returns the new upper node, this one keeps the tail
        (so a request's or the stack's reference to it stays valid). Works at any stage of computation: the
        upper part gets the computed tokens below the cut, the page holding the cut is shared by refcount."""
        assert self.kind is Kind.SHARED and 0 < m < len(self)
        ps = kv.page_size
        upper = Node(self.tokens[:m], self.parent, self.start, self.kind, key=self.key)
        upper.slots, upper.done, upper.last_used = self.slots[:m].clone(), min(self.done, m), self.last_used
        upper.rows = [r for r in self.rows if r.offset < m]
        self.rows = [r for r in self.rows if r.offset >= m]
        for r in self.rows:
            r.offset -= m
        if self.pages:
            upper.page_offset = self.page_offset
            upper.pages = self.pages[:min(len(self.pages), -(-(self.page_offset + m) // ps))]
            kv.incref(upper.pages)
            first = (self.page_offset + m) // ps
            kv.release(self.pages[:first])
            offset = (self.page_offset + m) % ps if first < len(self.pages) else 0
            self.pages, self.page_offset = self.pages[first:], offset
        self.tokens, self.slots, self.done = self.tokens[m:], self.slots[m:].clone(), max(0, self.done - m)
        self.start += m
        self.key = self.tokens[0]
        self.parent.children[upper.key] = upper
        upper.children = {self.key: self}
        self.parent = upper
        return upper


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def insert(root: Node, seq: list[int], kv: KVCache) -> tuple[int, list[Node]]:
    """Insert a sequence of input tokens as SHARED nodes, reusing every node (computed, being computed or
    pending) that holds a prefix of it. Returns (tokens whose K/V are already computed, the nodes of the path
    from the root's child to the last token)."""
    node, pos, reused, path = root, 0, 0, []
    while pos < len(seq):
        child = node.children.get(seq[pos])
        if child is None:
            leaf = Node(seq[pos:], node, pos)
            node.children[leaf.key] = leaf
            return reused, path + [leaf]
        m = common_prefix(child.tokens, seq[pos:])
        if m < len(child):
            child = child.split(m, kv)
        reused += child.done
        node, pos = child, pos + m
        path.append(child)
    return reused, path


def walk(node: Node):
    for child in list(node.children.values()):
        yield child
        yield from walk(child)
