"""The engine: loads a model, then scores continuations and generates text on one prefix-shared paged KV cache.

One loop serves every caller. `add_score` / `add_generate` hand a request to the scheduler (engine/scheduler.py)
and return its handle; `step()` runs one round of it (launching a step and reading it; on a GPU reading the step
launched the round before instead, `overlap`): the scheduler's plan (prefill chunks, one decode token of every
generating sequence) goes through the model in one forward (step.py -> model.py -> kernels), then the LM head
(head.py: the scored rows through the fused target log-prob kernel, the generating rows through the batched
sampler, sampling.py); the scheduler then records the step and its output events come back (scores, tokens,
finished and failed requests, each already consumed by its handle). One lock makes add / abort / stats safe from other threads while the loop's
thread steps. `score()` and `generate()` add a
whole job and run the loop until it is done; engine/async_engine.py runs the same loop in a worker thread for
asyncio callers (the server)."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields, replace
from typing import NamedTuple

import torch

import kernels

from .config import ModelConfig
from .decode_graphs import DecodeGraphs
from .encoding import encode_pairs, prompt_ids
from .errors import UserError
from .head import PendingHead, launch_head
from .kv_cache import KVCache
from .loader import load_model_files
from .model import LlamaModel
from .plan import StepPlan
from .prefix_cache import PrefixCache
from .progress import progress_bar
from .request import Event, Finished, GenerateRequest, Request, ScoreRequest
from .results import Generation, ScoreResult, Status, TokenEvent
from .sampling import new_generator
from .scheduler import Scheduler
from .stats import EngineStats
from .step import build_step
from .validation import Limits, RequestError, check_generate, check_job, check_score, check_scores, check_stop
from .weights import release_free_memory

log = logging.getLogger("engine")

# The collector's first generation is scanned every 700 net allocations by default; a 9,000-request job allocates
# millions of small objects (token lists, tree nodes, rows) that live until the job ends, so each pass finds
# nothing to free and the older generations' passes walk the whole young tree: 27% of the ICQS job's time on a
# tiny model (benchmarks/RESULTS.md, "GPU (H100)"). A closed job raises the threshold while it runs and restores
# it after.
JOB_GC_THRESHOLD = 100_000
_gc_jobs = {"running": 0, "saved": None}
_gc_lock = threading.Lock()


@contextlib.contextmanager
def _fewer_gc_passes():
    with _gc_lock:
        if _gc_jobs["running"] == 0:
            _gc_jobs["saved"] = gc.get_threshold()
            first, *rest = _gc_jobs["saved"]
            gc.set_threshold(max(first, JOB_GC_THRESHOLD), *rest)
        _gc_jobs["running"] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_jobs["running"] -= 1
            if _gc_jobs["running"] == 0:
                gc.set_threshold(*_gc_jobs["saved"])


class _CollectorPause:
    """The cyclic collector off where a closed job's host work cannot overlap the device: from the job's start
    (encoding, checks, the adds up to the first step) until its first launch, and from its last read to its return
    (the results). A pass there (a full one walked the last job's freed objects for ~0.12 s in 2 calls of 6 of the
    ICQS job on a tiny model) is host time no device step hides; in the loop it runs while the device computes, and
    one held back at the end runs after the call (or in the next job's loop). `pause()` / `end()` (both
    idempotent) turn the collector off and back on, only if it was on when the job began; leaving the `with`
    block ends the pause."""

    def __init__(self):
        self._on, self._paused = gc.isenabled(), False
        self.pause()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()

    def pause(self):
        if self._on and not self._paused:
            self._paused = True
            gc.disable()

    def end(self):
        if self._paused:
            self._paused = False
            gc.enable()


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def torch_dtype(dtype) -> torch.dtype:
    """A dtype given as a DTYPES name or as a torch.dtype."""
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


RequestHandle = Request
__all__ = ["Engine", "EngineOptions", "ScoreResult", "Generation", "TokenEvent", "RequestHandle", "default_threads"]


class _Launched(NamedTuple):
    """A step launched by Engine._launch: its plan, its LM head's pending results, the host seconds it took."""

    plan: StepPlan
    head: PendingHead
    seconds: float


@dataclass
class EngineOptions:
    kv_tokens: int = 65536  # KV cache capacity in tokens
    page_size: int = 16
    token_budget: int = 1024  # new tokens per forward step
    keep_cache: bool = False  # online mode: keep computed prefixes across requests (LRU-evicted under pressure)
    deterministic: bool = False  # batch-invariant ops: a request's scores do not depend on the rest of the job
    # decode steps in fixed shapes, replayed from CUDA graphs on a GPU (engine/decode_graphs.py; eagerly elsewhere)
    decode_graphs: bool = False
    # the loop launches the next step before it reads the step in flight (a decode step takes the tokens the step
    # before samples on the device): on a GPU the host's planning and reading overlap the device's work; None: on a
    # GPU only (on a CPU the forward runs in the host's thread, so there is nothing to overlap, a step's results
    # would come a step later, and a sequence that ends would cost a row)
    overlap: bool | None = None

    @classmethod
    def checked(cls, **options) -> "EngineOptions":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise UserError(f"unknown engine option {unknown[0]!r} (expected one of {', '.join(sorted(names))})")
        opts = cls(**options)
        for name in ("kv_tokens", "page_size", "token_budget"):
            value = getattr(opts, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"engine option {name} must be a positive integer, got {value!r}")
        if opts.overlap not in (None, True, False):
            raise UserError(f"engine option overlap must be true, false or null, got {opts.overlap!r}")
        if opts.decode_graphs and opts.deterministic:
            raise UserError("engine options decode_graphs and deterministic cannot be combined")
        if opts.kv_tokens < opts.page_size:
            raise UserError(
                f"engine option kv_tokens={opts.kv_tokens} is smaller than one page (page_size={opts.page_size})"
            )
        return opts


def _cpu_busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (/proc/stat), or None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def default_threads(window: float = 0.2) -> int:
    """CPU threads for torch when the caller names none: the cores that OTHER processes are not keeping busy, at
    least 1. Busy = the larger of the processes runnable right now (other than this one) and the cores the rest of
    the machine used during a short sample (`window` seconds of /proc/stat, less this process's own CPU time).
    The 1-minute load average is not used: it counts this process's own recent work, so a program that had just
    been computing would see a busy machine. OpenMP workers that spin on cores other jobs hold ran 2.5-4x slower
    than one thread here, while on a quiet machine 2 threads ran 1.77x faster than 1 (benchmarks/RESULTS.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    busy = 0.0
    before, own_before, t0 = _cpu_busy_seconds(), time.process_time(), time.perf_counter()
    if before is not None:
        time.sleep(window)
        after = _cpu_busy_seconds()
        own = time.process_time() - own_before
        busy = max(0.0, (after - before - own) / (time.perf_counter() - t0))
    return max(1, min(cores, int(cores - max(busy, _runnable_others()) + 0.5)))


def _runnable_others() -> int:
    """Tasks runnable right now other than this one (/proc/loadavg), 0 where unknown."""
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return 0


class Engine:
    def __init__(self, config: ModelConfig, weights: dict, tokenizer, dtype=torch.bfloat16, device="cpu", **options):
        self.config, self.tokenizer, self.device = config, tokenizer, torch.device(device)
        self.dtype = torch_dtype(dtype)
        self.options = EngineOptions.checked(**options)
        self.limits = Limits.of(config, self.options.kv_tokens, self.options.page_size)  # what one request may hold
        self.model = LlamaModel(
            config,
            weights,
            self.dtype,
            self.device,
            self.options.deterministic,
            max_tokens=self.limits.max_request_tokens,
        )  # rope tables: not the header's length
        pages = -(-self.options.kv_tokens // self.options.page_size)
        self.kv = KVCache(config, pages, self.options.page_size, self.dtype, self.device)
        self.cache = PrefixCache(self.kv, self.options.keep_cache)  # the tree over the pages: the scheduler's and
        # the step builder's view of the KV cache
        self.scheduler = Scheduler(self.cache, self.options.token_budget)
        self.step_seconds: deque[float] = deque(maxlen=10000)  # the latest steps' durations
        self.last_stats = EngineStats()  # the counters of the last score() / generate() call
        self._peak_before = 0  # the most KV pages held at once before the cache's current peak was started
        # One lock for the loop's state: add_*, abort, stats and count may be called from any thread while another
        # steps; a step holds it from planning to recording (callers on the loop's own thread pay an uncontended
        # acquire per call).
        self._lock = threading.RLock()
        self.graphs: DecodeGraphs | None = None  # the fixed-shape decode path, when the option is on
        self._in_flight: _Launched | None = None  # the step launched and not yet read (the loop's, `_round`)
        self.use_decode_graphs(self.options.decode_graphs)
        self._next_id = 0
        tok = tokenizer
        self.eos = set(tok.eos_ids) | ({tok.eos_id} if tok.eos_id is not None else set())
        log.info(
            "engine: %s, %d layers, %s on %s, kernels: %s",
            config.arch,
            config.num_layers,
            self.dtype,
            self.device,
            kernels.describe(str(self.device.type)),
        )

    @classmethod
    def load(
        cls, model: str | None = None, dtype="bfloat16", device="cpu", threads: int | None = None, **options
    ) -> "Engine":
        if isinstance(dtype, str) and dtype not in DTYPES:
            raise UserError(f"unknown dtype {dtype!r} (use one of {', '.join(DTYPES)})")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise UserError(f"threads must be a positive integer, got {threads!r}")
        opts = EngineOptions.checked(**options)  # before the (slow) model load
        # deterministic mode: a fixed thread count where the GEMM's split of a row tile changes with it
        fixed = options.get("deterministic") and not kernels.StepKernels.thread_invariant(torch_dtype(dtype), device)
        threads = threads or (1 if fixed else default_threads())
        torch.set_num_threads(threads)
        log.info("engine: %d CPU thread(s)", threads)
        config, weights, tokenizer = load_model_files(model)
        engine = cls(config, weights, tokenizer, dtype=dtype, device=device, **vars(opts))
        del weights  # the reader and its file mapping
        release_free_memory()  # the last layers' and the tokenizer's transient heap, not kept resident
        return engine

    @property
    def stats(self) -> EngineStats:
        """A snapshot: the counters since the engine was made (requests, tokens computed, cache hits, steps, ...)
        and the state now (KV pages held, requests running and waiting). Safe from any thread."""
        with self._lock:
            return replace(
                self.scheduler.stats,
                peak_kv_pages=max(self._peak_before, self.kv.peak_used),
                kv_pages_used=self.kv.used_pages,
                kv_pages_total=self.kv.num_pages,
                running=self.count(Status.RUNNING),
                waiting=self.count(Status.WAITING),
            )

    def count(self, status: Status) -> int:
        """Requests in flight with this status (safe from any thread)."""
        with self._lock:
            return self.scheduler.count(status)

    # ---- the loop ------------------------------------------------------------------------------------------
    def add_score(
        self, context, continuation, top_k: int = 0, share_prefix: bool = True, label: str | None = None
    ) -> Request:
        """Score one (context, continuation) pair, text or token ids (the rules of score()); returns its handle."""
        ctx, cont = encode_pairs(self.tokenizer, [(context, continuation)])[0]
        return self.add_score_ids(ctx, cont, top_k, share_prefix, label)

    def add_score_ids(
        self,
        context: list[int],
        continuation: list[int],
        top_k: int = 0,
        share_prefix: bool = True,
        label: str | None = None,
    ) -> Request:
        """add_score for a request already encoded (encoding.encode_pairs)."""
        with self._lock:
            rid = self._new_id()
            req = ScoreRequest(rid, label or f"request {rid}", context, continuation, top_k)
            try:
                check_score(context, continuation, top_k, self.limits, label=req.label)
            except UserError as e:
                req.consume(Finished(req, Status.FAILED, e))
            else:
                self.scheduler.add(req, share_prefix)
            return req

    def add_generate(
        self,
        prompt,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        on_token=None,
        label: str | None = None,
    ) -> Request:
        """Generate from one prompt (text or token ids); on_token(TokenEvent) is called (in the engine's thread)
        after every token. Returns the handle; its result() is a Generation."""
        with self._lock:
            rid = self._new_id()
            label = label or f"request {rid}"
            error, ids, stops = None, [0], []
            try:
                ids = prompt_ids(self.tokenizer, prompt, label=label)
                check_generate(ids, max_tokens, temperature, top_p, seed, self.limits, label=label)
                stops = check_stop(stop, label=label)
            except UserError as e:
                error = e
            req = self._generate_request(rid, label, ids, max_tokens, temperature, top_p, seed, stops, on_token, error)
            if not req.done:
                self.scheduler.add(req)
            return req

    def _generate_request(
        self, rid, label, ids, max_tokens, temperature, top_p, seed, stop, on_token=None, error=None
    ) -> GenerateRequest:
        """The handle of a generation; one that failed its checks (`error`), or asks for no tokens, is done
        already."""
        req = GenerateRequest(
            rid,
            label,
            ids,
            max_tokens if error is None else 0,
            temperature,
            top_p,
            new_generator(seed, self.device) if temperature > 0 and top_p > 0 else None,
            [s for s in stop if s],
            self.eos,
            lambda out: self.tokenizer.decode(out, skip_special_tokens=True),
            on_token,
        )
        if error is not None:
            req.consume(Finished(req, Status.FAILED, error))
        elif max_tokens == 0:
            req.consume(Finished(req, Status.FINISHED, finish_reason="length"))
        return req

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def use_decode_graphs(self, enabled: bool) -> None:
        """Turn the option `decode_graphs` on or off between jobs (engine/decode_graphs.py): the benchmarks time
        both on one engine's weights."""
        with self._lock:
            self.options = EngineOptions.checked(**{**asdict(self.options), "decode_graphs": bool(enabled)})
            self.graphs = None
            if not enabled:
                return
            cuda = self.device.type == "cuda"
            self.graphs = DecodeGraphs(self.model, self.kv, self.options.token_budget, capture=cuda)
            if cuda:
                self.graphs.capture_all()  # at start-up, not in a request's step
            else:
                log.warning(
                    "decode_graphs on %s: no CUDA graphs here; the fixed-shape decode steps run eagerly, slower than "
                    "the cascade's (2.5x on SmolLM2, 32 sequences): the option is for GPUs",
                    self.device,
                )

    def use_overlap(self, enabled: bool | None) -> None:
        """Set the option `overlap` between jobs (None: on a GPU only): the benchmarks time both orders on one
        engine's weights."""
        with self._lock:
            self.options = EngineOptions.checked(**{**asdict(self.options), "overlap": enabled})

    def decode_graph_stats(self) -> dict | None:
        """The fixed-shape decode path's counters (replays, captures, a capture's error), None when it is off."""
        with self._lock:
            return None if self.graphs is None else self.graphs.stats()

    def check_pages(self):
        """Raise PageError unless every KV page's reference count matches the prefix-cache nodes holding it and
        the cache's victim indexes are complete (the tests' invariant; walks the whole tree)."""
        with self._lock:
            self.cache.check()

    def has_pending(self) -> bool:
        """Whether a request is in flight, or a launched step is not read yet."""
        return self.scheduler.has_pending() or self._in_flight is not None

    def abort(self, handle: Request) -> None:
        """Stop a request: it finishes ABORTED at the next step (safe from any thread)."""
        with self._lock:
            handle.abort()

    def step(self) -> list[Event]:
        """Run one round of the loop (`_round`: launch a step and read it, or with `overlap`, a GPU's default,
        launch the next step and read the one launched before it); returns the output events recorded
        (engine/request.py: scores, tokens, and the requests that finished, failed or were aborted), already
        consumed by their handles. Step while `has_pending()`: with `overlap` a step's results come one call later."""
        with self._lock:
            return self._round()

    def _round(self, while_running=None) -> list[Event]:
        """One round of the loop: a step is planned and launched, then read and recorded. Where the engine
        overlaps (`overlaps`, the option `overlap`: by default on a GPU) the step stays in flight and the next
        round launches the next step before it reads this one, so the host's planning and recording run while the
        device works; the next step takes each generating sequence's token from the device, and a sequence that
        the token read ends (end of text, a stop string) has one row computed in vain. The launched step's nodes
        are never preempted by the next. `while_running()` is called after the launch, before any step is read."""
        events, step, self._in_flight = [], self._in_flight, None
        try:
            launched = self._launch(step)
            if while_running is not None:
                while_running()
        except BaseException:  # the step in flight still ran: its results are recorded before this raises
            if step is not None:
                self._finish(step)
            raise
        if step is not None:
            events += self._finish(step)
        if launched.plan.empty or not self.overlaps:
            events += self._finish(launched)
        else:
            self._in_flight = launched
        return events

    @torch.inference_mode()
    def _launch(self, in_flight: _Launched | None) -> _Launched:
        """Plan a step, run its forward and launch its LM head, and advance the tree past it; on a GPU this returns
        while the device still works (nothing waits for it until `_finish` reads the results). `in_flight`: the
        step launched and not yet read, whose nodes this one never preempts and whose sampled tokens it takes on
        the device (engine/step.py)."""
        t0 = time.perf_counter()
        plan = self.scheduler.schedule(frozenset() if in_flight is None else in_flight.plan.protected)
        if plan.chunks:
            sampled = None if in_flight is None else in_flight.head.sampled
            step = build_step(plan.chunks, self.cache, self.device, sampled, contexts=self.graphs is not None)
            hidden = None if self.graphs is None else self.graphs.forward(step)  # None: not a fixed-shape step
            if hidden is None:
                hidden = self.model.forward(step.batch, self.kv)
            self.kv.write_hidden(step.written, step.kept, step.batch.write_slots[step.batch.out_rows], hidden)
        head = launch_head(plan, self.model, self.kv)
        self.scheduler.advance(plan)
        return _Launched(plan, head, time.perf_counter() - t0)

    def _finish(self, step: _Launched) -> list[Event]:
        """Read a launched step's results and record them; its seconds are its launch's and this read's."""
        t0 = time.perf_counter()
        head = step.head.result()
        seconds = step.seconds + time.perf_counter() - t0
        if not step.plan.empty:
            self.step_seconds.append(seconds)
        return self.scheduler.record(step.plan, head, seconds)

    def run(self, handles: list[Request] | None = None):
        """Step until the given requests (default: all pending ones) are done (the pipelined loop of `_loop`)."""
        self._loop(self.has_pending if handles is None else lambda: not all(h.done for h in handles))

    @property
    def overlaps(self) -> bool:
        """Whether the loop launches a step before it reads the step in flight (the option `overlap`; by default
        on a GPU)."""
        opt = self.options.overlap
        return self.device.type == "cuda" if opt is None else opt

    def _loop(self, more, while_running=None, progress=None):
        """Rounds of the loop (`_round`) while `more()`; then the step in flight, if any, is read, and it returns
        with none in flight. `while_running()` is called after each launch, while the device works; `progress` is
        updated with the tokens computed."""
        while True:
            with self._lock:
                before = self.scheduler.counts.tokens_computed
                if not more():
                    step, self._in_flight = self._in_flight, None
                    if step is not None:
                        self._finish(step)
                    return
                self._round(while_running)
            if progress is not None:
                progress.update(self.scheduler.counts.tokens_computed - before)

    # ---- closed jobs: add, run, collect ----------------------------------------------------------------------
    def score(self, requests, share_prefix: bool = True, progress: bool = False, top_k: int = 0) -> list[ScoreResult]:
        """log P(continuation | context) for each (context, continuation) request (text or token ids)."""
        with _CollectorPause() as pause:
            encoded = encode_pairs(self.tokenizer, requests)
            check_scores(encoded, top_k, self.limits)

            def make(i: int, pair) -> ScoreRequest:
                return ScoreRequest(self._new_id(), f"request {i}", pair[0], pair[1], top_k)

            return self._job(encoded, make, share_prefix, "scoring", progress, pause)

    def generate(
        self,
        prompts,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        progress: bool = False,
    ) -> list[Generation]:
        """One Generation per prompt (a single text is one prompt); with a seed, prompt i samples with seed + i. Every
        prompt is encoded once and checked before any is added."""
        prompts = (
            [prompts] if isinstance(prompts, str) else check_job(prompts, "prompts must be a text or a list of prompts")
        )
        stop = check_stop(stop)
        with _CollectorPause() as pause:
            encoded = [prompt_ids(self.tokenizer, p, i, f"prompt {i}") for i, p in enumerate(prompts)]
            for i, ids in enumerate(encoded):
                check_generate(ids, max_tokens, temperature, top_p, seed, self.limits, index=i, label=f"prompt {i}")

            def make(i: int, ids) -> GenerateRequest:
                seed_i = None if seed is None else seed + i
                return self._generate_request(
                    self._new_id(), f"prompt {i}", ids, max_tokens, temperature, top_p, seed_i, stop
                )

            return self._job(encoded, make, True, "generating", progress, pause)

    def _job(self, items: list, make, share_prefix: bool, desc: str, progress: bool, pause: _CollectorPause) -> list:
        """A closed job of checked requests (`make(i, item)` makes request i's handle), added in order: the first
        step is launched as soon as the prefix tree holds a step's worth of new tokens, and the rest of the job is
        added while the device runs it. All are added before any step's results are recorded, so no request ends
        (and frees the prefixes it holds) before every request that shares them is in the tree. The collector,
        paused since the job began (`pause`), runs from the first launch to the last read."""
        handles: list[Request] = []
        todo = iter(enumerate(items))

        def add(tokens: float):
            """Add requests until the tree gained `tokens` new tokens since the job started, or none are left."""
            for i, item in todo:
                req = make(i, item)
                handles.append(req)
                if not req.done:
                    self.scheduler.add(req, share_prefix)
                if self.cache.added_tokens - added_before >= tokens:
                    return

        def add_rest():
            pause.end()
            if len(handles) < len(items):
                add(math.inf)
                bar.reset(total=self.cache.added_tokens - added_before)  # nothing counted yet: in the first step

        with _fewer_gc_passes():
            with self._lock:
                self._peak_before = max(self._peak_before, self.kv.reset_peak())
                before, added_before = self.scheduler.stats, self.cache.added_tokens
                add(self.options.token_budget)
            total = self.cache.added_tokens - added_before if len(handles) == len(items) else None  # else known soon
            with progress_bar(total=total, unit="tok", desc=desc, disable=not progress) as bar:
                self._loop(lambda: len(handles) < len(items) or not all(h.done for h in handles), add_rest, bar)
        pause.pause()  # the results: host time after the last read
        stats = self.stats.since(before)
        stats.unique_tokens, stats.peak_kv_pages = self.cache.added_tokens - added_before, self.kv.peak_used
        self.last_stats = stats
        for i, h in enumerate(handles):  # a failed request raises with its index in the call
            if isinstance(h.error, RequestError):
                raise h.error.with_index(i) from None
        return [h.result() for h in handles]

    # ---- validation (engine/validation.py) ------------------------------------------------------------------
    @property
    def max_request_tokens(self) -> int:
        """The most tokens one request (prompt + scored or generated tokens) may hold: the model's maximum or the
        KV cache's capacity, whichever is smaller."""
        return self.limits.max_request_tokens
