"""The scheduler: decides every step over the prefix cache (engine/prefix_cache.py, which owns the tree, the pages and
their eviction); it alone owns the per-request state of the loop.

`add(request)` puts a request's tokens into the prefix cache's tree, sharing every node another request already holds
(computed, in flight or pending). `schedule()` returns a `StepPlan`: one decode token (or a recompute chunk) of
every generating sequence first, then prefill chunks of pending nodes up to the token budget, plus the rows to
score and the sequences to sample, all dataclasses. `postprocess(plan, ...)` records what the step computed and
returns its output events (engine/requests.py: scores, tokens, finished and failed requests), each already
consumed by its request's handle: the scheduler keeps its own per-request state (the node a request keeps alive,
the queue, the score rows still to compute) and never writes into a handle.

Pending nodes wait on a depth-first stack, so a demo set's subtree is finished before the next one starts and
memory stays bounded by the tree's frontier. A node's pages are freed as soon as no request needs it (exact
lifetimes), unless the cache keeps it (online mode, `keep_cache`): then unreferenced leaves are evicted LRU when
pages run short. Prefill of new work never preempts: it waits until pages free up. A step with nothing else to do,
or a generating sequence, may preempt (free) the least recently used node it does not depend on; that node is
recomputed when next needed. A request that cannot fit even alone fails with its own UserError."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import UserError
from .prefix_cache import KVCache, Kind, Node, PrefixCache
from .requests import (Admitted, Event, Finished, GenerateRequest, Request, RequestError, ScoreOut, ScoreRequest,
                     Status, StepTime, TokenOut)
from .stats import EngineStats
from .step import Chunk


@dataclass(slots=True)
class PendingRow:
    """A score row whose position is not computed yet, kept with the node that holds the position."""
    offset: int  # the position inside the node
    request: ScoreRequest
    index: int  # which continuation token it scores
    target: int  # that token's id


@dataclass(slots=True)
class ScoreRow:
    """One continuation token to score in this step: the hidden state at `slot` predicts `target`."""
    slot: int
    request: ScoreRequest
    index: int
    target: int
    target_slot: int  # the cache slot of the target token (its log-prob is memoized there), -1 if not in the cache


@dataclass(slots=True)
class SampleRow:
    """One generating sequence to sample a token for: the hidden state at `slot` is its last token's."""
    slot: int
    request: GenerateRequest


@dataclass
class ScoreOutput:
    """What the LM head computed for a step's score rows, one entry per row."""
    logprobs: list[float]
    greedy: list[bool]
    top_ids: list  # per row: the top token ids, or None without top_k
    top_logprobs: list
    lm_head_rows: int  # rows that went through the LM head (rows asking the same (slot, target) count once)


@dataclass
class SampleOutput:
    """The sampled token and its log-prob per sample row."""
    tokens: list[int]
    logprobs: list[float]


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)  # tokens to compute
    score_rows: list[ScoreRow] = field(default_factory=list)
    sample_rows: list[SampleRow] = field(default_factory=list)
    cached_hidden: torch.Tensor | None = None  # hidden states of the first score rows (cached tokens), read early

    @property
    def tokens(self) -> int:
        return sum(c.end - c.start for c in self.chunks)

    @property
    def attention_keys(self) -> int:
        """(query, key) pairs of a layer's causal attention over the chunks: a token at position p sees p + 1 keys."""
        return sum((c.end - c.start) * (c.node.start + 1) + (c.end - c.start) * (c.start + c.end - 1) // 2
                   for c in self.chunks)

    @property
    def empty(self) -> bool:
        return not (self.chunks or self.score_rows or self.sample_rows)


class Scheduler:
    def __init__(self, kv: KVCache, token_budget: int, keep_cache: bool):
        self.kv, self.budget = kv, token_budget
        self.cache = PrefixCache(kv, keep_cache)
        self.stack: list[Node] = []  # pending nodes, depth-first
        self.queued: set[Node] = set()  # the nodes on the stack
        self.rows: dict[Node, list[PendingRow]] = {}  # score rows waiting for a node's positions to be computed
        self.decoding: list[GenerateRequest] = []  # generating sequences, in admission order
        self.ready: list[ScoreRow] = []  # score rows of tokens already computed
        self.active: dict[int, Request] = {}  # requests not yet done, by id
        self.leaf: dict[int, Node] = {}  # request id -> the prefix-tree node it keeps alive (and so its ancestors)
        self.events: list[Event] = []  # output events since the last step returned them
        self.stats = EngineStats()  # its counters (the state fields and peak_kv_pages: Engine.stats)

    # ---- admission -----------------------------------------------------------------------------------------
    def add(self, req: Request, share_prefix: bool = True):
        self.stats.requests += 1
        self.stats.tokens_requested += req.stats.tokens_requested
        self.active[req.id] = req
        if isinstance(req, ScoreRequest):
            self._add_score(req, share_prefix)
        else:
            self._add_generate(req)

    def _add_score(self, req: ScoreRequest, share_prefix: bool):
        full, first = req.full, len(req.context) - 1  # the hidden state at `first` predicts continuation[0]
        if share_prefix and self.cache.hidden_kept(full[:-1], first):
            reused, path = self.cache.match_insert(full[:-1], self._split)
        elif share_prefix:  # some of its positions were computed without their hidden states: share the context
            # before them and compute the rest anew, in a node of its own
            reused, path = self.cache.match_insert(full[:first], self._split)
            parent = path[-1] if path else self.cache.root
            path.append(self.cache.add_private(parent, full[first:-1], first, Kind.PRIVATE, key=("private", req.id)))
        else:
            leaf = self.cache.add_private(self.cache.root, full[:-1], 0, Kind.PRIVATE, key=("private", req.id))
            reused, path = 0, [leaf]
        leaf = self.leaf[req.id] = path[-1]
        self.cache.lock(leaf)
        self._hit(req, reused)
        for node in reversed(path):
            for p in range(max(first, node.start), node.start + len(node)):
                off, j = p - node.start, p - first
                if off >= node.done:
                    self.rows.setdefault(node, []).append(PendingRow(off, req, j, full[p + 1]))
                    continue
                target_slot = node.slot(off + 1) if off + 1 < node.done else -1
                known = self.kv.memo_get(target_slot, req.top_k) if target_slot >= 0 else None
                if known is not None:  # scored before: the same numbers, no LM head
                    self.stats.memo_hits += 1
                    self._record_score(req, j, *known)
                else:
                    self.ready.append(ScoreRow(node.slot(off), req, j, full[p + 1], target_slot))
            if node.start <= first:
                break
        if req.id in self.active:
            self._push(leaf)

    def _add_generate(self, req: GenerateRequest):
        ids = req.prompt
        reused, path = self.cache.match_insert(ids[:-1], self._split) if len(ids) > 1 else (0, [])
        parent = path[-1] if path else self.cache.root
        node = self.cache.add_private(parent, [ids[-1]], len(ids) - 1, Kind.SEQUENCE, key=("private", req.id),
                                      capacity=req.max_tokens + 1)
        self.cache.lock(node)
        self.leaf[req.id] = node
        self._hit(req, reused)
        if parent is not self.cache.root and not parent.complete:
            self._push(parent)
        self.decoding.append(req)

    def _split(self, upper: Node, lower: Node, m: int):
        """The cache cut `lower` after m tokens: rows at the cut-off positions go with them to `upper`."""
        rows = self.rows.pop(lower, None)
        if rows:
            above = [r for r in rows if r.offset < m]
            below = [r for r in rows if r.offset >= m]
            for r in below:
                r.offset -= m
            if above:
                self.rows[upper] = above
            if below:
                self.rows[lower] = below

    def _hit(self, req: Request, reused: int):
        self._emit(Admitted(req, reused))
        self.stats.cache_hit_tokens += reused

    def _emit(self, event: Event) -> bool:
        """Hand an event to its request (True: that completes the request's results), and keep it for the step."""
        self.events.append(event)
        return event.request.consume(event)

    def has_pending(self) -> bool:
        return bool(self.active or self.events)

    def count(self, status: Status) -> int:
        """Requests in flight with this status."""
        return sum(1 for r in self.active.values() if r.status is status)

    def pending_tokens(self) -> int:
        return sum(len(n) - n.done for n in self.cache.nodes())

    # ---- one step ------------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        for req in [r for r in self.active.values() if r.abort_requested]:
            self.drop(req, Status.ABORTED, RequestError("aborted", label=req.label))
        plan, budget = StepPlan(), self.budget
        protected: set[int] = set()  # nodes this step reads or writes: never freed while it is planned
        planned: set[int] = set()  # nodes with a chunk in this step
        if self.ready:  # read their hidden states now: this step may preempt or evict the nodes holding them
            plan.score_rows, self.ready = self.ready, []
            plan.cached_hidden = self.kv.read_hidden([r.slot for r in plan.score_rows])
        blocked = None
        for i, req in enumerate(self.decoding):
            node = self.leaf[req.id]
            missing = next((a for a in node.ancestors() if not a.complete), None)
            if missing is not None:  # its prompt is still being computed (or was preempted)
                if id(missing) not in planned:
                    self._push(missing)
                continue
            n = min(len(node) - node.done, budget)
            if n <= 0:  # the budget is spent: the sequences left out go first next step
                self.decoding = self.decoding[i:] + self.decoding[:i]
                break
            if not self._room(node, node.done + n, protected, may_preempt=True):
                self.stats.kv_waits += 1
                blocked = blocked or node
                continue
            chunk = self._plan_chunk(plan, node, n, protected)
            planned.add(id(node))
            budget -= n
            if node.done + n == len(node):
                plan.sample_rows.append(SampleRow(node.slot(len(node) - 1), req))
                chunk.keep.add(len(node) - 1)
        while self.stack and budget > 0:
            node = self.stack[-1]
            if not node.attached or node.complete:
                self.stack.pop()
                self.queued.discard(node)
                continue
            missing = next((a for a in node.ancestors() if not a.complete), None)
            if missing is not None:  # an ancestor was split off unfinished, or preempted: compute it first
                self.stack.pop()  # pushed again with the ancestor's frontier when the ancestor completes
                self.queued.discard(node)
                if id(missing) not in planned:
                    self._push(missing)
                continue
            n = min(len(node) - node.done, budget)
            if not self._room(node, node.done + n, protected, may_preempt=plan.empty):
                self.stats.kv_waits += 1
                if plan.empty:
                    blocked = node
                break
            self.stack.pop()
            self.queued.discard(node)
            self._plan_chunk(plan, node, n, protected)
            planned.add(id(node))
            budget -= n
        if plan.empty and blocked is not None:
            self._fail_subtree(blocked)
        return plan

    def _plan_chunk(self, plan: StepPlan, node: Node, n: int, protected: set[int]) -> Chunk:
        a, b = node.done, node.done + n
        chunk = Chunk(node, a, b)
        plan.chunks.append(chunk)
        protected.update(id(x) for x in (node, *node.ancestors()))
        rows = self.rows.get(node)
        if rows:
            now = [r for r in rows if a <= r.offset < b]
            plan.score_rows += [ScoreRow(node.slot(r.offset), r.request, r.index, r.target,
                                         node.slot(r.offset + 1) if r.offset + 1 < b else -1) for r in now]
            chunk.keep.update(r.offset for r in now)
            rows = [r for r in rows if not a <= r.offset < b]
            if rows:
                self.rows[node] = rows
            else:
                del self.rows[node]
        return chunk

    def postprocess(self, plan: StepPlan, score_out: ScoreOutput | None = None,
                    sample_out: SampleOutput | None = None, seconds: float = 0.0) -> list[Event]:
        """Record a computed step; returns the output events since the last step (each consumed by its handle)."""
        self.cache.tick()
        if plan.chunks:
            self.stats.forward_steps += 1
            self.stats.tokens_computed += plan.tokens
            self.stats.hidden_rows += sum(len(c.keep) for c in plan.chunks)
            self.stats.attention_keys += plan.attention_keys
        for chunk in reversed(plan.chunks):
            node = chunk.node
            self.cache.computed(node, chunk.end)
            if node.kind is Kind.SEQUENCE:
                continue  # the decode part of every step drives it
            if node.complete:
                self._push_frontier(node)
            else:
                self._push(node)
        touched: dict[int, Request] = {}
        if score_out is not None:
            self.stats.lm_head_rows += score_out.lm_head_rows
            for row, lp, greedy, top_ids, top_lps in zip(plan.score_rows, score_out.logprobs, score_out.greedy,
                                                          score_out.top_ids, score_out.top_logprobs):
                req = row.request
                touched[id(req)] = req
                if row.target_slot >= 0:
                    self.kv.memo_put(row.target_slot, lp, greedy, top_ids, top_lps)
                if req.id in self.active:
                    self._record_score(req, row.index, lp, greedy, top_ids, top_lps)
        if sample_out is not None:
            for row, token, lp in zip(plan.sample_rows, sample_out.tokens, sample_out.logprobs):
                req = row.request
                touched[id(req)] = req
                if req.id in self.active:
                    self._record_token(req, token, lp)
        for req in touched.values():
            self._emit(StepTime(req, seconds))
        events, self.events = self.events, []
        return events

    def _record_score(self, req: ScoreRequest, j: int, lp: float, greedy: bool, top_ids, top_lps):
        if lp != lp or lp in (float("inf"), float("-inf")):
            self.drop(req, Status.FAILED, RequestError(
                f"the log-prob of continuation token {j} is {lp}: the model produced non-finite values (corrupt or "
                "overflowing weights?)", field="continuation", label=req.label))
            return
        self.stats.scored_tokens += 1
        if self._emit(ScoreOut(req, j, lp, greedy, top_ids, top_lps)):
            self._complete(req)

    def _record_token(self, req: GenerateRequest, token: int, lp: float):
        if lp != lp:
            self.drop(req, Status.FAILED, RequestError(
                "the model produced non-finite logits (corrupt or overflowing weights?)", label=req.label))
            return
        self.stats.generated_tokens += 1
        if self._emit(TokenOut(req, token, lp)):
            self._complete(req)
        else:
            self.cache.extend(self.leaf[req.id], token)

    # ---- ending requests ---------------------------------------------------------------------------------------
    def _complete(self, req: Request):
        self._detach(req)
        self._emit(Finished(req, Status.FINISHED))

    def drop(self, req: Request, status: Status, error: UserError | None = None):
        """End a request early (aborted, or failed with its own error); everything else carries on."""
        if req.id not in self.active:
            return
        leaf = self.leaf.get(req.id)
        if leaf is not None:
            for node in (leaf, *leaf.ancestors()):
                rows = self.rows.get(node)
                if rows:
                    rows = [r for r in rows if r.request is not req]
                    if rows:
                        self.rows[node] = rows
                    else:
                        del self.rows[node]
            self.ready = [r for r in self.ready if r.request is not req]
        self._detach(req)
        self._emit(Finished(req, status, error))

    def _detach(self, req: Request):
        del self.active[req.id]
        if isinstance(req, GenerateRequest) and req in self.decoding:
            self.decoding.remove(req)
        leaf = self.leaf.pop(req.id, None)
        if leaf is not None:
            self.cache.unlock(leaf)

    def _fail_subtree(self, node: Node):
        path = [*node.ancestors(), node]
        pages = sum(-(-len(n) // self.kv.page_size) for n in path)
        error = (f"needs {pages} pages of KV cache at once ({node.start + len(node)} tokens over {len(path)} "
                          f"prefix-tree nodes, each on pages of its own) but the cache holds {self.kv.num_pages} "
                          f"pages of {self.kv.page_size} tokens: raise kv_tokens")
        for req in list(self.active.values()):
            leaf = self.leaf.get(req.id)
            if leaf is node or (leaf is not None and node in leaf.ancestors()):
                self.drop(req, Status.FAILED, RequestError(error, field="length", label=req.label))

    # ---- memory ------------------------------------------------------------------------------------------------
    def _push(self, node: Node):
        if node not in self.queued and not node.complete:
            self.queued.add(node)
            self.stack.append(node)

    def _push_frontier(self, node: Node):
        """Push the pending nodes below a node that just completed, first child on top."""
        out, todo = [], list(node.children.values())
        while todo:
            child = todo.pop(0)
            if child.kind is Kind.SEQUENCE:
                continue  # the decode part of every step drives it
            if child.complete:
                todo = list(child.children.values()) + todo
            else:
                out.append(child)
        for child in reversed(out):
            self._push(child)

    def _room(self, node: Node, end: int, protected: set[int], may_preempt: bool) -> bool:
        """Pages for node's tokens [0, end): evict cached leaves, then (if allowed) preempt."""
        while not self.cache.reserve(node, end):
            evicted = self.cache.evict(end - node.done)
            if evicted:
                self.stats.evicted_nodes += evicted
                continue
            if not may_preempt:
                return False
            victim = self.cache.preempt(protected | {id(node)} | {id(a) for a in node.ancestors()})
            if victim is None:
                return False
            self.stats.preemptions += 1
            if victim.kind is not Kind.SEQUENCE and (victim in self.rows or victim.users):
                self._push(victim)  # still needed by its own requests (one with children is pushed by them)
        return True

    def check_pages(self):
        """Reference counts equal the nodes holding each page; no page leaked or freed twice (tests call it)."""
        self.cache.check()
