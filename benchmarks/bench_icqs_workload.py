"""The ICQS-shaped scoring job, timed: 11 ratios x 4 demo sets (16 demos each, ~35 tokens per demo) x 200
candidates (50 questions, each answered by 4 models) = 8800 (demo set + question, answer) requests.

    .venv/bin/python benchmarks/bench_icqs_workload.py [--scale 1.0] [--sample 40] [--skip-llamacpp]
                                                       [--token-budget 1024] [--dtype bfloat16] [--model PATH]
                                                       [--stream]

The task is a sentiment task the script generates itself ("Sentence: ...\\nAnswer: positive"): Z_g holds sentences
with their true label, Z_b others with the label flipped; four simulated models (accuracy 1.0, 0.8, 0.6, 0.4)
answer the same 50 held-out sentences. The requests are the ones `icqs score` sends (icqs.scoring.mixture_requests
over the coupled demo sets of icqs.sampler), all in one engine call with share_prefix=True.

The baselines are timed on a random sample of the same requests (--sample) and extrapolated per request to the
whole job: transformers run naively (one full forward per request, as lm-evaluation-harness with --batch_size 1)
and llama.cpp (llama-cpp-python on the same Q4_1 GGUF, logits_all=True, a reset and one eval per request; an
optional extra, skipped when not installed). The engine without prefix sharing runs on the same sample, and its
scores check the shared run's; in float32 (--fp32-check) a sub-job shows the sharing exact up to rounding.
With --stream the same job is also submitted the way a scoring service receives it: a producer thread hands the
requests to the engine loop (engine.async_engine.AsyncEngine, online cache) one at a time in arrival order, once as
token ids and once as text tokenized per request; printed beside the closed job's candidate-scores/s and tokens.
Printed: candidate-scores/s and the speedups, tokens computed vs requested, forward steps, peak KV pages, peak RSS
against weights + KV budget.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from common import (
    LlamaCpp,
    Timing,
    current_rss,
    engine_weight_bytes,
    hf_model,
    hf_naive,
    llama_cpp_available,
    load_average,
    machine,
    max_abs_diff,
    mib,
    peak_rss,
    request_tokens,
    reset_peak_rss,
    table,
    timed,
)

from engine import Engine
from engine.engine import DTYPES
from engine.loader import default_model_path, is_gguf, load_model_files
from icqs.candidates import Candidate
from icqs.sampler import demo_sets
from icqs.scoring import mixture_requests
from icqs.task import Example, Task

SUBJECTS = [
    "The hotel room we booked for the long weekend",
    "The pasta at the little restaurant by the station",
    "The customer service team of the phone company",
    "The second season of the detective series",
    "The laptop I bought for university last spring",
    "The guided boat tour around the old harbour",
    "The new album from my favourite band",
    "The cooking class my sister gave me for my birthday",
    "The train journey from the capital to the coast",
    "The museum's exhibition of modern photography",
    "The running shoes I ordered online in March",
    "The children's play at the town theatre",
]
POSITIVE = [
    "was clean, quiet and far better than we had expected",
    "turned an ordinary evening into a real pleasure",
    "was friendly, quick and genuinely helpful from the start",
    "kept us gripped until the very last minute",
    "has worked perfectly every single day since I got it",
    "was the highlight of our whole trip this year",
    "is full of songs I keep humming all day long",
    "taught me more than I learned in years of trying",
    "was comfortable, punctual and wonderfully scenic",
    "left me inspired and eager to visit again soon",
]
NEGATIVE = [
    "was dirty, noisy and far worse than the photos suggested",
    "turned a nice evening into a long ordeal",
    "was rude, slow and of no help whatsoever",
    "bored us so much that we gave up halfway",
    "has crashed almost every day since I got it",
    "was the low point of our whole trip this year",
    "is full of songs I would rather never hear again",
    "was a waste of money and of a free afternoon",
    "was cramped, late and painfully uncomfortable",
    "left me annoyed and determined never to return",
]
ENDINGS = [
    "according to everyone in our group",
    "if I am completely honest",
    "as far as I can remember",
    "and my friends said the same",
]
LABELS = ["negative", "positive"]
MODELS = {"model-A": 1.0, "model-B": 0.8, "model-C": 0.6, "model-D": 0.4}
QUESTIONS, POOL = 50, 60


def sentences(seed: int = 0) -> list[Example]:
    """Every subject x predicate sentence with its true label and a random ending, in a fixed random order."""
    rng = np.random.default_rng(seed)
    pairs = [(s, p, "positive") for s, p in itertools.product(SUBJECTS, POSITIVE)]
    pairs += [(s, p, "negative") for s, p in itertools.product(SUBJECTS, NEGATIVE)]
    out = [Example(f"{s} {p}, {ENDINGS[rng.integers(len(ENDINGS))]}.", y) for s, p, y in pairs]
    return [out[i] for i in rng.permutation(len(out))]


def flip(label: str) -> str:
    return LABELS[1 - LABELS.index(label)]


def build_job(questions: int, ratios: int, demos: int, demo_sets_per_ratio: int, seed: int = 0):
    """(task, candidates, requests): requests for every (demo set, ratio, candidate), as `icqs score` sends them."""
    pool = sentences(seed)
    good, bad = pool[:POOL], [Example(e.x, flip(e.y)) for e in pool[POOL : 2 * POOL]]
    held_out = pool[2 * POOL : 2 * POOL + questions]
    task = Task(
        "bench-sentiment",
        "Sentence: {x}\nAnswer: {y}",
        good,
        bad,
        labels=list(LABELS),
        M=ratios - 1,
        N=demos,
        L=demo_sets_per_ratio,
        seed=seed,
    )
    rng = np.random.default_rng(seed + 1)
    candidates = []
    for model, accuracy in MODELS.items():
        right = set(rng.permutation(len(held_out))[: round(accuracy * len(held_out))].tolist())
        candidates += [
            Candidate(f"{model}/q{q}", model, e.x, e.y if q in right else flip(e.y)) for q, e in enumerate(held_out)
        ]
    requests = [r for sets in demo_sets(task, "coupled") for r in mixture_requests(task, sets, candidates)]
    return task, candidates, requests


@dataclass
class Run:
    key: str
    name: str
    requests: int  # requests timed
    time: Timing
    scores: list[float] | None  # log-probs of the sample (None: the whole job)


def add_job_args(
    ap: argparse.ArgumentParser, scale: float = 1.0, ratios: int = 11, demos: int = 16, demo_sets: int = 4
) -> None:
    """The model and the shape of the ICQS-shaped job (build_job), for every benchmark that runs it."""
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: the embedded SmolLM2)")
    ap.add_argument("--scale", type=float, default=scale, help="fraction of the 50 questions")
    ap.add_argument("--ratios", type=int, default=ratios)
    ap.add_argument("--demos", type=int, default=demos, help="demos per demo set")
    ap.add_argument("--demo-sets", type=int, default=demo_sets, help="demo sets per ratio")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_args(ap)
    ap.add_argument("--sample", type=int, default=40, help="requests the baselines are timed on")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--llamacpp-extra-buffers",
        action="store_true",
        help="let llama.cpp use its extra buffer types (AMX, repacking); off: they fault on this machine",
    )
    ap.add_argument("--token-budget", type=int, default=1024, help="engine: new tokens per forward step")
    ap.add_argument("--kv-tokens", type=int, default=65536, help="engine: KV cache capacity in tokens")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument(
        "--fp32-check",
        type=int,
        default=8,
        metavar="N",
        help="requests of a float32 sub-job checked without sharing (0: no check)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--stream",
        action="store_true",
        help="also submit the job from a producer thread one request at a time (AsyncEngine, online "
        "cache) and compare it with the closed job",
    )
    return ap.parse_args(argv)


def stream_job(engine, tok, requests, pretokenized: bool):
    """The job as a service sees it: a producer thread submits the requests in arrival order, one at a time, to
    the engine loop running in its worker thread (AsyncEngine), tokenizing each one as it goes unless
    `pretokenized`. -> (Timing, engine stats of the job, log-probs, producer seconds spent tokenizing)."""
    from engine.async_engine import AsyncEngine
    from engine.encoding import encode_pairs

    ids = encode_pairs(tok, requests) if pretokenized else None
    before = asdict(engine.stats)
    tokenizing = [0.0]

    async def run():
        front, loop = AsyncEngine(engine), asyncio.get_running_loop()
        futures = []

        def produce():
            for i, r in enumerate(requests):
                if ids is None:
                    t0 = time.perf_counter()
                    r = encode_pairs(tok, [r])[0]
                    tokenizing[0] += time.perf_counter() - t0
                else:
                    r = ids[i]
                futures.append(asyncio.run_coroutine_threadsafe(front.score([r]), loop))

        producer = threading.Thread(target=produce)
        producer.start()
        await loop.run_in_executor(None, producer.join)
        out = [(await asyncio.wrap_future(f))[0].logprob for f in futures]
        await front.shutdown()
        return out

    with timed() as t:
        scores = asyncio.run(run())
    after = asdict(engine.stats)
    return t, {k: after[k] - before[k] for k in before if isinstance(before[k], int)}, scores, tokenizing[0]


def compare_stream(args, config, weights, tok, requests, job, stats, shared):
    """Closed job vs the same job streamed (both printed in one run)."""
    print()
    rows = [
        [
            "closed job (engine.score, all requests at once)",
            job.time.wall,
            job.time.cpu,
            len(requests) / job.time.wall,
            1.0,
            1.0,
            stats["tokens_computed"],
            1.0,
            "-",
        ]
    ]
    out = {}
    for pre in (True, False):
        eng = Engine(
            config,
            weights,
            tok,
            dtype=DTYPES[args.dtype],
            token_budget=args.token_budget,
            kv_tokens=args.kv_tokens,
            keep_cache=True,
        )
        t, s, scores, tokenizing = stream_job(eng, tok, requests, pretokenized=pre)
        rate = len(requests) / t.wall
        name = (
            "streamed, token ids (producer thread, one request at a time)"
            if pre
            else f"streamed, text (producer tokenizes each request: {tokenizing:.1f} s)"
        )
        rows.append(
            [
                name,
                t.wall,
                t.cpu,
                rate,
                rate * job.time.wall / len(requests),
                job.time.cpu / t.cpu,
                s["tokens_computed"],
                s["tokens_computed"] / stats["tokens_computed"],
                f"{max_abs_diff(scores, [r.logprob for r in shared]):.3g}",
            ]
        )
        out["ids" if pre else "text"] = dict(
            seconds=t.wall,
            rate_ratio=rows[-1][4],
            cpu_ratio=rows[-1][5],
            token_ratio=rows[-1][7],
            steps=s["forward_steps"],
        )
        del eng
        gc.collect()
    print(
        table(
            [
                "run",
                "wall s",
                "CPU s",
                "candidate-scores/s",
                "vs closed job (wall)",
                "vs closed job (CPU)",
                "tokens computed",
                "tokens vs closed",
                "max abs diff vs closed",
            ],
            rows,
        )
    )
    return out


def run_baselines(args, tok, sample: list, engine) -> list[Run]:
    """The engine without sharing, transformers and llama.cpp, each timed on `sample` after a warm-up."""
    with timed() as t:
        scores = [r.logprob for r in engine.score(sample, share_prefix=False)]
    runs = [Run("engine_unshared", "engine (share_prefix=False), sample", len(sample), t, scores)]
    if not args.skip_hf:
        config, weights, tok = load_model_files(args.model)
        hf = hf_model(config, weights, DTYPES[args.dtype])
        del weights
        hf_naive(hf, tok, sample[:1])
        with timed() as t:
            scores = hf_naive(hf, tok, sample)
        runs.append(Run("transformers", "transformers, one forward per request, sample", len(sample), t, scores))
        del hf
        gc.collect()
    gguf = default_model_path() if args.model is None else Path(args.model)
    why_not = "--skip-llamacpp" if args.skip_llamacpp else llama_cpp_available()
    if why_not is None and not is_gguf(gguf):
        why_not = "the model is not a GGUF file"
    if why_not is not None:
        print(f"llama.cpp skipped: {why_not}")
        return runs
    llama = LlamaCpp(gguf, n_ctx=max(request_tokens(tok, sample)) + 1, extra_buffers=args.llamacpp_extra_buffers)
    llama.score(tok, sample[:1])
    with timed() as t:
        scores = llama.score(tok, sample)
    runs.append(
        Run(
            "llama.cpp", "llama.cpp (llama-cpp-python, Q4_1 GGUF), one eval per request, sample", len(sample), t, scores
        )
    )
    return runs


def fp32_check(args, checked: int) -> tuple[int, float]:
    """Prefix sharing is exact up to rounding: in float32, a sub-job (demo set 0 at every ratio, the candidates of
    two questions) scored with sharing against `checked` of its requests scored without. -> (requests, max diff)"""
    config, weights, tok = load_model_files(args.model)
    engine = Engine(config, weights, tok, dtype=torch.float32, token_budget=args.token_budget, kv_tokens=args.kv_tokens)
    del weights
    requests = build_job(2, args.ratios, args.demos, 1, args.seed)[2]
    shared = engine.score(requests, share_prefix=True)
    picked = np.linspace(0, len(requests) - 1, min(checked, len(requests))).round().astype(int)
    unshared = engine.score([requests[i] for i in picked], share_prefix=False)
    return len(requests), max_abs_diff([shared[i].logprob for i in picked], [r.logprob for r in unshared])


def main(argv=None) -> dict:
    args = parse_args(argv)
    questions = max(1, round(QUESTIONS * args.scale))
    print(f"# ICQS-shaped workload ({machine()}; load average {load_average()})")
    config, weights, tok = load_model_files(args.model)
    engine = Engine(
        config, weights, tok, dtype=DTYPES[args.dtype], token_budget=args.token_budget, kv_tokens=args.kv_tokens
    )
    if not args.stream:
        del weights  # the engine holds its own copy; transformers reloads the files after the engine's job
    gc.collect()
    task, candidates, requests = build_job(questions, args.ratios, args.demos, args.demo_sets, args.seed)
    demo_tokens = np.mean([len(tok.encode(task.render(e) + task.separator)) for e in task.good + task.bad])
    print(
        f"{args.ratios} ratios x {args.demo_sets} demo sets x {len(candidates)} candidates ({questions} questions"
        f" x {len(MODELS)} models) = {len(requests)} requests; {args.demos} demos per set, {demo_tokens:.1f} "
        f"tokens per demo; {args.dtype}, token budget {args.token_budget}"
    )

    engine.score(requests[:2], share_prefix=False)  # warm-up
    rss_before, reset = current_rss(), reset_peak_rss()
    with timed() as t:
        shared = engine.score(requests, share_prefix=True, progress=True)
    rss_peak, stats = peak_rss(), asdict(engine.last_stats)
    job = Run("engine", "engine (share_prefix=True), whole job", len(requests), t, None)
    streamed = compare_stream(args, config, weights, tok, requests, job, stats, shared) if args.stream else None

    rng = np.random.default_rng(args.seed + 2)
    idx = np.sort(rng.choice(len(requests), size=min(args.sample, len(requests)), replace=False))
    sample = [requests[i] for i in idx]
    want = [shared[i].logprob for i in idx]
    runs = run_baselines(args, tok, sample, engine)

    per_request = {r.key: (r.time.wall / r.requests, r.time.cpu / r.requests) for r in [job] + runs}
    wall0, cpu0 = per_request["engine"]
    rows = [
        [
            r.name,
            r.requests,
            r.time.wall,
            wall * len(requests),
            1 / wall,
            wall / wall0,
            cpu / cpu0,
            "-" if r.scores is None else f"{max_abs_diff(r.scores, want):.3g}",
        ]
        for r in [job] + runs
        for wall, cpu in [per_request[r.key]]
    ]
    print(
        f"\n{len(requests)} requests, {stats['tokens_requested'] / len(requests):.0f} tokens each on average "
        f"(sample: {np.mean(request_tokens(tok, sample)):.0f}); the sample has {len(sample)} requests\n"
    )
    print(
        table(
            [
                "runner",
                "requests timed",
                "wall s",
                "whole job s (extrapolated)",
                "candidate-scores/s",
                "engine speedup (wall)",
                "engine speedup (CPU)",
                "max abs diff vs engine shared",
            ],
            rows,
        )
    )

    kv_budget = engine.kv.k.nbytes + engine.kv.v.nbytes
    kv_peak = stats["peak_kv_pages"] * engine.kv.page_size * engine.kv.bytes_per_token()
    weight_bytes = engine_weight_bytes(engine)
    print(
        f"\nengine, whole job: {stats['tokens_computed']:,} tokens computed of {stats['tokens_requested']:,} "
        f"requested ({stats['tokens_requested'] / stats['tokens_computed']:.1f}x fewer), "
        f"{stats['forward_steps']:,} forward steps, {job.time.wall:.1f} s wall, {job.time.cpu:.1f} s CPU"
    )
    print(
        f"memory: peak RSS {mib(rss_peak)}{' during the job' if reset else ' (process)'} (RSS before the job "
        f"{mib(rss_before)}); weights {mib(weight_bytes)} + KV budget {mib(kv_budget)} ({args.kv_tokens:,} "
        f"tokens) = {mib(weight_bytes + kv_budget)}; peak KV in use {stats['peak_kv_pages']:,} pages = "
        f"{mib(kv_peak)}"
    )
    diffs = {r.key: max_abs_diff(r.scores, want) for r in runs}
    if args.fp32_check:
        n, diffs["fp32_unshared"] = fp32_check(args, args.fp32_check)
        print(
            f"float32 check: a sub-job of {n} requests scored with sharing; {min(args.fp32_check, n)} of them "
            f"without: max abs diff {diffs['fp32_unshared']:.3g} nats"
        )
    print(f"load average at the end: {load_average()}")
    return dict(
        requests=len(requests),
        stats=stats,
        seconds=job.time.wall,
        per_request=per_request,
        stream=streamed,
        diffs=diffs,
        peak_rss=rss_peak,
        weights=weight_bytes,
        kv_budget=kv_budget,
        kv_peak=kv_peak,
    )


if __name__ == "__main__":
    main()
