"""The scheduler: the lifecycle of the loop's requests and `schedule()`; it alone owns the per-request state (the node a
request keeps alive, the rows of cached tokens ready to score, the requests in flight) and never writes into a handle.
`add` puts a request's tokens into the prefix cache (engine/prefix_cache.py), sharing every node another request holds;
`schedule()` returns a `StepPlan` (engine/plan.py): the decode planner's token of every generating sequence, then the
prefill planner's chunks up to the token budget, each finding pages through the memory policy; after a step,
`advance` moves the tree and the work queue past its chunks and `record` records its results and returns its output
events (engine/request.py), each already consumed by its handle (the pipelined loop plans the next step between the
two)."""

from __future__ import annotations

import math

from kernels import TokenLogProb

from .decode_planner import DecodePlanner
from .errors import UserError
from .memory_policy import MemoryPolicy
from .plan import HeadOutput, ScoreRow, StepDraft, StepPlan
from .prefill_planner import PrefillPlanner
from .prefix_cache import Kind, Node, PrefixCache
from .request import Admitted, Event, Finished, GenerateRequest, Request, ScoreOut, ScoreRequest, StepTime, TokenOut
from .results import Status
from .score_rows import rows_of
from .stats import EngineStats
from .validation import RequestError
from .work_queue import WorkQueue


class Scheduler:
    def __init__(self, cache: PrefixCache, token_budget: int):
        self.cache, self.kv, self.budget = cache, cache.kv, token_budget
        self.counts = EngineStats()  # its counters (the memory policy's and Engine.stats' state fields apart)
        self.queue = WorkQueue(self.cache)
        self.memory = MemoryPolicy(self.cache, self.queue)
        self.decode = DecodePlanner(self.cache, self.memory, self.queue)
        self.prefill = PrefillPlanner(self.cache, self.memory, self.queue)
        self.ready: list[ScoreRow] = []  # score rows of tokens already computed
        self.active: dict[int, Request] = {}  # requests not yet done, by id
        self.leaf: dict[int, Node] = {}  # request id -> the prefix-tree node it keeps alive (and so its ancestors)
        self.events: list[Event] = []  # output events since the last step returned them
        # the generating sequences whose next token the latest advanced step (`_feeds_of`) samples, a PENDING token
        # at the end of their node (prefix_cache.extend): node id -> (node, index in that step's sample rows); the
        # next plan takes those tokens from the device (Chunk.feed) when it is launched before that step is read
        self.feeds: dict[int, tuple[Node, int]] = {}
        self._feeds_of: StepPlan | None = None

    def add(self, req: Request, share_prefix: bool = True):
        self.counts.requests += 1
        self.counts.tokens_requested += req.stats.tokens_requested
        self.active[req.id] = req
        if isinstance(req, ScoreRequest):
            self._add_score(req, share_prefix)
        else:
            self._add_generate(req)

    def _add_score(self, req: ScoreRequest, share_prefix: bool):
        full, first = req.full, len(req.context) - 1  # the hidden state at `first` predicts continuation[0]
        cache, private = self.cache, ("private", req.id)
        matched = cache.match(full[:-1]) if share_prefix else []
        if share_prefix and cache.hidden_kept(matched, first):
            reused, path = self.queue.insert(full[:-1], matched)
        elif share_prefix:  # some of its positions were computed without their hidden states: share the context
            # before them and compute the rest anew, in a node of its own (see kv_cache.py)
            reused, path = self.queue.insert(full[:first], cache.match_prefix(matched, first))
            path.append(cache.add_private(path[-1] if path else None, full[first:-1], first, Kind.PRIVATE, private))
        else:
            reused, path = 0, [cache.add_private(None, full[:-1], 0, Kind.PRIVATE, private)]
        leaf = self.leaf[req.id] = path[-1]
        cache.lock(leaf)
        self._hit(req, reused)
        rows = rows_of(cache, self.kv, req, path, first)
        for node, row in rows.pending:
            self.queue.wait(node, row)
        self.ready += rows.ready
        for j, known in rows.known:  # recorded last: a request they end (or fail) takes its other rows with it
            self.counts.memo_hits += 1
            self._record_score(req, j, known)
        if req.id in self.active:
            self.queue.push(leaf)

    def _add_generate(self, req: GenerateRequest):
        ids = req.prompt
        reused, path = self.queue.insert(ids[:-1]) if len(ids) > 1 else (0, [])
        parent = path[-1] if path else None
        node = self.cache.add_private(
            parent, [ids[-1]], len(ids) - 1, Kind.SEQUENCE, ("private", req.id), capacity=req.max_tokens + 1
        )
        self.cache.lock(node)
        self.leaf[req.id] = node
        self._hit(req, reused)
        if parent is not None:
            self.queue.push(parent)
        self.decode.add(req, node)

    def _hit(self, req: Request, reused: int):
        self._emit(Admitted(req, reused))
        self.counts.cache_hit_tokens += reused

    def _emit(self, event: Event) -> bool:
        """Hand an event to its request (True: that completes the request's results), and keep it for the step."""
        self.events.append(event)
        return event.request.consume(event)

    @property
    def stats(self) -> EngineStats:
        """A snapshot of the counters: the scheduler's and the memory policy's."""
        return self.memory.counted(self.counts)

    def has_pending(self) -> bool:
        return bool(self.active or self.events)

    def count(self, status: Status) -> int:
        """Requests in flight with this status."""
        return sum(1 for r in self.active.values() if r.status is status)

    def schedule(self, in_flight: frozenset[int] = frozenset()) -> StepPlan:
        """The next step. `in_flight`: the nodes a step launched but not yet recorded reads or writes (its
        `StepPlan.protected`), never preempted for this one."""
        for req in [r for r in self.active.values() if r.abort_requested]:
            self.drop(req, Status.ABORTED, RequestError("aborted", label=req.label))
        ready, self.ready = self.ready, []  # their hidden states read now: this step may free the nodes holding them
        draft = StepDraft(
            self.budget, ready, self.kv.read_hidden([r.slot for r in ready]) if ready else None, self.feeds
        )
        draft.protected |= in_flight
        blocked = self.decode.plan(draft)
        blocked = self.prefill.plan(draft) or blocked
        if draft.empty and blocked is not None and not in_flight:  # with a step in flight, its pages free up first
            self._fail_subtree(blocked)
        return draft.finish()

    def advance(self, plan: StepPlan):
        """The tree and the work queue after a step's chunks, before its results are read: the next step may be
        planned on it while this one runs (the device runs steps in order, so the next reads these K/V after they
        are written)."""
        self.cache.tick()
        if plan.chunks:
            self.counts.count_step(plan.tokens, sum(len(c.keep) for c in plan.chunks), plan.attention_keys)
        for chunk in reversed(plan.chunks):
            span = self.cache.computed(chunk.node, chunk.end)
            if span.kind is not Kind.SEQUENCE:  # the decode planner drives a generating sequence
                self.queue.computed(chunk.node, span)
        # each generating sequence gets its next token now, PENDING until this step is read, unless the token this
        # step samples is its last by length (its node: the prompt's last token and the tokens sampled before)
        self.feeds, self._feeds_of = {}, plan
        for i, row in enumerate(plan.sample_rows):
            leaf = self.leaf.get(row.request.id)
            if leaf is not None and self.cache.span(leaf).length < row.request.max_tokens:
                self.cache.extend(leaf)
                self.feeds[id(leaf)] = (leaf, i)

    def record(self, plan: StepPlan, head: HeadOutput, seconds: float = 0.0) -> list[Event]:
        """A step's results (advanced before): scores and tokens recorded, requests finished; returns the output
        events since the last step (each consumed by its handle)."""
        touched: dict[int, Request] = {}
        if head.score is not None:
            self.counts.lm_head_rows += head.score.lm_head_rows
            for row, scored in zip(plan.score_rows, head.score.rows):
                touched[id(row.request)] = row.request
                if row.target_slot >= 0:
                    self.kv.memo_put(row.target_slot, scored)
                if row.request.id in self.active:
                    self._record_score(row.request, row.index, scored)
        if head.sample is not None:
            for row, token, lp in zip(plan.sample_rows, head.sample.tokens, head.sample.logprobs):
                touched[id(row.request)] = row.request
                if row.request.id in self.active:
                    self._record_token(row.request, token, lp)
        for req in touched.values():
            self._emit(StepTime(req, seconds))
        if self._feeds_of is plan:  # its tokens are known now: the next plan reads them from the tree
            self.feeds, self._feeds_of = {}, None
        events, self.events = self.events, []
        return events

    def _record_score(self, req: ScoreRequest, j: int, scored: TokenLogProb):
        lp = scored.logprob
        if not math.isfinite(lp):
            why = f"the log-prob of continuation token {j} is {lp}: the model produced non-finite values"
            error = RequestError(f"{why} (corrupt or overflowing weights?)", field="continuation", label=req.label)
            return self.drop(req, Status.FAILED, error)
        self.counts.scored_tokens += 1
        if self._emit(ScoreOut(req, j, lp, scored.greedy, scored.top_ids, scored.top_logprobs)):
            self._complete(req)

    def _record_token(self, req: GenerateRequest, token: int, lp: float):
        if lp != lp:
            why = "the model produced non-finite logits (corrupt or overflowing weights?)"
            return self.drop(req, Status.FAILED, RequestError(why, label=req.label))
        self.counts.generated_tokens += 1
        if self._emit(TokenOut(req, token, lp)):
            return self._complete(req)
        self.cache.fill(self.leaf[req.id], token)  # its pending token (advance), which a later step may be computing

    def _complete(self, req: Request):
        self._detach(req)
        self._emit(Finished(req, Status.FINISHED))

    def drop(self, req: Request, status: Status, error: UserError | None = None):
        """End a request early (aborted, or failed with its own error); everything else carries on."""
        if req.id not in self.active:
            return
        leaf = self.leaf.get(req.id)
        if leaf is not None:
            self.queue.forget(req, self.cache.lineage(leaf))
            self.ready = [r for r in self.ready if r.request is not req]
        self._detach(req)
        self._emit(Finished(req, status, error))

    def _detach(self, req: Request):
        del self.active[req.id]
        if isinstance(req, GenerateRequest):
            self.decode.remove(req)
        leaf = self.leaf.pop(req.id, None)
        if leaf is not None:
            self.cache.unlock(leaf)

    def _fail_subtree(self, node: Node):
        error = self.memory.shortfall(node)
        for req in list(self.active.values()):
            leaf = self.leaf.get(req.id)
            if leaf is not None and any(n is node for n in self.cache.lineage(leaf)):
                self.drop(req, Status.FAILED, RequestError(error, field="length", label=req.label))
