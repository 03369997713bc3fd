"""The step plan: what the scheduler's planners decide for one step (`StepPlan`, built through a `StepDraft`), and what
the LM head hands back after running it (`HeadOutput`: a `ScoreOutput` and a `SampleOutput`, engine/head.py). Plain
dataclasses: the plan names prefix-cache nodes only as opaque handles (engine/prefix_cache.py), the rows by cache slot,
and carries everything the head needs (the LM head's batch of distinct score rows, each sample row's sampling
parameters), so the head reads the plan and no request."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels import TokenLogProb

from .prefix_cache import Node, PrefixCache, Span
from .request import GenerateRequest, ScoreRequest


@dataclass(slots=True)
class Chunk:
    """Tokens start..end-1 of one prefix-tree node (offsets in the node; `position`: the absolute position of the
    first), computed in one step; `keep`: the node offsets among them whose final hidden states are asked for."""

    node: Node
    start: int
    end: int
    position: int
    keep: set[int] = field(default_factory=set)
    # the chunk's last token is one the step in flight samples (prefix_cache.PENDING): its id is that step's
    # sampled token at this index (of its sample rows), taken on the device (engine/step.py); -1: a known token
    feed: int = -1


@dataclass(slots=True)
class PendingRow:
    """A score row whose position is not computed yet, kept with the node that holds the position."""

    position: int  # its absolute position in the request's sequence
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
    """One generating sequence to sample a token for: the hidden state at `slot` is its last token's, sampled with
    the request's parameters (engine/sampling.py: greedy when temperature or top_p is 0)."""

    slot: int
    request: GenerateRequest
    temperature: float
    top_p: float
    generator: torch.Generator | None  # the request's own seeded generator (None: greedy)


@dataclass
class ScoreOutput:
    """What the LM head computed for a step's score rows, one entry per row."""

    rows: list[TokenLogProb]
    lm_head_rows: int  # rows that went through the LM head (rows asking the same (slot, target) count once)


@dataclass
class SampleOutput:
    """The sampled token and its log-prob per sample row."""

    tokens: list[int]
    logprobs: list[float]


@dataclass
class HeadOutput:
    """What the LM head computed for a step (engine/head.py): None where the plan has no rows of that kind."""

    score: ScoreOutput | None = None
    sample: SampleOutput | None = None


@dataclass(frozen=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)  # tokens to compute
    score_rows: list[ScoreRow] = field(default_factory=list)
    sample_rows: list[SampleRow] = field(default_factory=list)
    cached_hidden: torch.Tensor | None = None  # hidden states of the first score rows (cached tokens), read early
    # the LM head's batch: the score rows asking distinct (slot, target), by index into score_rows (None: all are
    # distinct), and each score row's row in that batch
    head_rows: list[int] | None = None
    head_inverse: list[int] | None = None
    top_k: int = 0  # the most top-k alternatives a score row asks for: the LM head's batch computes that many
    protected: frozenset[int] = frozenset()  # ids of the nodes the step reads or writes

    @property
    def tokens(self) -> int:
        return sum(c.end - c.start for c in self.chunks)

    @property
    def attention_keys(self) -> int:
        """(query, key) pairs of a layer's causal attention over the chunks: a token at position p sees p + 1 keys."""
        return sum(
            (c.end - c.start) * (c.position - c.start + 1) + (c.end - c.start) * (c.start + c.end - 1) // 2
            for c in self.chunks
        )

    @property
    def empty(self) -> bool:
        return not (self.chunks or self.score_rows or self.sample_rows)


class StepDraft:
    """A step being planned: the planners add chunks and rows within the token budget; `protected` holds the nodes
    the step reads or writes (never freed while it is planned), `planned` those with a chunk, `completing` those
    whose chunk ends the node (the nodes below them may be planned in the same step)."""

    def __init__(
        self,
        budget: int,
        score_rows: list[ScoreRow],
        cached_hidden: torch.Tensor | None,
        feeds: dict[int, tuple[Node, int]] | None = None,
    ):
        self.budget = budget
        self.feeds = feeds or {}  # id of a sequence node whose last token is pending -> (the node, its index in
        # the sample rows of the step in flight: Chunk.feed)
        self.chunks: list[Chunk] = []
        self.score_rows = score_rows
        self.sample_rows: list[SampleRow] = []
        self.cached_hidden = cached_hidden
        self.protected: set[int] = set()
        self.planned: set[int] = set()
        self.completing: set[int] = set()  # the nodes whose chunk reaches their last token

    @property
    def empty(self) -> bool:
        return not (self.chunks or self.score_rows or self.sample_rows)

    def add_chunk(self, cache: PrefixCache, node: Node, span: Span, n: int) -> Chunk:
        """The node's next n tokens (its pages reserved), out of the budget."""
        chunk = Chunk(node, span.done, span.done + n, span.start + span.done)
        self.chunks.append(chunk)
        self.protected.update(id(x) for x in cache.lineage(node))
        self.planned.add(id(node))
        if span.done + n == span.length:
            self.completing.add(id(node))
        self.budget -= n
        return chunk

    def add_score(self, row: ScoreRow):
        self.score_rows.append(row)

    def add_sample(self, row: SampleRow):
        self.sample_rows.append(row)

    def finish(self) -> StepPlan:
        """The plan, with the LM head's batch: rows asking the same (one position's hidden state, one target:
        requests that arrived before their shared prefix was computed) go through it once."""
        first: dict[tuple[int, int], int] = {}  # (slot, target) -> its row in the LM head's batch
        pick, inverse, top_k = [], [], 0
        for i, r in enumerate(self.score_rows):
            top_k = max(top_k, r.request.top_k)
            key = (r.slot, r.target)
            if key not in first:
                first[key] = len(pick)
                pick.append(i)
            inverse.append(first[key])
        distinct = len(pick) == len(inverse)
        return StepPlan(
            self.chunks,
            self.score_rows,
            self.sample_rows,
            self.cached_hidden,
            None if distinct else pick,
            None if distinct else inverse,
            top_k,
            frozenset(self.protected),
        )
