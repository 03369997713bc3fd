"""The scheduler: owns the prefix tree, the KV pages, eviction and preemption, and decides every step.

`add(request)` puts a request's tokens into the prefix tree, sharing every node another request already holds
(computed, in flight or pending). `schedule()` returns a `StepPlan`: one decode token (or a recompute chunk) of
every generating sequence first, then prefill chunks of pending nodes up to the token budget, plus the rows to
score and the sequences to sample. `postprocess(plan, ...)` records what the step computed and returns the
requests that finished.

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
from .validation import RequestError
from .kv_cache import KVCache
from .prefix_tree import Kind, Node, insert, walk
from .requests import GenerateRequest, Request, ScoreRequest, Status
from .stats import EngineStats
from .step import Chunk


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)  # tokens to compute: (node, a, b)
    # (slot, request, index, target, slot of the target token or -1 where it is not in the cache yet)
    score_rows: list[tuple[int, ScoreRequest, int, int, int]] = field(default_factory=list)
    sample_rows: list[tuple[int, GenerateRequest]] = field(default_factory=list)  # (slot of the last token, request)
    cached_hidden: torch.Tensor | None = None  # hidden states of the first score rows (cached tokens), read early

    @property
    def tokens(self) -> int:
        return sum(b - a for _, a, b in self.chunks)

    @property
    def empty(self) -> bool:
        return not (self.chunks or self.score_rows or self.sample_rows)


class Scheduler:
    def __init__(self, kv: KVCache, token_budget: int, keep_cache: bool):
        self.kv, self.budget, self.keep_cache = kv, token_budget, keep_cache
        self.root = Node([], None, 0)
        self.stack: list[Node] = []  # pending nodes, depth-first
        self.decoding: list[GenerateRequest] = []  # generating sequences, in admission order
        self.ready: list[tuple[int, ScoreRequest, int, int, int]] = []  # score rows of tokens already computed
        self.active: dict[int, Request] = {}  # requests not yet done, by id
        self.finished: list[Request] = []  # done outside a step (failed at admission, aborted): reported next step
        self.stats = EngineStats()  # its counters (the state fields and peak_kv_pages: Engine.stats)
        self.clock = 0

    # ---- admission -----------------------------------------------------------------------------------------
    def add(self, req: Request, share_prefix: bool = True):
        self.stats.requests += 1
        self.stats.tokens_requested += req.stats["tokens_requested"]
        self.active[req.id] = req
        if isinstance(req, ScoreRequest):
            self._add_score(req, share_prefix)
        else:
            self._add_generate(req)

    def _add_score(self, req: ScoreRequest, share_prefix: bool):
        full, first = req.full, len(req.context) - 1  # the hidden state at `first` predicts continuation[0]
        if share_prefix:
            reused, path = insert(self.root, full[:-1], self.kv)
        else:
            leaf = Node(full[:-1], self.root, 0, Kind.PRIVATE, key=("private", req.id))
            self.root.children[leaf.key] = leaf
            reused, path = 0, [leaf]
        req.leaf = path[-1]
        req.leaf.users += 1
        self._hit(req, reused)
        for node in reversed(path):
            for p in range(max(first, node.start), node.start + len(node)):
                off, j = p - node.start, p - first
                if off >= node.done:
                    node.rows.append((off, req, j, full[p + 1]))
                    continue
                target_slot = node.slot(off + 1) if off + 1 < node.done else -1
                known = self.kv.memo_get(target_slot, req.top_k) if target_slot >= 0 else None
                if known is not None:  # scored before: the same numbers, no LM head
                    self.stats.memo_hits += 1
                    self._record_score(req, j, *known)
                else:
                    self.ready.append((node.slot(off), req, j, full[p + 1], target_slot))
            if node.start <= first:
                break
        if not req.done:
            self._push(req.leaf)

    def _add_generate(self, req: GenerateRequest):
        ids = req.prompt
        reused, path = insert(self.root, ids[:-1], self.kv) if len(ids) > 1 else (0, [])
        parent = path[-1] if path else self.root
        node = Node([ids[-1]], parent, len(ids) - 1, Kind.SEQUENCE, key=("private", req.id),
                    capacity=req.max_tokens + 1)
        parent.children[node.key] = node
        node.users = 1
        req.leaf = node
        self._hit(req, reused)
        if parent is not self.root and not parent.complete:
            self._push(parent)
        self.decoding.append(req)

    def _hit(self, req: Request, reused: int):
        req.stats["cache_hit_tokens"] = reused
        req.stats["tokens_computed"] = req.stats["tokens_requested"] - reused
        self.stats.cache_hit_tokens += reused

    def has_pending(self) -> bool:
        return bool(self.active or self.finished)

    def count(self, status: Status) -> int:
        """Requests in flight with this status."""
        return sum(1 for r in self.active.values() if r.status is status)

    def pending_tokens(self) -> int:
        return sum(len(n) - n.done for n in walk(self.root))

    # ---- one step ------------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        for req in [r for r in self.active.values() if r.abort_requested]:
            self.drop(req, Status.ABORTED, RequestError("aborted", label=req.label))
        plan, budget = StepPlan(), self.budget
        protected: set[int] = set()  # nodes this step reads or writes: never freed while it is planned
        planned: set[int] = set()  # nodes with a chunk in this step
        if self.ready:  # read their hidden states now: this step may preempt or evict the nodes holding them
            plan.score_rows, self.ready = self.ready, []
            plan.cached_hidden = self.kv.hidden[torch.tensor([r[0] for r in plan.score_rows])]
        blocked = None
        for i, req in enumerate(self.decoding):
            node = req.leaf
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
            self._plan_chunk(plan, node, n, protected)
            planned.add(id(node))
            budget -= n
            if node.done + n == len(node):
                plan.sample_rows.append((node.slot(len(node) - 1), req))
        while self.stack and budget > 0:
            node = self.stack[-1]
            if not node.attached or node.complete:
                self.stack.pop()
                node.queued = False
                continue
            missing = next((a for a in node.ancestors() if not a.complete), None)
            if missing is not None:  # an ancestor was split off unfinished, or preempted: compute it first
                self.stack.pop()  # pushed again with the ancestor's frontier when the ancestor completes
                node.queued = False
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
            node.queued = False
            self._plan_chunk(plan, node, n, protected)
            planned.add(id(node))
            budget -= n
        if plan.empty and blocked is not None:
            self._fail_subtree(blocked)
        return plan

    def _plan_chunk(self, plan: StepPlan, node: Node, n: int, protected: set[int]):
        a, b = node.done, node.done + n
        plan.chunks.append((node, a, b))
        protected.update(id(x) for x in (node, *node.ancestors()))
        if node.rows:
            plan.score_rows += [(node.slot(off), req, j, tgt, node.slot(off + 1) if off + 1 < b else -1)
                                for off, req, j, tgt in node.rows if a <= off < b]
            node.rows = [r for r in node.rows if not a <= r[0] < b]

    def postprocess(self, plan: StepPlan, score_out=None, sample_out=None, seconds: float = 0.0,
                    lm_head_rows: int = 0) -> list[Request]:
        """Record a computed step. score_out: (logprobs, greedy, top ids, top logprobs) lists per score row, of
        which lm_head_rows went through the LM head; sample_out: (tokens, logprobs) lists per sample row. Returns
        the requests finished since the last step."""
        self.clock += 1
        self.stats.lm_head_rows += lm_head_rows
        if plan.chunks:
            self.stats.forward_steps += 1
            self.stats.tokens_computed += plan.tokens
        for node, a, b in reversed(plan.chunks):
            node.done, node.last_used = b, self.clock
            for anc in node.ancestors():
                anc.last_used = self.clock
            if node.kind is Kind.SEQUENCE:
                continue  # the decode part of every step drives it
            if node.complete:
                self._push_frontier(node)
            else:
                self._push(node)
        touched: dict[int, Request] = {}
        if score_out is not None:
            for (slot, req, j, _, target_slot), lp, greedy, top_ids, top_lps in zip(plan.score_rows, *score_out):
                touched[id(req)] = req
                req._started()
                if target_slot >= 0:
                    self.kv.memo_put(target_slot, lp, greedy, top_ids, top_lps)
                if not req.done:
                    self._record_score(req, j, lp, greedy, top_ids, top_lps)
        if sample_out is not None:
            for (slot, req), token, lp in zip(plan.sample_rows, *sample_out):
                touched[id(req)] = req
                req._started()
                if not req.done:
                    self._record_token(req, token, lp)
        for req in touched.values():
            req.stats["step_seconds"] += seconds
        done, self.finished = self.finished, []
        return done

    def _record_score(self, req: ScoreRequest, j: int, lp: float, greedy: bool, top_ids, top_lps):
        if lp != lp or lp in (float("inf"), float("-inf")):
            self.drop(req, Status.FAILED, RequestError(
                f"the log-prob of continuation token {j} is {lp}: the model produced non-finite values (corrupt or "
                "overflowing weights?)", field="continuation", label=req.label))
            return
        req.logprobs[j], req.greedy[j] = lp, greedy
        if req.top is not None:
            req.top[j] = list(zip(top_ids[:req.top_k], top_lps[:req.top_k]))
        self.stats.scored_tokens += 1
        req.pending -= 1
        if req.pending == 0:
            self._complete(req)

    def _record_token(self, req: GenerateRequest, token: int, lp: float):
        if lp != lp:
            self.drop(req, Status.FAILED, RequestError(
                "the model produced non-finite logits (corrupt or overflowing weights?)", label=req.label))
            return
        self.stats.generated_tokens += 1
        req.stats["generated_tokens"] += 1
        req.stats["tokens_computed"] += 1
        if token in req.eos:
            req.finish_reason = "eos"
        else:
            req.out.append(token)
            req.logprobs.append(lp)
            req.update_text()
            if req.finish_reason is None and len(req.out) >= req.max_tokens:
                req.finish_reason = "length"
        req.emit(token, lp)
        if req.finish_reason is not None:
            self._complete(req)
        else:
            req.leaf.tokens.append(token)

    # ---- ending requests ---------------------------------------------------------------------------------------
    def _complete(self, req: Request):
        self._detach(req)
        req._finish(Status.FINISHED)
        self.finished.append(req)

    def drop(self, req: Request, status: Status, error: UserError | None = None):
        """End a request early (aborted, or failed with its own error); everything else carries on."""
        if req.done:
            return
        if req.leaf is not None:
            for node in (req.leaf, *req.leaf.ancestors()):
                node.rows = [r for r in node.rows if r[1] is not req]
            self.ready = [r for r in self.ready if r[1] is not req]
        self._detach(req)
        req._finish(status, error)
        self.finished.append(req)

    def _detach(self, req: Request):
        del self.active[req.id]
        if isinstance(req, GenerateRequest) and req in self.decoding:
            self.decoding.remove(req)
        if req.leaf is not None:
            req.leaf.users -= 1
            self._release(req.leaf)
            req.leaf = None

    def _release(self, node: Node):
        """Free a node nothing needs any more, and then its parent if that leaves it unneeded too."""
        while node is not self.root and node.users == 0 and not node.children and not node.rows:
            if self.keep_cache and node.kind is Kind.SHARED and node.complete:
                return  # stays as cache; evicted LRU when pages run short
            node.release_pages(self.kv)
            parent = node.parent
            del parent.children[node.key]
            node = parent

    def _fail_subtree(self, node: Node):
        path = [*node.ancestors(), node]
        pages = sum(-(-len(n) // self.kv.page_size) for n in path)
        error = (f"needs {pages} pages of KV cache at once ({node.start + len(node)} tokens over {len(path)} "
                          f"prefix-tree nodes, each on pages of its own) but the cache holds {self.kv.num_pages} "
                          f"pages of {self.kv.page_size} tokens: raise kv_tokens")
        for req in list(self.active.values()):
            leaf = req.leaf
            if leaf is node or (leaf is not None and node in leaf.ancestors()):
                self.drop(req, Status.FAILED, RequestError(error, field="length", label=req.label))

    # ---- memory ------------------------------------------------------------------------------------------------
    def _push(self, node: Node):
        if not node.queued and not node.complete:
            node.queued = True
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
        while not node.ensure_slots(end, self.kv):
            if self._evict(end - node.done):
                continue
            if not may_preempt:
                return False
            keep = protected | {id(node)} | {id(a) for a in node.ancestors()}
            victims = [n for n in walk(self.root) if n.pages and id(n) not in keep]
            if not victims:
                return False
            victim = min(victims, key=lambda n: n.last_used)
            victim.release_pages(self.kv)
            self.stats.preemptions += 1
            if victim.kind is not Kind.SEQUENCE and (victim.rows or victim.users):
                self._push(victim)  # still needed by its own requests (one with children is pushed by them)
        return True

    def _evict(self, tokens: int) -> bool:
        """Free least-recently-used cached leaves (complete, unreferenced) until `tokens` fit."""
        leaves = [n for n in walk(self.root) if self._evictable(n)]
        freed = False
        while leaves and self.kv.page_size * len(self.kv.free_pages) < tokens:
            victim = min(leaves, key=lambda n: n.last_used)
            leaves.remove(victim)
            parent = victim.parent
            victim.release_pages(self.kv)
            del parent.children[victim.key]
            self.stats.evicted_nodes += 1
            freed = True
            if parent is not self.root and self._evictable(parent):
                leaves.append(parent)
        return freed

    @staticmethod
    def _evictable(n: Node) -> bool:
        return (n.kind is Kind.SHARED and n.complete and n.users == 0 and not n.children and not n.rows
                and not n.queued)

    def check_pages(self):
        """Reference counts equal the nodes holding each page; no page leaked or freed twice (tests call it)."""
        self.kv.check([n.pages for n in walk(self.root)])
