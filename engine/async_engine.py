"""An asyncio front for the engine: one worker thread runs the loop (add -> step -> results) while coroutines
submit requests and await them, or iterate over a sequence's tokens as they are generated.

It drives the engine through its declared interface only (engine/protocol.py: add_score_ids / add_generate / abort /
step / has_pending / stats), and only from the worker thread: a coroutine posts a command into the inbox, the worker
runs it between two steps, and results come back to the event loop with call_soon_threadsafe. The event loop
never waits for a step: rather than take the engine's lock (held for a whole step) it reads a snapshot of the
engine's counters that the worker publishes (before answering calls, when it goes idle, and at most every
SNAPSHOT_SECONDS while busy); the front's own step times sit under its own lock, held for a copy. A
cancelled awaiting task (a client gone) aborts its requests in the engine; `shutdown()` lets in-flight work finish.

A step that raises is an engine bug, not a request's: every request in flight is aborted; each score request
(pure: nothing was sent for it yet) is then run again alone and fails with EngineFailure only if it fails alone
too; generations fail with EngineFailure (their tokens may have been streamed)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from .encoding import encode_pairs
from .errors import EngineFailure
from .protocol import EngineProtocol
from .request import Request
from .results import Generation, ScoreResult, TokenEvent
from .stats import EngineStats

log = logging.getLogger("engine")
SNAPSHOT_SECONDS = 0.05  # how stale the published counters may be while the loop is busy


class QueueFull(Exception):
    """`n` more requests do not fit: `in_flight` are admitted and not done, and at most `max_queue` may be. A server
    answers 503 + Retry-After, or 400 when the call alone is larger than the bound (`never_fits`)."""

    def __init__(self, n: int, in_flight: int, max_queue: int):
        self.n, self.in_flight, self.max_queue = n, in_flight, max_queue
        super().__init__(
            f"{n} requests in one call exceed the limit of {max_queue}"
            if self.never_fits
            else f"{in_flight} requests in flight, at most {max_queue}"
        )

    @property
    def never_fits(self) -> bool:
        return self.n > self.max_queue


class Permit:
    """Room for `n` engine requests in flight, taken by `AsyncEngine.admit` and held until `release()` (idempotent;
    leaving a `with` block releases too). The calls made with `permit=` draw on it instead of admitting their own
    requests, so a front that admits a whole call up front (all of it or nothing) is counted once, in the engine."""

    def __init__(self, n: int, release):
        self.n, self.taken = n, 0
        self._release = release  # the engine's: gives the room back

    def take(self, n: int) -> None:
        """n requests submitted under this permit: more than it was admitted for is a bug of the caller."""
        if self.taken + n > self.n:
            raise RuntimeError(f"{self.taken + n} requests submitted under a permit for {self.n}")
        self.taken += n

    def release(self) -> None:
        n, self.n = self.n, 0
        if n:
            self._release(n)

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(frozen=True)
class LoopStats:
    """`AsyncEngine.stats()`: the engine's counters as the worker last published them, and the front's own state."""

    engine_stats: EngineStats
    in_flight: int  # engine requests admitted (AsyncEngine.admit, or a call's own) and not done or released
    queue_depth: int  # requests submitted and not yet started (waiting for pages or for their turn)
    step_seconds: list[float]  # the latest steps' durations


@dataclass(eq=False)
class _Call:
    """One coroutine's requests in the engine (touched by the worker thread only, until `done` is set)."""

    handles: list[Request]
    on_done: object  # called in the event loop once every request is done
    retry: list | None = None  # score calls: (context ids, continuation ids, top_k) per request, to run one again
    counted: bool = True  # its requests leave the in-flight count as they finish (False: a permit holds them)
    failed: dict[int, BaseException] = field(default_factory=dict)  # index -> EngineFailure after a failed step
    left: int = 0  # requests not yet done
    done: asyncio.Future | None = None  # set in the event loop once every request is done

    def result(self, i: int):
        if i in self.failed:
            raise self.failed[i]
        return self.handles[i].result()

    def error(self, i: int) -> BaseException | None:
        return self.failed.get(i) or self.handles[i].error


class AsyncEngine:
    """The one owner of the count of engine requests in flight and of its bound, `max_queue`: every front posts
    into it. `admit(n)` takes room for a whole call up front (a Permit, or QueueFull); a call made without a permit
    admits its own requests and gives their room back as each finishes."""

    def __init__(self, engine: EngineProtocol, max_queue: int | None = None):
        self.engine, self.max_queue = engine, max_queue
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _in_flight and _step_seconds (read by the event loop's thread)
        self._in_flight = 0  # requests submitted and not done
        self._step_seconds: deque[float] = deque(maxlen=10000)  # the latest steps' durations
        self._snapshot: EngineStats = engine.stats  # the engine's counters as the worker last published them
        self._published = 0.0
        self._calls: set[_Call] = set()  # calls with requests in the engine (the worker thread's)
        self._completed: list[_Call] = []  # calls whose last request finished in this round, answered after it
        self._recovering = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # ---- the worker thread --------------------------------------------------------------------------------------
    def _run(self):
        while True:
            busy = self.engine.has_pending()
            if not busy:
                self._publish()
                if self._stopping:  # checked here, not only when the stop is read: it may come while work is
                    return  # pending (the aborted requests of a client gone), which ends after it
            try:
                job = self._inbox.get(block=not busy)
            except queue.Empty:
                job = None
            while job is not None:
                if job is _STOP:
                    self._stopping = True
                else:
                    job()
                try:
                    job = self._inbox.get_nowait()
                except queue.Empty:
                    job = None
            if self.engine.has_pending():
                t0 = time.perf_counter()
                try:
                    self.engine.step()
                except BaseException as e:  # an engine bug: fail the requests in flight rather than hang them
                    self._step_failed(e)
                else:
                    with self._lock:
                        self._step_seconds.append(time.perf_counter() - t0)
                    if t0 - self._published > SNAPSHOT_SECONDS:
                        self._publish()
            self._answer()

    def _publish(self):
        self._snapshot, self._published = self.engine.stats, time.perf_counter()

    def _answer(self):
        """Answer the calls completed in this round, after publishing the counters that include their work."""
        if self._completed:
            self._publish()
            done, self._completed = self._completed, []
            for call in done:
                call.on_done()

    def _step_failed(self, error: BaseException):
        """See the module docstring. Which request caused the failure is unknown, so all leave the engine (aborted,
        their done callbacks not counted), and the score requests are tried again one by one."""
        log.exception("engine step failed")
        hit = [(call, i) for call in list(self._calls) for i, h in enumerate(call.handles) if not h.done]
        self._recovering = True
        try:
            for call, i in hit:
                self.engine.abort(call.handles[i])
            healthy = self._drain()
            for call, i in hit:
                label = call.handles[i].label
                if not (healthy and call.retry is not None):
                    call.failed[i] = _failure(label, error)
                    continue
                ctx, cont, top_k = call.retry[i]
                new = self.engine.add_score_ids(ctx, cont, top_k, True, label)
                try:
                    while not new.done:
                        self.engine.step()
                except Exception as e:  # fails alone too: this is the request that fails
                    log.exception("engine step failed for %s alone", label)
                    self.engine.abort(new)
                    call.failed[i] = _failure(label, e)
                    healthy = self._drain()
                else:
                    call.handles[i] = new
        finally:
            self._recovering = False
        for call, _ in hit:
            self._count_done(call)

    def _drain(self) -> bool:
        """Step until the aborted requests have left the engine; False if even that fails (then nothing more is
        tried on it: the requests hit fail with EngineFailure)."""
        try:
            while self.engine.has_pending():
                self.engine.step()
        except Exception:  # noqa: BLE001 - logged; the caller fails the requests
            log.exception("engine step failed while dropping aborted requests")
            return False
        return True

    def _call(self, fn):
        """Run fn() in the worker thread; an awaitable for its return value (or exception)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def job():
            try:
                value = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                loop.call_soon_threadsafe(_set_exception, fut, e)
            else:
                loop.call_soon_threadsafe(_set_result, fut, value)

        self._inbox.put(job)
        return fut

    def _check_running(self):
        if self._stopping or not self._thread.is_alive():
            raise RuntimeError("the engine is shut down")

    def _admit(self, n: int):
        self._check_running()
        with self._lock:
            if self.max_queue is not None and self._in_flight + n > self.max_queue:
                raise QueueFull(n, self._in_flight, self.max_queue)
            self._in_flight += n

    def _release(self, n: int):
        with self._lock:
            self._in_flight -= n

    def _track(self, call: _Call):
        """In the worker thread: call.on_done() in the event loop once every handle is done."""
        call.left = len(call.handles)
        self._calls.add(call)
        for h in list(call.handles):
            h.add_done_callback(lambda _, call=call: None if self._recovering else self._count_done(call))

    def _count_done(self, call: _Call):
        if call.counted:
            self._release(1)
        call.left -= 1
        if call.left == 0:
            self._calls.discard(call)
            self._completed.append(call)

    def _abort(self, call: _Call):
        """From the event loop: abort the call's requests (in the worker thread, between two steps)."""
        self._inbox.put(lambda: self._abort_now(call))

    def _abort_now(self, call: _Call):
        for h in call.handles:
            if not h.done:
                self.engine.abort(h)

    # ---- the API ------------------------------------------------------------------------------------------------
    def admit(self, n: int) -> Permit:
        """Room for n engine requests in flight (queued or running) until the permit is released, for the calls
        made with `permit=` (a server admits a whole HTTP call before any of its work starts); QueueFull (with the
        numbers) when they do not fit under max_queue."""
        self._admit(n)
        return Permit(n, self._release)

    @property
    def in_flight(self) -> int:
        """Engine requests admitted and not yet done or released."""
        with self._lock:
            return self._in_flight

    async def score(self, requests, top_k: int = 0, *, permit: Permit | None = None) -> list[ScoreResult]:
        """ScoreResults for (context, continuation) pairs, as Engine.score; raises the first failed request's error
        (UserError: bad input; EngineFailure: an internal failure)."""
        encoded = encode_pairs(self.engine.tokenizer, list(requests))
        if not encoded:
            return []
        call = await self._submit(
            len(encoded),
            lambda: [
                self.engine.add_score_ids(ctx, cont, top_k, True, f"request {i}")
                for i, (ctx, cont) in enumerate(encoded)
            ],
            permit,
            retry=[(ctx, cont, top_k) for ctx, cont in encoded],
        )
        await self._finished(call)
        return [call.result(i) for i in range(len(encoded))]

    async def generate(self, prompt, *, permit: Permit | None = None, **params) -> Generation:
        """One Generation (params as Engine.add_generate)."""
        call = await self._submit(1, lambda: [self.engine.add_generate(prompt, **params)], permit)
        await self._finished(call)
        return call.result(0)

    async def stream(self, prompt, *, permit: Permit | None = None, **params) -> AsyncIterator[TokenEvent]:
        """TokenEvents of one generation as they come; the last one has finish_reason set. Closing the iterator
        early (or cancelling the task reading it) aborts the request; a failed request raises its error."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        on_token = lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)  # noqa: E731
        call = await self._submit(1, lambda: [self.engine.add_generate(prompt, on_token=on_token, **params)], permit)
        call.done.add_done_callback(lambda _: events.put_nowait(_DONE))
        try:
            while (ev := await events.get()) is not _DONE:
                yield ev
            if (error := call.error(0)) is not None:
                raise error
        finally:
            if not call.done.done():
                self._abort(call)

    async def _submit(self, n: int, add, permit: Permit | None, retry: list | None = None) -> _Call:
        """Add n requests (add() -> their handles, run in the worker thread); the call, tracked until done. They are
        admitted here, or drawn from `permit` (which then holds their room until it is released). A caller that
        gives up before the worker took its job (cancelled, say) leaves nothing behind: the job, when its turn
        comes, adds nothing; one that gives up after has its requests aborted, counted out as they finish."""
        counted = permit is None
        if counted:
            self._admit(n)
        else:
            self._check_running()
            permit.take(n)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        state = {"taken": False, "abandoned": False, "call": None}  # under self._lock

        def job():
            with self._lock:
                if state["abandoned"]:
                    return None
                state["taken"] = True
            call = state["call"] = _Call(
                add(), lambda: loop.call_soon_threadsafe(_set_result, done, None), retry, counted=counted
            )
            self._track(call)
            return call

        try:
            call = await self._call(job)
        except BaseException:
            with self._lock:
                taken = state["taken"]
                state["abandoned"] = True
                if not taken and counted:
                    self._in_flight -= n
            if taken:  # the job ran (or is running): its requests leave the engine, after it (the inbox is FIFO)
                self._inbox.put(lambda: state["call"] is not None and self._abort_now(state["call"]))
            raise
        call.done = done  # the worker calls on_done through the event loop, so not before this line has run
        return call

    async def _finished(self, call: _Call):
        try:
            await asyncio.shield(call.done)
        except asyncio.CancelledError:
            self._abort(call)
            raise

    def queue_depth(self) -> int:
        """Requests submitted and not yet started (waiting for pages or for their turn)."""
        return self._snapshot.waiting + self._inbox.qsize()

    def stats(self) -> LoopStats:
        """The engine's counters (as last published by the worker), the requests in flight, the queue, and the
        latest steps' times."""
        with self._lock:
            in_flight, steps = self._in_flight, list(self._step_seconds)
        return LoopStats(self._snapshot, in_flight, self.queue_depth(), steps)

    async def shutdown(self):
        """Finish in-flight work, then stop the worker thread."""
        self._inbox.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)


_STOP, _DONE = object(), object()


def _failure(label: str, error: BaseException) -> EngineFailure:
    return EngineFailure(f"{label}: internal engine failure: {type(error).__name__}: {error}")


def _set_result(fut, value):
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut, error):
    if not fut.done():
        fut.set_exception(error)
