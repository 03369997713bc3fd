"""Turns (context, continuation) requests into token ids, following lm-evaluation-harness's convention.

- Trailing whitespace of the context moves to the front of the continuation; the continuation's tokens are the
  tokens of encode(context + continuation) after the first len(encode(context)) tokens, so the boundary is tokenized
  as the whole string would be.
- A BOS token is prepended only when the model's tokenizer asks for one (`add_bos`); an empty context becomes
  [BOS] (or [EOS] for models without BOS), as lm-evaluation-harness does.
- Requests given as token ids are used as they are (checked against the vocabulary by the engine).

Below: the request objects the engine loop carries (status, results as they arrive, per-request stats); each
is also the caller's handle.

The checks of a request (the one validation every front uses):
One validation of a request, used by every front (Engine, the HTTP server, the score command, the Ray driver,
the lm-eval backend, icqs's length check): token ids inside the vocabulary, lengths under the model's maximum and
the KV cache's capacity (`Limits`), and the options (top_k, max_tokens, temperature, top_p, seed).

A check that fails raises `RequestError`, a UserError that carries which request (`index`, `label`) and which
field is wrong as attributes, so a front names the request its own way (an input file's line, an HTTP `param`)
without reading the message back."""

from __future__ import annotations

import enum
import math
import numbers
import threading
import time
from dataclasses import dataclass, field

from .errors import UserError
from .tokenizer import Tokenizer


# ---- the checks of a request ----------------------------------------------------------------------------
class RequestError(UserError):
    """A request that fails validation. str(): "<label>: <reason>"; `reason` is the message without the label,
    `index` the request's position in its call (None for a single request), `field` the wrong part ("context",
    "continuation", "prompt", "length", "top_k", "max_tokens", "temperature", "top_p", "seed")."""

    def __init__(self, reason: str, *, index: int | None = None, field: str | None = None, label: str | None = None):
        self.reason, self.index, self.field = reason, index, field
        self.label = label if label is not None else (f"request {index}" if index is not None else None)
        super().__init__(f"{self.label}: {reason}" if self.label else reason)

    def with_index(self, index: int) -> "RequestError":
        """The same error as the request at `index` of a call (its label kept)."""
        return RequestError(self.reason, index=index, field=self.field, label=self.label)

    def at(self, path: str, line: int) -> UserError:
        """The same error named by an input file's line instead of the request's label."""
        return UserError(self.reason, path, line)


@dataclass(frozen=True)
class Limits:
    """What bounds one request: the vocabulary, the model's context length and the KV cache's capacity in tokens
    (whole pages). A request holds at most `max_request_tokens` = the smaller of the two."""

    vocab_size: int
    max_position: int
    kv_tokens: int

    @classmethod
    def of(cls, config, kv_tokens: int, page_size: int) -> "Limits":
        """The limits of an engine with this model config and KV cache options (kv_tokens rounded up to pages)."""
        return cls(config.vocab_size, config.max_position, -(-kv_tokens // page_size) * page_size)

    @property
    def max_request_tokens(self) -> int:
        return min(self.max_position, self.kv_tokens)

    def describe(self) -> str:
        """What the limit is, for messages."""
        if self.max_position <= self.kv_tokens:
            return f"the model's maximum context length of {self.max_position}"
        return f"the KV cache of {self.kv_tokens} tokens (kv_tokens)"


def _label(index, label):
    return label if label is not None else (f"request {index}" if index is not None else None)


def check_token_ids(
    ids, vocab_size: int, *, index: int | None = None, field: str | None = None, label: str | None = None
) -> None:
    """Token ids given by a caller must name rows of the model's embedding."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(
            f"token id {bad} is outside the model's vocabulary (0..{vocab_size - 1})",
            index=index,
            field=field,
            label=_label(index, label),
        )


def check_top_k(top_k, vocab_size: int, *, index: int | None = None, label: str | None = None) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RequestError(
            f"top_k must be a non-negative integer, got {top_k!r}",
            index=index,
            field="top_k",
            label=_label(index, label),
        )
    if top_k > vocab_size:
        raise RequestError(
            f"top_k={top_k} exceeds the vocabulary ({vocab_size})",
            index=index,
            field="top_k",
            label=_label(index, label),
        )


def check_score(ctx, cont, top_k: int, limits: Limits, *, index: int | None = None, label: str | None = None) -> None:
    """A score request's token ids (context and continuation), its top_k and its length."""
    if not cont:
        raise RequestError(
            "empty continuation: nothing to score", index=index, field="continuation", label=_label(index, label)
        )
    check_token_ids(ctx, limits.vocab_size, index=index, field="context", label=label)
    check_token_ids(cont, limits.vocab_size, index=index, field="continuation", label=label)
    check_top_k(top_k, limits.vocab_size, index=index, label=label)
    check_score_length(len(ctx), len(cont), limits, index=index, label=label)


def check_score_length(
    n_context: int, n_continuation: int, limits: Limits, *, index: int | None = None, label: str | None = None
) -> None:
    n = n_context + n_continuation
    if n > limits.max_request_tokens:
        raise RequestError(
            f"{n} tokens exceed {limits.describe()} (context + continuation)",
            index=index,
            field="length",
            label=_label(index, label),
        )


def check_generate_options(
    max_tokens, temperature, top_p, seed=None, *, index: int | None = None, label: str | None = None
) -> None:
    """The options of a generation: max_tokens a non-negative integer, temperature >= 0, top_p in [0, 1] (finite
    numbers), seed an integer or None."""
    label = _label(index, label)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise RequestError(
            f"max_tokens must be a non-negative integer, got {max_tokens!r}",
            index=index,
            field="max_tokens",
            label=label,
        )
    if not _number(temperature) or not temperature >= 0:
        raise RequestError(
            f"temperature must be a number >= 0, got {temperature!r}", index=index, field="temperature", label=label
        )
    if not _number(top_p) or not 0 <= top_p <= 1:
        raise RequestError(f"top_p must be in [0, 1], got {top_p!r}", index=index, field="top_p", label=label)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed must be an integer, got {seed!r}", index=index, field="seed", label=label)


def check_generate_length(
    n_prompt: int, max_tokens: int, limits: Limits, *, index: int | None = None, label: str | None = None
) -> None:
    n = n_prompt + max_tokens
    if n > limits.max_request_tokens:
        raise RequestError(
            f"{n} tokens exceed {limits.describe()} ({n_prompt} in the prompt, max_tokens={max_tokens} to generate)",
            index=index,
            field="length",
            label=_label(index, label),
        )


def check_generate(
    ids, max_tokens, temperature, top_p, seed, limits: Limits, *, index: int | None = None, label: str | None = None
) -> None:
    """A generation request: its prompt's token ids, its options, and prompt + max_tokens against the limits."""
    check_token_ids(ids, limits.vocab_size, index=index, field="prompt", label=label)
    check_generate_options(max_tokens, temperature, top_p, seed, index=index, label=label)
    check_generate_length(len(ids), max_tokens, limits, index=index, label=label)


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)


# ---- token ids and request handles ------------------------------------------------------------------------
def with_bos(tok: Tokenizer, ids: list[int]) -> list[int]:
    """The token ids of a text as the model reads it from the start of a sequence: BOS first when the model's
    tokenizer asks for one."""
    return [tok.bos_id] + ids if tok.add_bos and tok.bos_id is not None else ids


def start_token(tok: Tokenizer) -> int:
    """The token that stands for an empty context (lm-evaluation-harness's prefix token): BOS, or EOS without one."""
    return tok.bos_id if tok.bos_id is not None else tok.eos_id


def encode_pair(tok: Tokenizer, context, continuation) -> tuple[list[int], list[int]]:
    return encode_pairs(tok, [(context, continuation)])[0]


def encode_pairs(tok: Tokenizer, requests) -> list[tuple[list[int], list[int]]]:
    """encode_pair for a whole job: each distinct context and each whole text is tokenized once, in batches."""
    pairs = []
    for i, (context, continuation) in enumerate(requests):
        if isinstance(context, str) != isinstance(continuation, str):
            raise RequestError(
                "context and continuation must both be text or both be token ids", index=i, field="continuation"
            )
        spaces = len(context) - len(context.rstrip()) if isinstance(context, str) else 0
        pairs.append((context[:-spaces], context[-spaces:] + continuation) if spaces else (context, continuation))
    texts = list(dict.fromkeys(t for c, x in pairs if isinstance(c, str) for t in (c, c + x)))
    ids = dict(zip(texts, tok.encode_batch(texts))) if texts else {}
    start = start_token(tok)
    out = []
    for i, (context, continuation) in enumerate(pairs):
        if isinstance(context, str):
            ctx = ids[context]
            cont = ids[context + continuation][len(ctx) :]
            ctx = with_bos(tok, ctx)
        else:
            ctx, cont = [int(t) for t in context], [int(t) for t in continuation]
        if not cont:
            raise RequestError("empty continuation: nothing to score", index=i, field="continuation")
        out.append((ctx or [start], cont))
    return out


def prompt_ids(tok: Tokenizer, prompt) -> list[int]:
    """A generation prompt's token ids: text encoded with BOS as the model asks, token ids as they are (checked
    against the vocabulary by engine/requests.py); an empty prompt is the start token alone."""
    ids = with_bos(tok, tok.encode(prompt)) if isinstance(prompt, str) else [int(t) for t in prompt]
    return ids or [start_token(tok)]


# ---- requests in flight ------------------------------------------------------------------------------------------
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


@dataclass
class RequestStats:
    """One request's costs and times (its handle's `stats`)."""

    added_at: float  # time.perf_counter() when it was added
    tokens_requested: int = 0  # input tokens it asks for
    cache_hit_tokens: int = 0  # of those, already computed when it came
    tokens_computed: int = 0  # the others (computed for it, or once for all the requests in flight sharing them),
    # plus one per generated token
    generated_tokens: int = 0  # tokens sampled for it (generations)
    wait_seconds: float | None = None  # from add to the first step that produced one of its results
    step_seconds: float = 0.0  # the time of the steps that did
    total_seconds: float | None = None  # from add to done


# ---- the loop's output events: what a step produced for one request ---------------------------------------------
@dataclass(slots=True)
class Admitted:
    """The request entered the scheduler; `cache_hit_tokens` of its input were already computed."""

    request: "Request"
    cache_hit_tokens: int


@dataclass(slots=True)
class ScoreOut:
    """The log-prob of continuation token `index` given everything before it."""

    request: "ScoreRequest"
    index: int
    logprob: float
    greedy: bool  # the token is the argmax
    top_ids: list[int] | None  # with top_k: the best token ids (at least k), best first
    top_logprobs: list[float] | None  # and their log-probs


@dataclass(slots=True)
class TokenOut:
    """One sampled token of a generation (an EOS token included)."""

    request: "GenerateRequest"
    token: int
    logprob: float


@dataclass(slots=True)
class StepTime:
    """A step that produced results for the request took `seconds`."""

    request: "Request"
    seconds: float


@dataclass(slots=True)
class Finished:
    """The request ended: FINISHED (all its results are in), FAILED (its own error) or ABORTED."""

    request: "Request"
    status: "Status"
    error: UserError | None = None
    finish_reason: str | None = None  # a generation ended before its first token: "length" (max_tokens=0)


Event = Admitted | ScoreOut | TokenOut | StepTime | Finished


class Request:
    """One request in the engine and the caller's handle on it: `done`, `result()`, `error`, `stats`, `abort()`.

    Its fields change only in `consume(event)`, with the events the engine's loop produces for it (in the loop's
    thread); `abort()` may be called from any thread (it takes effect at the next step)."""

    def __init__(self, rid: int, label: str):
        self.id, self.label = rid, label
        self.status = Status.WAITING
        self.error: UserError | None = None
        self.abort_requested = False
        self._done = threading.Event()
        self._callbacks = []
        self.stats = RequestStats(added_at=time.perf_counter())

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def abort(self):
        self.abort_requested = True

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self):
        """The result (ScoreResult or Generation); raises the request's UserError. Call once `done`."""
        if not self.done:
            raise RuntimeError(f"{self.label} is not done")
        if self.error is not None:
            raise self.error
        return self._result()

    def add_done_callback(self, fn):
        """fn(request) once the request is finished, failed or aborted (called in the engine's thread)."""
        if self.done:
            fn(self)
        else:
            self._callbacks.append(fn)

    def consume(self, event: Event) -> bool:
        """Take one event of the loop's for this request; True when it completes the request's results (a
        ScoreOut of its last token, the TokenOut that ends a generation), so the scheduler finishes it."""
        if type(event) is Finished:
            self._finish(event)
        elif type(event) is Admitted:
            self.stats.cache_hit_tokens = event.cache_hit_tokens
            self.stats.tokens_computed = self.stats.tokens_requested - event.cache_hit_tokens
        elif type(event) is StepTime:
            self.stats.step_seconds += event.seconds
        else:
            if self.status is Status.WAITING:
                self.status = Status.RUNNING
                self.stats.wait_seconds = time.perf_counter() - self.stats.added_at
            return self._output(event)
        return False

    def _output(self, event) -> bool:
        raise TypeError(f"{type(self).__name__} takes no {type(event).__name__}")

    def _finish(self, event: Finished):
        if self.done:
            return
        self.status, self.error = event.status, event.error
        self.stats.total_seconds = time.perf_counter() - self.stats.added_at
        self._done.set()
        for fn in self._callbacks:
            fn(self)


class ScoreRequest(Request):
    """log P(continuation | context), token by token (rows at positions len(context) - 1 ... len(full) - 2)."""

    def __init__(self, rid: int, label: str, context: list[int], continuation: list[int], top_k: int = 0):
        super().__init__(rid, label)
        self.context, self.continuation, self.top_k = context, continuation, top_k
        n = len(continuation)
        self.logprobs, self.greedy = [0.0] * n, [False] * n
        self.top: list | None = [[] for _ in range(n)] if top_k > 0 else None
        self._pending = n
        self.stats.tokens_requested = len(context) + n - 1

    @property
    def full(self) -> list[int]:
        return self.context + self.continuation

    def _output(self, event: ScoreOut) -> bool:
        j = event.index
        self.logprobs[j], self.greedy[j] = event.logprob, event.greedy
        if self.top is not None:
            self.top[j] = list(zip(event.top_ids[: self.top_k], event.top_logprobs[: self.top_k]))
        self._pending -= 1
        return self._pending == 0

    def _result(self) -> ScoreResult:
        lp = self.logprobs
        return ScoreResult(sum(lp), lp, len(lp), all(self.greedy), self.greedy, self.top)


class GenerateRequest(Request):
    def __init__(
        self,
        rid: int,
        label: str,
        prompt: list[int],
        max_tokens: int,
        temperature: float,
        top_p: float,
        generator,
        stop: list[str],
        eos: set[int],
        decode,
        on_token=None,
    ):
        super().__init__(rid, label)
        self.prompt, self.max_tokens, self.temperature, self.top_p = prompt, max_tokens, temperature, top_p
        self.generator, self.stop, self.eos, self.decode, self.on_token = generator, stop, eos, decode, on_token
        self.out: list[int] = []
        self.logprobs: list[float] = []
        self.text, self.sent = "", ""  # decoded text (stop strings), and what the stream has delivered
        self.finish_reason: str | None = None
        self.stats.tokens_requested = len(prompt)

    def _finish(self, event: Finished):
        if event.finish_reason is not None and self.finish_reason is None:
            self.finish_reason = event.finish_reason
        super()._finish(event)

    def _output(self, event: TokenOut) -> bool:
        token, lp = event.token, event.logprob
        self.stats.generated_tokens += 1
        self.stats.tokens_computed += 1
        if token in self.eos:
            self.finish_reason = "eos"
        else:
            self.out.append(token)
            self.logprobs.append(lp)
            self._update_text()
            if self.finish_reason is None and len(self.out) >= self.max_tokens:
                self.finish_reason = "length"
        self._emit(token, lp)
        return self.finish_reason is not None

    def _update_text(self):
        """Decode what was generated so far when a stop string or a stream needs the text; cut at a stop string."""
        if not (self.stop or self.on_token):
            return
        self.text = self.decode(self.out)
        cut = min((at for at in (self.text.find(s) for s in self.stop) if at >= 0), default=-1)
        if cut >= 0:
            self.text, self.finish_reason = self.text[:cut], "stop"

    def _emit(self, token: int, logprob: float):
        """After each sampled token: final text once finished, and the stream's event (its new text, holding back
        what could still turn out to be the start of a stop string or half of a UTF-8 character)."""
        if self.finish_reason in ("eos", "length"):
            self.text = self.decode(self.out)
        if self.on_token is None:
            return
        end = len(self.text)
        if self.finish_reason is None:
            end -= max((len(s) for s in self.stop), default=1) - 1
            while end > len(self.sent) and self.text[end - 1] == "\ufffd":
                end -= 1
        delta = self.text[len(self.sent) : end] if end > len(self.sent) else ""
        self.sent += delta
        self.on_token(TokenEvent(token, delta, logprob, self.finish_reason))

    def _result(self) -> Generation:
        return Generation(self.text, self.out, self.finish_reason, self.logprobs)
