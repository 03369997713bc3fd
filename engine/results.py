"""What a caller gets back from the engine: a request's `Status`, a score's `ScoreResult`, a generation's
`Generation`, and the `TokenEvent`s a stream delivers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.Enum):
    WAITING = "waiting"  # added, nothing computed for it yet
    RUNNING = "running"  # some of its tokens were in a step
    FINISHED = "finished"
    FAILED = "failed"  # its own UserError (too large, non-finite log-prob)
    ABORTED = "aborted"


@dataclass
class ScoreResult:
    logprob: float
    token_logprobs: list[float]
    num_tokens: int
    is_greedy: bool
    greedy_tokens: list[bool] = field(default_factory=list)  # per scored token: is it the argmax
    top_logprobs: list[list[tuple[int, float]]] | None = None  # with top_k > 0: (token id, log-prob), best first


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (a stop string), "eos", or "length"
    token_logprobs: list[float] = field(default_factory=list)  # per generated token, log P(token | sequence)


@dataclass
class TokenEvent:
    """One generated token as a stream delivers it (finish_reason set on the last event of a sequence)."""

    token_id: int | None
    text_delta: str
    logprob: float | None
    finish_reason: str | None = None
