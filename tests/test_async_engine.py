"""AsyncEngine: coroutines submit work to the one engine loop running in a worker thread; results equal the
synchronous engine's, tokens stream as they are generated, a cancelled caller aborts its request."""

from __future__ import annotations

import asyncio

import pytest

from engine import Engine, UserError
from engine.async_engine import AsyncEngine, QueueFull


@pytest.fixture(scope="module")
def eng(tiny_model_dir):
    return Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True, threads=1)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_concurrent_scoring_generation_and_streams_match_the_engine(eng):
    pairs = [("The cat sat on", " the mat"), ("The cat sat on", " a hat"), ("Dogs bark", " loudly")]
    want_scores = eng.score(pairs, top_k=2)
    want_gen = eng.generate(["Once upon a time"], max_tokens=12)[0]

    async def main():
        a = AsyncEngine(eng)
        scores, gen, events = await asyncio.gather(
            a.score(pairs, top_k=2),
            a.generate("Once upon a time", max_tokens=12),
            collect(a.stream("Once upon a time", max_tokens=12)),
        )
        stats = a.stats()
        await a.shutdown()
        return scores, gen, events, stats

    async def collect(it):
        return [e async for e in it]

    scores, gen, events, stats = run(main())
    assert [s.token_logprobs for s in scores] == [pytest.approx(s.token_logprobs, abs=1e-5) for s in want_scores]
    assert [s.top_logprobs[0][0][0] for s in scores] == [s.top_logprobs[0][0][0] for s in want_scores]
    assert gen.token_ids == want_gen.token_ids and gen.text == want_gen.text
    assert [e.token_id for e in events if e.finish_reason != "eos"] == want_gen.token_ids
    assert "".join(e.text_delta for e in events) == want_gen.text
    assert [e.finish_reason for e in events][-1] == want_gen.finish_reason
    assert all(e.finish_reason is None for e in events[:-1])
    assert stats.engine_stats.requests >= 5 and stats.engine_stats.kv_pages_total > 0 and stats.step_seconds
    assert stats.in_flight == stats.queue_depth == 0


def test_cancelled_caller_aborts_and_errors_reach_the_caller(eng):
    async def main():
        a = AsyncEngine(eng, max_queue=4)
        task = asyncio.create_task(a.generate("Hello", max_tokens=400))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(UserError, match="token id"):
            await a.score([([1, 10**6], [2])])
        with pytest.raises(QueueFull) as full:
            await a.score([("a", " b")] * 5)
        assert (full.value.n, full.value.max_queue, full.value.never_fits) == (5, 4, True)
        stream = a.stream("Hello", max_tokens=400)
        first = await stream.__anext__()
        await stream.aclose()  # the client went away after one token
        for _ in range(100):
            if not a.stats().in_flight:
                break
            await asyncio.sleep(0.02)
        await a.shutdown()
        return first, a.stats()

    first, stats = run(main())
    assert first.token_id is not None and stats.in_flight == 0
    assert stats.engine_stats.running == stats.engine_stats.waiting == 0 and not eng.has_pending()
    eng.check_pages()


def test_shutdown_while_a_cancelled_call_is_still_in_the_engine_ends(eng, monkeypatch):
    """A client leaves during a long step and the server is told to stop before that step ends: the abort and the
    stop are both read after the step, the aborted requests leave the engine in the next one, and then the worker
    ends (it used to wait for another command, so `serve` hung on SIGTERM until killed)."""
    import threading

    in_step, release = threading.Event(), threading.Event()
    step = eng.step

    def slow_step():
        in_step.set()
        release.wait(10)
        return step()

    async def main():
        a = AsyncEngine(eng)
        monkeypatch.setattr(eng, "step", slow_step)
        task = asyncio.create_task(a.score([(f"Item {i}: the quick brown fox", " jumps") for i in range(8)]))
        while not in_step.is_set():
            await asyncio.sleep(0.005)
        task.cancel()  # the abort is queued behind the running step
        stop = asyncio.create_task(a.shutdown())
        await asyncio.sleep(0.05)
        release.set()
        try:
            await asyncio.wait_for(asyncio.shield(stop), 10)
        except TimeoutError:
            a._inbox.put(lambda: None)  # wake the worker so that the test ends, then fail
            await stop
            pytest.fail("the engine's worker did not end after shutdown()")
        with pytest.raises(asyncio.CancelledError):
            await task
        return a.stats()

    stats = run(main())
    assert stats.in_flight == 0 and not eng.has_pending()
    eng.check_pages()


def test_a_permit_holds_room_for_the_calls_made_with_it(eng):
    """admit(n) takes room for n engine requests in flight, counted once: the calls made with the permit draw on it
    rather than adding their own; a call that does not fit gets QueueFull with the numbers; releasing gives the room
    back (once), and a permit cannot carry more requests than it was admitted for."""

    async def main():
        a = AsyncEngine(eng, max_queue=3)
        with a.admit(2) as permit:
            assert a.in_flight == a.stats().in_flight == 2
            with pytest.raises(QueueFull) as full:
                a.admit(2)
            assert (full.value.n, full.value.in_flight, full.value.max_queue, full.value.never_fits) == (2, 2, 3, False)
            assert "2 requests in flight, at most 3" in str(full.value)
            scores = await a.score([("The cat", " sat"), ("The cat", " ran")], permit=permit)
            assert len(scores) == 2 and a.in_flight == 2  # the permit still holds its room
            with pytest.raises(RuntimeError, match="permit for 2"):
                await a.generate("Hello", permit=permit, max_tokens=2)
            assert a.in_flight == 2
            gen = await a.generate("Hello", max_tokens=2)  # a call of its own: room for one more
            assert gen.token_ids and a.in_flight == 2
        permit.release()  # idempotent
        assert a.in_flight == 0
        await a.shutdown()

    run(main())
