"""The prefix cache: a token-granular radix tree over token ids whose nodes own the KV pages of their tokens,
behind a small API (`PrefixCache`: match_insert / add_private / lock / unlock / reserve / touch / evict / preempt).
It alone owns the pages, the slots, the kept hidden states (the KVCache it holds) and the reference counts; the
scheduler decides what to compute and keeps its own queue and score rows, keyed by node.

A node is an edge of the radix tree: a run of tokens at absolute positions start .. start + len - 1. Its K/V (and
the final hidden state of each token, see KVCache above) sit at `slots` (one cache slot per token) in pages it
allocated itself. A split cuts a node in two wherever its computed part ends; the page holding the cut is then
shared by reference count, each half writing only its own slots.

Node kinds are explicit (`Kind`): only SHARED nodes are found by a lookup; PRIVATE and SEQUENCE nodes belong to one
request (keyed ("private", request id) in their parent).

Victims are found without walking the tree: each node's last use (the LRU clock) lives in the cache's own index,
with two heaps ordered by it: the unreferenced complete leaves that online mode keeps (`evict`), and every node
holding pages (`preempt`). A node enters a heap when it becomes a candidate (gets pages; is left unlocked as cache);
using it costs no heap work: its entry keeps the older time, and a popped entry whose node was used since is pushed
again with the node's time now (times only grow, so the first entry popped with its node's current time is the
least recently used candidate).

The pages under the tree (`KVCache`, first in this file): the paged KV cache: fixed-size pages with checked reference counts.

Per layer, K and V are [num_pages * page_size, Hkv, D]; a token's K/V live at slot = page * page_size + offset.
Beside them, `hidden` [num_pages * page_size, hidden_size] keeps the final (normed) hidden state of each computed
token that a request asked for when it was computed (`has_hidden` says which: the model's last layer runs its
o-projection and MLP on those rows only), so that a later request scores a continuation of a cached prefix (or asks
its log-probs again) with the LM head alone, without recomputing the layers (a request that needs a state that was
not kept computes its continuation's positions anew: Scheduler._add_score); and `memo` keeps, per slot, what
scoring that token computed (its log-prob given its prefix, whether it was the argmax, the top k), so that asking
again costs nothing. Pages are allocated per prefix-tree node and shared by reference count when a node is split; a
double free or a reference to a free page raises at once."""
from __future__ import annotations

import enum
import heapq
import itertools
import os
from collections.abc import Callable

import torch

from .config import ModelConfig
from .errors import UserError


# ---- the paged KV cache ------------------------------------------------------------------------------------
class PageError(AssertionError):
    """A page reference-count rule was broken (double free, incref of a free page, leak): an engine bug."""


def memory_bytes(device) -> int | None:
    """The memory a cache on `device` can use at most: the GPU's total memory, or the machine's physical memory
    (the CPU cache is allocated lazily, but a cache larger than the memory cannot be filled); None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(config: ModelConfig, tokens: int, dtype: torch.dtype, device) -> None:
    """A one-line UserError (before anything is allocated) when a cache of `tokens` tokens (K, V and the hidden
    states kept per slot) cannot fit in the device's memory."""
    per_token = (2 * config.num_layers * config.num_kv_heads * config.head_dim + config.hidden_size) * \
        torch.empty((), dtype=dtype).element_size()
    limit = memory_bytes(device)
    if limit is not None and tokens * per_token > limit:
        raise UserError(f"kv_tokens={tokens:,} needs {tokens * per_token / 2**30:,.1f} GiB of KV cache "
                        f"({per_token:,} bytes a token), more than the {limit / 2**30:,.1f} GiB of memory of "
                        f"{torch.device(device)}; lower --kv-tokens")


class KVCache:
    def __init__(self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device):
        self.num_pages, self.page_size = num_pages, page_size
        check_fits(config, num_pages * page_size, dtype, device)
        shape = (config.num_layers, num_pages * page_size, config.num_kv_heads, config.head_dim)
        # empty, not zeros: a slot is read only after its K/V were written, and untouched pages cost no memory
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.hidden = torch.empty(num_pages * page_size, config.hidden_size, dtype=dtype, device=device)
        self.has_hidden = torch.zeros(num_pages * page_size, dtype=torch.bool, device=device)
        # absolute position of the token at each slot, written with its K/V: sliding-window layers mask by it
        self.positions = (torch.empty(num_pages * page_size, dtype=torch.int64, device=device)
                          if config.sliding_window else None)
        self.refcount = [0] * num_pages
        self.epoch = [0] * num_pages  # bumped each time a page is handed out: older memo entries are stale
        self.memo: dict[int, tuple] = {}  # slot -> (epoch, logprob, is_greedy, top ids, top logprobs)
        self.free_pages = list(range(num_pages - 1, -1, -1))  # pop() hands out low pages first
        self.peak_used = 0  # the most pages held at once since the last reset_peak()

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self.free_pages)

    def reset_peak(self) -> int:
        """Start a new peak from the pages held now; returns the peak before."""
        peak, self.peak_used = self.peak_used, self.used_pages
        return peak

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages (refcount 1), or None when fewer than n are free."""
        if n > len(self.free_pages):
            return None
        pages = [self.free_pages.pop() for _ in range(n)]
        for p in pages:
            if self.refcount[p] != 0:
                raise PageError(f"page {p} handed out while still referenced ({self.refcount[p]})")
            self.refcount[p] = 1
            self.epoch[p] += 1
        self.peak_used = max(self.peak_used, self.used_pages)
        return pages

    def incref(self, pages: list[int]):
        for p in pages:
            if self.refcount[p] <= 0:
                raise PageError(f"incref of free page {p}")
            self.refcount[p] += 1

    def release(self, pages: list[int]):
        for p in pages:
            if self.refcount[p] <= 0:
                raise PageError(f"double free of page {p}")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self.free_pages.append(p)

    def write_hidden(self, slots: torch.Tensor, rows: torch.Tensor, hidden: torch.Tensor):
        """The tokens just computed at `slots`: keep the final hidden states `hidden` of those at `rows` (indices
        into slots); the others have none."""
        kept = slots[rows]
        self.has_hidden[slots] = False
        self.has_hidden[kept] = True
        self.hidden[kept] = hidden

    def hidden_kept(self, slots: list[int]) -> bool:
        """Whether every one of these computed tokens' final hidden states is kept."""
        return not slots or bool(self.has_hidden[torch.tensor(slots, device=self.has_hidden.device)].all())

    def read_hidden(self, slots: list[int]) -> torch.Tensor:
        """The kept hidden states at these slots (a copy: later steps may reuse the slots)."""
        return self.hidden[torch.tensor(slots, dtype=torch.long, device=self.hidden.device)]

    def memo_get(self, slot: int, top_k: int):
        """(logprob, is_greedy, top ids, top logprobs) of the token at `slot` given its prefix, if scored since
        its page was handed out with at least top_k alternatives; else None."""
        entry = self.memo.get(slot)
        if entry is None or entry[0] != self.epoch[slot // self.page_size]:
            return None
        if top_k and (entry[3] is None or len(entry[3]) < top_k):
            return None
        return entry[1:]

    def memo_put(self, slot: int, logprob: float, greedy: bool, top_ids, top_lps):
        self.memo[slot] = (self.epoch[slot // self.page_size], logprob, greedy, top_ids, top_lps)

    def check(self, owners: list[list[int]]):
        """Every page's refcount equals the number of owners listing it, and the free list holds exactly the
        unreferenced pages (catches leaks as well as double frees)."""
        expect = [0] * self.num_pages
        for pages in owners:
            for p in pages:
                expect[p] += 1
        if expect != self.refcount:
            bad = next(p for p in range(self.num_pages) if expect[p] != self.refcount[p])
            raise PageError(f"page {bad}: refcount {self.refcount[bad]}, owned by {expect[bad]} node(s)")
        if sorted(self.free_pages) != [p for p in range(self.num_pages) if expect[p] == 0]:
            raise PageError("the free list does not hold exactly the unreferenced pages")

    def bytes_per_token(self) -> int:
        return 2 * self.k[:, :1].numel() * self.k.element_size() + self.hidden[:1].numel() * self.hidden.element_size()


# ---- the radix tree over the pages ------------------------------------------------------------------------
class Kind(enum.Enum):
    SHARED = "shared"  # the radix tree proper: found by later requests, kept as cache in online mode
    PRIVATE = "private"  # one request's tokens, scored without prefix sharing
    SEQUENCE = "sequence"  # a generating sequence: its prompt's last token, then each token it samples


class Node:
    __slots__ = ("tokens", "parent", "start", "kind", "key", "children", "pages", "page_offset", "slots", "done",
                 "users")

    def __init__(self, tokens: list[int], parent: "Node | None", start: int, kind: Kind = Kind.SHARED,
                 key=None, capacity: int | None = None):
        self.tokens, self.parent, self.start, self.kind = tokens, parent, start, kind
        self.key = key if key is not None else (tokens[0] if tokens else None)  # this node's key in parent.children
        self.children: dict = {}  # SHARED children by first token; the others by ("private", request id)
        self.pages: list[int] = []
        self.page_offset = 0  # offset of tokens[0] inside pages[0]
        self.slots = torch.empty(capacity or len(tokens), dtype=torch.long)
        self.done = 0  # tokens whose K/V (and the hidden states asked for) are in the cache
        self.users = 0  # locks: requests whose last node this is (they keep it, and so its ancestors, alive)

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
        upper.slots, upper.done = self.slots[:m].clone(), min(self.done, m)
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


def walk(node: Node):
    for child in list(node.children.values()):
        yield child
        yield from walk(child)


class PrefixCache:
    """The radix tree and the pages under it. Requests lock the node they end at (and so its ancestors); with
    `keep`, complete SHARED leaves nobody locks stay as cache until `evict` needs their pages."""

    def __init__(self, kv: KVCache, keep: bool):
        self.kv, self.keep = kv, keep
        self.root = Node([], None, 0)
        self.clock = 0
        self.last_used: dict[Node, int] = {}  # the LRU clock of every node in the tree
        self._evictable: list[tuple[int, int, Node]] = []  # (last use, order, node) of kept unlocked leaves
        self._holding: list[tuple[int, int, Node]] = []  # (last use, order, node) of nodes holding pages
        self._order = itertools.count()

    # ---- lookup and insertion -----------------------------------------------------------------------------------
    def _match(self, seq: list[int]):
        """(node, m) for each SHARED node on the path of a sequence of input tokens: the node holds seq's tokens
        from its start, m of them (only the last one yielded may hold fewer than all its tokens)."""
        node, pos = self.root, 0
        while pos < len(seq):
            child = node.children.get(seq[pos])
            if child is None:
                return
            m = common_prefix(child.tokens, seq[pos:])
            whole = m == len(child)
            yield child, m
            if not whole:
                return
            node, pos = child, pos + m

    def match_insert(self, seq: list[int], on_split: Callable[[Node, Node, int], None]) -> tuple[int, list[Node]]:
        """Insert a sequence of input tokens as SHARED nodes, reusing every node (computed, being computed or
        pending) that holds a prefix of it. Returns (tokens whose K/V are already computed, the nodes of the path
        from the root's child to the last token). on_split(upper, lower, m) after a node is cut after m tokens
        (lower is the node that was there, now its tail)."""
        node, pos, reused, path = self.root, 0, 0, []
        for child, m in self._match(seq):
            if m < len(child):
                lower, child = child, child.split(m, self.kv)
                self.last_used[child] = self.last_used[lower]
                if child.pages:
                    self._push(self._holding, child)
                on_split(child, lower, m)
            reused += child.done
            node, pos = child, pos + m
            path.append(child)
        if pos < len(seq):
            path.append(self._attach(Node(seq[pos:], node, pos)))
        return reused, path

    def hidden_kept(self, seq: list[int], first: int) -> bool:
        """Whether every token of seq from position `first` on that is already computed has its final hidden
        state kept (read-only: nothing is split or inserted)."""
        slots = []
        for node, m in self._match(seq):
            lo, hi = max(first - node.start, 0), min(m, node.done)
            slots += node.slots[lo:hi].tolist() if lo < hi else []
        return self.kv.hidden_kept(slots)

    def add_private(self, parent: Node, tokens: list[int], start: int, kind: Kind, key, capacity: int | None = None
                    ) -> Node:
        """A node of one request's own (PRIVATE: scored without sharing; SEQUENCE: a generating sequence)."""
        return self._attach(Node(tokens, parent, start, kind, key=key, capacity=capacity))

    def _attach(self, node: Node) -> Node:
        node.parent.children[node.key] = node
        self.last_used[node] = self.clock
        return node

    # ---- references -----------------------------------------------------------------------------------------------
    def lock(self, node: Node):
        node.users += 1

    def unlock(self, node: Node):
        """Drop one lock; free the node if nothing needs it any more, then its parent if that leaves it unneeded
        too. With `keep`, a complete SHARED node stays as cache instead (and becomes evictable)."""
        node.users -= 1
        while node is not self.root and node.users == 0 and not node.children:
            if self.keep and node.kind is Kind.SHARED and node.complete:
                self._push(self._evictable, node)
                return
            parent = node.parent
            self._remove(node)
            node = parent

    def _remove(self, node: Node):
        node.release_pages(self.kv)
        del node.parent.children[node.key]
        del self.last_used[node]

    # ---- pages and the LRU clock ------------------------------------------------------------------------------------
    def reserve(self, node: Node, end: int) -> bool:
        """Pages so that node's tokens [0, end) have slots; False (nothing allocated) when the pool is short."""
        had = bool(node.pages)
        if not node.ensure_slots(end, self.kv):
            return False
        if not had and node.pages:
            self._push(self._holding, node)
        return True

    def computed(self, node: Node, end: int):
        """The node's tokens up to `end` are in the cache now; it and its ancestors were used at this tick."""
        node.done = end
        last_used, now = self.last_used, self.clock
        last_used[node] = now
        for n in node.ancestors():
            last_used[n] = now

    def extend(self, node: Node, token: int):
        """A generating sequence's new token (its slot was reserved with the node's capacity)."""
        node.tokens.append(token)

    def tick(self):
        self.clock += 1

    def free_tokens(self) -> int:
        return self.kv.page_size * len(self.kv.free_pages)

    def evict(self, tokens: int) -> int:
        """Free least-recently-used cached leaves (complete, unlocked) until `tokens` fit; returns how many."""
        evicted = 0
        while self.free_tokens() < tokens:
            victim = self._pop(self._evictable, self._is_evictable)
            if victim is None:
                break
            parent = victim.parent
            self._remove(victim)
            evicted += 1
            if parent is not self.root and self._is_evictable(parent):
                self._push(self._evictable, parent)
        return evicted

    def preempt(self, keep: set[int]) -> Node | None:
        """Free the pages of the least recently used node holding pages whose id is not in `keep`; the node stays in
        the tree, to be computed again when needed. None when there is no such node."""
        skipped, victim = [], None
        while True:
            entry = self._pop_entry(self._holding, lambda n: bool(n.pages))
            if entry is None:
                break
            if id(entry[2]) in keep:
                skipped.append(entry)
                continue
            victim = entry[2]
            break
        for entry in skipped:
            heapq.heappush(self._holding, entry)
        if victim is not None:
            victim.release_pages(self.kv)
        return victim

    def _is_evictable(self, n: Node) -> bool:
        return (n.kind is Kind.SHARED and n.complete and n.users == 0 and not n.children
                and n.parent is not None and n.parent.children.get(n.key) is n)

    def _push(self, heap: list, node: Node):
        heapq.heappush(heap, (self.last_used[node], next(self._order), node))
        if len(heap) > 64 + 4 * len(self.last_used):  # mostly entries of removed nodes, or repeats: one per node
            kept = {}
            for entry in heap:
                if entry[2] in self.last_used:
                    kept[entry[2]] = entry
            heap[:] = list(kept.values())
            heapq.heapify(heap)

    def _pop_entry(self, heap: list, valid) -> tuple | None:
        """The entry of the least recently used node that is `valid`; entries of removed or invalid nodes are
        dropped (a node re-enters when it becomes a candidate again), those of nodes used since are pushed again."""
        while heap:
            entry = heapq.heappop(heap)
            n = entry[2]
            stamp = self.last_used.get(n)
            if stamp is None or not valid(n):
                continue
            if stamp != entry[0]:
                heapq.heappush(heap, (stamp, next(self._order), n))
                continue
            return entry
        return None

    def _pop(self, heap: list, valid) -> Node | None:
        entry = self._pop_entry(heap, valid)
        return None if entry is None else entry[2]

    # ---- for tests and job sizes ---------------------------------------------------------------------------------
    def nodes(self):
        return walk(self.root)

    def check(self):
        """Reference counts equal the nodes holding each page (no page leaked or freed twice), and the victim
        indexes are complete: every node holding pages, and (with `keep`) every evictable leaf, has an entry."""
        nodes = list(walk(self.root))
        self.kv.check([n.pages for n in nodes])
        if set(self.last_used) != set(nodes):
            raise PageError("the LRU clock does not hold exactly the tree's nodes")
        holding, evictable = ({id(e[2]) for e in heap} for heap in (self._holding, self._evictable))
        for n in nodes:
            if n.pages and id(n) not in holding:
                raise PageError(f"{n} holds pages but is not in the preemption index")
            if self._is_evictable(n) and id(n) not in evictable:
                if self.keep:
                    raise PageError(f"{n} is evictable but not in the eviction index")
                raise PageError(f"{n} is unreferenced and complete but was kept without keep_cache")
