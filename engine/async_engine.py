"""An asyncio front for the engine: one worker thread runs the loop (add -> step -> results) while coroutines
submit requests and await them, or iterate over a sequence's tokens as they are generated.

Everything that touches the engine runs in the worker thread: a coroutine posts a closure into the inbox, the
worker runs it between two steps, and results come back to the event loop with call_soon_threadsafe. A cancelled
awaiting task (a client gone) aborts its requests in the engine; `shutdown()` lets in-flight work finish."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator

from .engine import Engine, Generation, ScoreResult, TokenEvent
from .errors import EngineFailure
from .requests import Request, ScoreRequest, Status, encode_pairs

log = logging.getLogger("engine")


class QueueFull(Exception):
    """More requests are waiting than max_queue allows (a server answers 429 / 503)."""


class _Gate:
    """Whether an add job ran or its caller gave up first (exactly one of the two wins, under a lock): so a
    cancelled call's requests are counted out of the in-flight gauge exactly once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._state = None  # "entered" or "cancelled"
        self.handles: list = []

    def enter(self) -> bool:
        with self._lock:
            if self._state is None:
                self._state = "entered"
            return self._state == "entered"

    def cancel(self) -> bool:
        with self._lock:
            if self._state is None:
                self._state = "cancelled"
            return self._state == "cancelled"


class AsyncEngine:
    def __init__(self, engine: Engine, max_queue: int | None = None):
        self.engine, self.max_queue = engine, max_queue
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight = 0  # requests submitted and not done
        self._stopping = False
        self._error: BaseException | None = None
        self._retry: list | None = None  # score requests to run again alone, while a failed step is handled
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # ---- the worker thread --------------------------------------------------------------------------------------
    def _run(self):
        while True:
            busy = self.engine.has_pending()
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
                try:
                    self.engine.step()
                except BaseException as e:  # an engine bug: fail the requests in flight rather than hang them
                    self._step_failed(e)
            elif self._stopping:
                return

    def _step_failed(self, error: BaseException):
        """A step raised. Which request caused it is unknown, so every request in flight leaves the engine; each
        score request (pure: nothing was sent for it yet) is then run again alone, and fails with EngineFailure
        only if it fails alone too. Generations fail with EngineFailure (their tokens may have been streamed)."""
        log.exception("engine step failed")
        self._error, self._retry = error, []
        for req in list(self.engine.scheduler.active.values()):
            self.engine.scheduler.drop(req, Status.FAILED, EngineFailure(
                f"{req.label}: internal engine failure: {type(error).__name__}: {error}"))
        self.engine.scheduler.finished.clear()
        retry, self._retry = self._retry, None
        for handles, i, on_done in retry:  # _track put them here instead of reporting them done
            old = handles[i]
            new = handles[i] = self.engine._add_score_ids(old.context, old.continuation, old.top_k, True, old.label)
            new.add_done_callback(on_done)
            try:
                self.engine.run([new])
            except Exception as e:  # fails alone too: this is the request that fails
                log.exception("engine step failed for %s alone", old.label)
                self.engine.scheduler.drop(new, Status.FAILED, EngineFailure(
                    f"{old.label}: internal engine failure: {type(e).__name__}: {e}"))
                self.engine.scheduler.finished.clear()

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

    def _admit(self, n: int):
        if self._stopping or not self._thread.is_alive():
            raise RuntimeError("the engine is shut down")
        with self._lock:
            if self.max_queue is not None and self._in_flight + n > self.max_queue:
                raise QueueFull(f"{self._in_flight} requests in flight, the queue holds {self.max_queue}")
            self._in_flight += n

    def _track(self, handles: list[Request], loop, on_done):
        """Call on_done() in the event loop once every handle is done."""
        left = [len(handles)]
        lock = threading.Lock()

        def one(req):
            if self._retry is not None and isinstance(req, ScoreRequest) and not req.abort_requested:
                self._retry.append((handles, handles.index(req), one))
                return
            with self._lock:
                self._in_flight -= 1
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                loop.call_soon_threadsafe(on_done)

        for h in handles:
            h.add_done_callback(one)

    # ---- the API ------------------------------------------------------------------------------------------------
    async def score(self, requests, top_k: int = 0) -> list[ScoreResult]:
        """ScoreResults for (context, continuation) pairs, as Engine.score; raises the first failed request's error
        (UserError: bad input; EngineFailure: an internal failure)."""
        encoded = encode_pairs(self.engine.tokenizer, list(requests))
        self._admit(len(encoded))
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        gate = _Gate()

        def add():
            if not gate.enter():  # the caller was cancelled before this ran: nothing to add, already uncounted
                return []
            handles = [self.engine._add_score_ids(ctx, cont, top_k, True, f"request {i}")
                       for i, (ctx, cont) in enumerate(encoded)]
            self._track(handles, loop, lambda: _set_result(done, None))
            gate.handles = handles
            return handles

        try:
            handles = await self._call(add)
        except BaseException:
            self._abandon(gate, len(encoded))
            raise
        if not handles:
            return []
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            for h in handles:
                h.abort()
            raise
        return [h.result() for h in handles]

    async def generate(self, prompt, **params) -> Generation:
        """One Generation (params as Engine.add_generate)."""
        handle, done = await self._start_generate(prompt, params, None)
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            handle.abort()
            raise
        return handle.result()

    async def stream(self, prompt, **params) -> AsyncIterator[TokenEvent]:
        """TokenEvents of one generation as they come; the last one has finish_reason set. Closing the iterator
        early (or cancelling the task reading it) aborts the request; a failed request raises its error."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        handle, done = await self._start_generate(
            prompt, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        done.add_done_callback(lambda _: events.put_nowait(_DONE))
        try:
            while (ev := await events.get()) is not _DONE:
                yield ev
            if handle.error is not None:
                raise handle.error
        finally:
            if not handle.done:
                handle.abort()

    async def _start_generate(self, prompt, params, on_token):
        self._admit(1)
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        gate = _Gate()

        def add():
            if not gate.enter():
                return None
            h = self.engine.add_generate(prompt, on_token=on_token, **params)
            self._track([h], loop, lambda: _set_result(done, None))
            gate.handles = [h]
            return h

        try:
            handle = await self._call(add)
        except BaseException:
            self._abandon(gate, 1)
            raise
        return handle, done

    def _abandon(self, gate: "_Gate", n: int) -> None:
        """The caller of an add job failed or was cancelled: if the job has not run, it never will and its n
        requests leave the count here; if it ran, its requests are aborted and leave the count (once) as they
        finish, through _track."""
        if gate.cancel():
            with self._lock:
                self._in_flight -= n
        else:
            for h in gate.handles:
                h.abort()

    def queue_depth(self) -> int:
        """Requests submitted and not yet started (waiting for pages or for their turn)."""
        return self.engine.count(Status.WAITING) + self._inbox.qsize()

    def stats(self) -> dict:
        s = self.engine.stats
        s.update(queue_depth=self.queue_depth(), in_flight=self._in_flight,
                 step_seconds=_copy(lambda: list(self.engine.step_seconds)))
        return s

    async def shutdown(self):
        """Finish in-flight work, then stop the worker thread."""
        self._inbox.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)


_STOP, _DONE = object(), object()


def _copy(read):
    """read() of a container the worker thread may change meanwhile: try again until a copy succeeds."""
    while True:
        try:
            return read()
        except RuntimeError:
            continue


def _set_result(fut, value):
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut, error):
    if not fut.done():
        fut.set_exception(error)
