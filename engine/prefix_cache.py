"""The prefix cache: a token-granular radix tree over token ids whose nodes hold the KV pages of their tokens, behind
a narrow API. It alone owns the tree, the nodes' page runs (through the page store, engine/kv_cache.py), the
reference counts and the LRU clock; the scheduler decides what to compute and keeps its own queue and score rows.

Outside this module a node is an opaque handle (`Node`: every field private). Callers insert and get typed results
(`InsertResult`: the tokens already computed, the path, the node cut to make room); they ask queries (`span`,
`missing_ancestor`, `frontier`, `slot`, `chunk_source`, ...) and get read-only values (`Span`, `ChunkSource`). The
cache calls nobody back: a caller that keys state by node learns of a cut from the `Split` in the insert's result.

A node is an edge of the radix tree: a run of tokens at absolute positions start .. start + len - 1. Its K/V (and the
final hidden state of each token a request asked for, see kv_cache.py) sit at the slots of its page run. A split
cuts a node in two wherever its computed part ends; the page holding the cut is then shared by reference count.

Node kinds are explicit (`Kind`): only SHARED nodes are found by a lookup; PRIVATE and SEQUENCE nodes belong to one
request (keyed ("private", request id) in their parent).

Victims are found without walking the tree: each node's last use (the LRU clock) lives in the cache's own index,
with two heaps ordered by it: the unreferenced complete leaves that online mode keeps (`evict`), and every node
holding pages (`preempt`). A node enters a heap when it becomes a candidate (gets pages; is left unlocked as cache);
using it costs no heap work: its entry keeps the older time, and a popped entry whose node was used since is pushed
again with the node's time now (times only grow, so the first entry popped with its node's current time is the
least recently used candidate)."""

from __future__ import annotations

import enum
import heapq
import itertools
from dataclasses import dataclass

import torch

from .kv_cache import KVCache, PageError, PageRun

PENDING = -1  # a generating sequence's token sampled by a step still in flight (no token id is negative)


class Kind(enum.Enum):
    SHARED = "shared"  # the radix tree proper: found by later requests, kept as cache in online mode
    PRIVATE = "private"  # one request's tokens, scored without prefix sharing
    SEQUENCE = "sequence"  # a generating sequence: its prompt's last token, then each token it samples


class Node:
    """One edge of the radix tree; an opaque handle outside this module (its fields are read and written here only)."""

    __slots__ = ("_tokens", "_parent", "_start", "_kind", "_key", "_children", "_run", "_done", "_users")

    def __init__(
        self,
        tokens: list[int],
        parent: "Node | None",
        start: int,
        kind: Kind = Kind.SHARED,
        key=None,
        capacity: int | None = None,
    ):
        self._tokens, self._parent, self._start, self._kind = tokens, parent, start, kind
        self._key = key if key is not None else (tokens[0] if tokens else None)  # its key in the parent's children
        self._children: dict = {}  # SHARED children by first token; the others by ("private", request id)
        self._run = PageRun(capacity or len(tokens))  # its pages and the slot of each token (the page store's)
        self._done = 0  # tokens whose K/V (and the hidden states asked for) are in the cache
        self._users = 0  # locks: requests whose last node this is (they keep it, and so its ancestors, alive)

    def __len__(self):
        return len(self._tokens)

    def __repr__(self):
        return f"Node({self._kind.value}, start={self._start}, len={len(self)}, done={self._done}, users={self._users})"


@dataclass(frozen=True, slots=True)
class Span:
    """A read-only view of one node: tokens at absolute positions start .. start + length - 1, `done` of them
    computed."""

    start: int
    length: int
    done: int
    kind: Kind

    @property
    def complete(self) -> bool:
        return self.done == self.length

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True, slots=True)
class Split:
    """An insert cut `lower` (the node that was there, now its tail) at absolute position `at`; `upper` is new and
    holds the positions before it."""

    upper: Node
    lower: Node
    at: int


@dataclass(frozen=True, slots=True)
class InsertResult:
    cached: int  # tokens of the sequence whose K/V are computed already
    path: list[Node]  # the nodes from the root's child down to the one holding the last token
    split: Split | None  # the node cut so that the path ends or branches inside it (an insert cuts at most one)


@dataclass(frozen=True, slots=True)
class CachedRun:
    """Cached K/V a chunk attends to: one node's slots (`key` names the run, the same for every chunk below it),
    holding the consecutive positions from `start`."""

    key: object
    slots: torch.Tensor
    start: int


@dataclass(frozen=True, slots=True)
class ChunkSource:
    """What a step needs of a chunk (a node's tokens a .. b - 1): its tokens, the absolute position of the first, the
    slots their K/V go to, and the cached runs before them (the ancestors root first, then the node's own earlier
    tokens)."""

    tokens: list[int]
    position: int
    slots: torch.Tensor
    before: list[CachedRun]


def _common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """How many leading tokens of `a` equal b[start:]: list slices compared in C, the mismatch found by halving
    (a Python loop over a node's hundreds of tokens was the scheduler's largest cost on a big job)."""
    n = min(len(a), len(b) - start)
    if (a if n == len(a) else a[:n]) == b[start : start + n]:
        return n
    lo, hi = 0, n  # a[:lo] matches, a[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _complete(n: Node) -> bool:
    return n._done == len(n._tokens)


def _attached(n: Node) -> bool:
    return n._parent is not None and n._parent._children.get(n._key) is n


def _ancestors(n: Node) -> list[Node]:
    """Ancestors from the root's first child down to the parent (the root itself holds no tokens)."""
    chain, a = [], n._parent
    while a is not None and a._parent is not None:
        chain.append(a)
        a = a._parent
    return chain[::-1]


def walk(node: Node):
    for child in list(node._children.values()):
        yield child
        yield from walk(child)


class PrefixCache:
    """The radix tree and the pages under it. Requests lock the node they end at (and so its ancestors); with
    `keep`, complete SHARED leaves nobody locks stay as cache until `evict` needs their pages."""

    def __init__(self, kv: KVCache, keep: bool):
        self.kv, self.keep = kv, keep
        self._root = Node([], None, 0)
        self._clock = 0
        self._last_used: dict[Node, int] = {}  # the LRU clock of every node in the tree
        self._evictable: list[tuple[int, int, Node]] = []  # (last use, order, node) of kept unlocked leaves
        self._holding: list[tuple[int, int, Node]] = []  # (last use, order, node) of nodes holding pages
        self._order = itertools.count()
        self.added_tokens = 0  # tokens put into the tree as new nodes since it was made (none computed then)

    # ---- lookup and insertion -----------------------------------------------------------------------------------
    def _match(self, seq: list[int]):
        """(node, m) for each SHARED node on the path of a sequence of input tokens: the node holds seq's tokens
        from its start, m of them (only the last one yielded may hold fewer than all its tokens)."""
        node, pos = self._root, 0
        while pos < len(seq):
            child = node._children.get(seq[pos])
            if child is None:
                return
            m = _common_prefix(child._tokens, seq, pos)
            partial = m < len(child)  # decided before the yield: match_insert cuts `child` there on a partial match
            yield child, m
            if partial:
                return
            node, pos = child, pos + m

    def match(self, seq: list[int]) -> list[tuple[Node, int]]:
        """The SHARED nodes on the path of a sequence of input tokens, each with how many of seq's tokens it holds
        (read-only; only the last may hold fewer than all its tokens): what `match_insert` and `hidden_kept` read,
        walked once for both."""
        return list(self._match(seq))

    @staticmethod
    def match_prefix(matched: list[tuple[Node, int]], n: int) -> list[tuple[Node, int]]:
        """`match(seq)` cut to what `match(seq[:n])` returns, without walking again."""
        return [(node, min(m, n - node._start)) for node, m in matched if node._start < n]

    def match_insert(self, seq: list[int], matched: list[tuple[Node, int]] | None = None) -> InsertResult:
        """Insert a sequence of input tokens as SHARED nodes, reusing every node (computed, being computed or
        pending) that holds a prefix of it. `matched`: `match(seq)`, if the caller walked it already."""
        node, pos, cached, path, split = self._root, 0, 0, [], None
        for child, m in self._match(seq) if matched is None else matched:
            if m < len(child):
                lower, child = child, self._split(child, m)
                split = Split(child, lower, lower._start)
            cached += child._done
            node, pos = child, pos + m
            path.append(child)
        if pos < len(seq):
            path.append(self._attach(Node(seq[pos:], node, pos)))
        return InsertResult(cached, path, split)

    def _split(self, node: Node, m: int) -> Node:
        """Cut a SHARED node after m tokens (0 < m < len); returns the new upper node, `node` keeps the tail (so a
        request's reference to it stays valid). Works at any stage of computation: the upper part gets the computed
        tokens below the cut."""
        assert node._kind is Kind.SHARED and 0 < m < len(node)
        upper = Node(node._tokens[:m], node._parent, node._start, node._kind, key=node._key)
        upper._run, upper._done = self.kv.split(node._run, m), min(node._done, m)
        node._tokens, node._done = node._tokens[m:], max(0, node._done - m)
        node._start += m
        node._key = node._tokens[0]
        node._parent._children[upper._key] = upper
        upper._children = {node._key: node}
        node._parent = upper
        self._last_used[upper] = self._last_used[node]
        if upper._run.pages:
            self._push(self._holding, upper)
        return upper

    def hidden_kept(self, matched: list[tuple[Node, int]], first: int) -> bool:
        """Whether every token of a sequence (`matched`: its `match`) from position `first` on that is already
        computed has its final hidden state kept (read-only)."""
        if self.kv.used_pages == 0:  # nothing is computed anywhere (a closed job's adds before its first step)
            return True
        slots = []
        for node, m in matched:
            lo, hi = max(first - node._start, 0), min(m, node._done)
            slots += node._run.slots[lo:hi].tolist() if lo < hi else []
        return self.kv.hidden_kept(slots)

    def add_private(
        self, parent: Node | None, tokens: list[int], start: int, kind: Kind, key, capacity: int | None = None
    ) -> Node:
        """A node of one request's own (PRIVATE: scored without sharing; SEQUENCE: a generating sequence), below
        `parent` (None: the root)."""
        return self._attach(Node(tokens, parent or self._root, start, kind, key=key, capacity=capacity))

    def _attach(self, node: Node) -> Node:
        node._parent._children[node._key] = node
        self.added_tokens += len(node)
        self._last_used[node] = self._clock
        return node

    # ---- queries: read-only views of a node -------------------------------------------------------------------
    def span(self, node: Node) -> Span:
        return Span(node._start, len(node._tokens), node._done, node._kind)

    def complete(self, node: Node) -> bool:
        return _complete(node)

    def live(self, node: Node) -> bool:
        """Whether the node is still in the tree and has tokens to compute."""
        return _attached(node) and not _complete(node)

    def locked(self, node: Node) -> bool:
        return node._users > 0

    def missing_ancestor(self, node: Node, completing: set[int] | frozenset = frozenset()) -> Node | None:
        """The first ancestor (from the root down) whose tokens are not all computed: a split left it unfinished, or
        it was preempted, or it waits for a step. None when the node may compute. `completing`: the ids of nodes
        the step being planned computes to their end; they count as computed (a layer stores the step's K/V in
        the cache before its attention reads it, so a node may attend to a parent computed in the same step)."""
        return next((a for a in _ancestors(node) if not _complete(a) and id(a) not in completing), None)

    def lineage(self, node: Node) -> list[Node]:
        """The node and its ancestors, the node first."""
        return [node, *_ancestors(node)[::-1]]

    def frontier(self, node: Node) -> list[Node]:
        """The nodes below a complete node that have tokens to compute and no incomplete node above them short of
        it, first child first; generating sequences' own nodes left out (their decode drives them)."""
        out, todo = [], list(node._children.values())
        while todo:
            child = todo.pop(0)
            if child._kind is Kind.SEQUENCE:
                continue
            if _complete(child):
                todo = list(child._children.values()) + todo
            else:
                out.append(child)
        return out

    def slot(self, node: Node, position: int) -> int:
        """The cache slot of the token at absolute `position` of the node (which must have pages there)."""
        return int(node._run.slots[position - node._start])

    def pages_needed(self, node: Node) -> int:
        """Pages the node and its ancestors hold at once when all computed (each on pages of its own)."""
        return sum(-(-len(n) // self.kv.page_size) for n in (*_ancestors(node), node))

    def chunk_source(self, node: Node, a: int, b: int) -> ChunkSource:
        """The node's tokens a .. b - 1 as a step computes them (their slots reserved)."""
        slots = node._run.slots
        before = [CachedRun(id(n), n._run.slots[: len(n._tokens)], n._start) for n in _ancestors(node)]
        if a > 0:
            before.append(CachedRun((id(node), a), slots[:a], node._start))
        return ChunkSource(node._tokens[a:b], node._start + a, slots[a:b], before)

    # ---- references -----------------------------------------------------------------------------------------------
    def lock(self, node: Node):
        node._users += 1

    def unlock(self, node: Node):
        """Drop one lock; free the node if nothing needs it any more, then its parent if that leaves it unneeded
        too. With `keep`, a complete SHARED node stays as cache instead (and becomes evictable)."""
        node._users -= 1
        while node is not self._root and node._users == 0 and not node._children:
            if self.keep and node._kind is Kind.SHARED and _complete(node):
                self._push(self._evictable, node)
                return
            parent = node._parent
            self._remove(node)
            node = parent

    def _remove(self, node: Node):
        self._release(node)
        del node._parent._children[node._key]
        del self._last_used[node]

    def _release(self, node: Node):
        self.kv.free(node._run)
        node._done = 0

    # ---- pages and the LRU clock ------------------------------------------------------------------------------------
    def reserve(self, node: Node, end: int) -> bool:
        """Pages so that node's tokens [0, end) have slots; False (nothing allocated) when the pool is short."""
        had = bool(node._run.pages)
        if not self.kv.grow(node._run, end):
            return False
        if not had and node._run.pages:
            self._push(self._holding, node)
        return True

    def computed(self, node: Node, end: int) -> Span:
        """The node's tokens up to `end` are in the cache now; it and its ancestors were used at this tick. Returns
        the node's span now."""
        node._done = end
        last_used, now = self._last_used, self._clock
        last_used[node] = now
        for n in _ancestors(node):
            last_used[n] = now
        return self.span(node)

    def extend(self, node: Node, token: int = PENDING):
        """A generating sequence's next token (its slot was reserved with the node's capacity): PENDING while the
        step that samples it runs; `fill` sets it once read."""
        node._tokens.append(token)

    def fill(self, node: Node, token: int):
        """A generating sequence's first pending token (`extend`) is `token` (its sequence node holds at most two at
        its end: the step in flight's, and the one before it, being read)."""
        tokens = node._tokens
        i = len(tokens) - 1
        while i > 0 and tokens[i - 1] == PENDING:
            i -= 1
        if tokens[i] != PENDING:
            raise PageError(f"{node} has no pending token to fill")
        tokens[i] = token

    def tick(self):
        self._clock += 1

    def free_tokens(self) -> int:
        return self.kv.page_size * len(self.kv.free_pages)

    def evict(self, tokens: int) -> int:
        """Free least-recently-used cached leaves (complete, unlocked) until `tokens` fit; returns how many."""
        evicted = 0
        while self.free_tokens() < tokens:
            victim = self._pop(self._evictable, self._is_evictable)
            if victim is None:
                break
            parent = victim._parent
            self._remove(victim)
            evicted += 1
            if parent is not self._root and self._is_evictable(parent):
                self._push(self._evictable, parent)
        return evicted

    def preempt(self, keep: set[int]) -> Node | None:
        """Free the pages of the least recently used node holding pages whose id is not in `keep`; the node stays in
        the tree, to be computed again when needed. None when there is no such node."""
        skipped, victim = [], None
        while True:
            entry = self._pop_entry(self._holding, lambda n: bool(n._run.pages))
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
            self._release(victim)
        return victim

    def _is_evictable(self, n: Node) -> bool:
        return (
            n._kind is Kind.SHARED
            and _complete(n)
            and n._users == 0
            and not n._children
            and n._parent is not None
            and n._parent._children.get(n._key) is n
        )

    def _push(self, heap: list, node: Node):
        heapq.heappush(heap, (self._last_used[node], next(self._order), node))
        if len(heap) > 64 + 4 * len(self._last_used):  # mostly entries of removed nodes, or repeats: one per node
            kept = {}
            for entry in heap:
                if entry[2] in self._last_used:
                    kept[entry[2]] = entry
            heap[:] = list(kept.values())
            heapq.heapify(heap)

    def _pop_entry(self, heap: list, valid) -> tuple | None:
        """The entry of the least recently used node that is `valid`; entries of removed or invalid nodes are
        dropped (a node re-enters when it becomes a candidate again), those of nodes used since are pushed again."""
        while heap:
            entry = heapq.heappop(heap)
            n = entry[2]
            stamp = self._last_used.get(n)
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

    # ---- for tests ------------------------------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        """Every node of the tree, depth first."""
        return list(walk(self._root))

    def children(self, node: Node | None = None) -> list[Node]:
        """The children of a node (None: of the root), in insertion order."""
        return list((node or self._root)._children.values())

    def tokens(self, node: Node) -> list[int]:
        return list(node._tokens)

    def holds_pages(self, node: Node) -> bool:
        return bool(node._run.pages)

    def check(self):
        """Reference counts equal the nodes holding each page (no page leaked or freed twice), and the victim
        indexes are complete: every node holding pages, and (with `keep`) every evictable leaf, has an entry."""
        nodes = list(walk(self._root))
        self.kv.check([n._run.pages for n in nodes])
        if set(self._last_used) != set(nodes):
            raise PageError("the LRU clock does not hold exactly the tree's nodes")
        holding, evictable = ({id(e[2]) for e in heap} for heap in (self._holding, self._evictable))
        for n in nodes:
            if n._run.pages and id(n) not in holding:
                raise PageError(f"{n} holds pages but is not in the preemption index")
            if self._is_evictable(n) and id(n) not in evictable:
                if self.keep:
                    raise PageError(f"{n} is evictable but not in the eviction index")
                raise PageError(f"{n} is unreferenced and complete but was kept without keep_cache")
