"""The engine's declared interfaces (typing.Protocol, checked at run time with isinstance and in
tests/test_engine_protocol.py against each implementation's signatures).

- `JobEngine`: closed jobs, what the applications call (the score command, icqs, lm-eval, the judges): `score` and
  `generate` a whole list, then `last_stats` says what that job cost; `tokenizer`, `config` and `limits` (what one
  request may hold) to prepare requests. Implemented by `Engine`, the HTTP `Client` (frontends/client.py) and
  `DistributedEngine` (frontends/ray_runner.py).
- `EngineProtocol`: the loop itself, for a front that drives it (the asyncio front, engine/async_engine.py): add
  requests and get their handles, `abort` one, `step`, `has_pending`, `stats` (counters since the engine was made).
  Implemented by `Engine`. The handles' own interface (done, wait, result(), error, add_done_callback) is the
  request's class (engine/request.py).

Validation of every request is engine/validation.py's, shared by all of them."""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, runtime_checkable

from .config import ModelConfig
from .request import Event, Request
from .results import Generation, ScoreResult, TokenEvent
from .stats import EngineStats
from .tokenizer import Tokenizer
from .validation import Limits

Text = str | Sequence[int]  # text, or token ids


@runtime_checkable
class JobEngine(Protocol):
    tokenizer: Tokenizer
    config: ModelConfig
    limits: Limits  # the vocabulary, the model's context and the KV cache's capacity (engine/validation.py)

    @property
    def max_request_tokens(self) -> int:
        """The most tokens one request may hold (limits.max_request_tokens)."""

    @property
    def last_stats(self) -> EngineStats:
        """The counters of the last score or generate call."""

    def score(
        self, requests: Sequence[tuple[Text, Text]], share_prefix: bool = True, progress: bool = False
    ) -> list[ScoreResult]:
        """log P(continuation | context) for each (context, continuation) pair; a bad request raises a
        RequestError (engine/validation.py) naming its index before any work."""

    def generate(
        self,
        prompts: Sequence[Text],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        progress: bool = False,
    ) -> list[Generation]:
        """One Generation per prompt; with a seed, prompt i samples with seed + i."""


@runtime_checkable
class EngineProtocol(JobEngine, Protocol):
    def add_score(
        self, context: Text, continuation: Text, top_k: int = 0, share_prefix: bool = True, label: str | None = None
    ) -> Request:
        """Add one score request; its handle. A request that fails validation comes back failed (its error a
        RequestError), not raised."""

    def add_score_ids(
        self,
        context: list[int],
        continuation: list[int],
        top_k: int = 0,
        share_prefix: bool = True,
        label: str | None = None,
    ) -> Request:
        """add_score for a request already encoded (encoding.encode_pairs)."""

    def add_generate(
        self,
        prompt: Text,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
        label: str | None = None,
    ) -> Request:
        """Add one generation; its handle (on_token is called in the loop's thread after every token)."""

    def abort(self, handle: Request) -> None:
        """Stop a request (it finishes ABORTED at the next step); safe from any thread."""

    def step(self) -> list[Event]:
        """One round of the loop (launch a step and read it, or the one launched before it where the engine
        overlaps); the output events recorded (engine/request.py), already consumed by their handles."""

    def has_pending(self) -> bool:
        """Whether a round has anything to do: requests in flight, or a step launched and not read yet."""

    @property
    def stats(self) -> EngineStats:
        """The counters since the engine was made, and the state now (KV pages, running, waiting); safe from any
        thread."""
