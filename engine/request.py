"""The request objects the engine's loop carries, each also the caller's handle (`Request`, `ScoreRequest`,
`GenerateRequest`: status, results as they arrive, per-request `RequestStats`), and the loop's output events, what
a step produced for one request (`Admitted`, `ScoreOut`, `TokenOut`, `StepTime`, `Finished`), which a handle takes
in `consume(event)`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .errors import UserError
from .results import Generation, ScoreResult, Status, TokenEvent


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
        self._value = None  # the result, built when the request finishes (in the loop, while the device works)
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
        return self._value

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
        if self.error is None:
            self._value = self._result()  # here, not in result(): a closed job's last read would build them all
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
