"""Where a step's time goes: the engine loop's phases and, inside them, the op categories, for the ICQS-shaped
job, plain unshared scoring and decode (torch.profiler on the CPU, one thread by default).

    .venv/bin/python benchmarks/profile_step.py [--parts icqs,plain,decode] [--scale 0.05] [--threads 1]

The loop's phases are marked with torch.profiler.record_function by wrapping the engine's own methods for the run
(schedule, step building, the model's forward, the LM head for scored rows, the logits of sampled rows,
postprocess); each op's self CPU time is charged to the phase it ran in and to a category (GEMM, attention,
elementwise, KV store, copies and indexing, other ops); a phase's own self time is its Python. Time outside every
phase (the job's bookkeeping, progress, tokenizing) is the rest of the wall time. The profiler adds overhead to
each op, so read shares, not absolute times; the unprofiled wall time of the same job is printed beside.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import torch
from common import load_average, machine, table
from torch.profiler import ProfilerActivity, profile, record_function

from engine import Engine
from engine.engine import DTYPES
from engine.loader import load_model_files

CATEGORIES = [  # first match wins; matched against the op's name
    (
        "GEMM",
        re.compile(
            r"linear_pointwise|linear_panels|target_logprobs|addmm|\bmm\b|aten::mm|bmm|matmul|aten::linear|"
            r"baddbmm"
        ),
    ),
    ("attention", re.compile(r"attention|softmax|scaled_dot|segment")),
    (
        "elementwise",
        re.compile(
            r"rms_norm|rope|silu|swiglu|aten::(add|mul|sub|div|rsqrt|pow|mean|neg|exp|log|"
            r"sigmoid|cos|sin|cat|where|maximum|max|sum|logsumexp|gt|lt|eq|ge)"
        ),
    ),
    ("KV store", re.compile(r"index_copy|index_put|store_kv")),
    (
        "copies, indexing",
        re.compile(
            r"copy|index|gather|embedding|slice|select|view|reshape|contiguous|to\b|_to_|"
            r"clone|empty|zeros|full|tensor|as_strided|narrow|split|stack|arange"
        ),
    ),
]
PHASES = ("schedule", "build_step", "forward", "lm_head", "logits", "sample", "postprocess")


def category(name: str) -> str:
    return next((label for label, pattern in CATEGORIES if pattern.search(name)), "other ops")


def wrap(owner, attr: str, phase: str):
    fn = getattr(owner, attr)

    def wrapped(*args, **kwargs):
        with record_function(f"phase:{phase}"):
            return fn(*args, **kwargs)

    setattr(owner, attr, wrapped)
    return lambda: setattr(owner, attr, fn)


def instrument(engine) -> list:
    """Marks the loop's phases on this engine (instance attributes shadow the methods; module functions patched);
    returns the undo functions."""
    import engine.engine as engine_module

    undo = [
        wrap(engine.scheduler, "schedule", "schedule"),
        wrap(engine.scheduler, "advance", "postprocess"),
        wrap(engine.scheduler, "record", "postprocess"),
        wrap(engine_module.PendingHead, "result", "lm_head"),  # the score rows read back
        wrap(engine.model, "forward", "forward"),
        wrap(engine.model, "target_logprobs", "lm_head"),
        wrap(engine.model, "logits", "logits"),
        wrap(engine_module, "build_step", "build_step"),
    ]
    if hasattr(engine_module, "sample"):
        undo.append(wrap(engine_module, "sample", "sample"))
    return undo


def breakdown(prof, wall_us: float) -> tuple[dict, dict]:
    """(phase -> category -> self us), (phase -> python self us)."""
    ops: dict = defaultdict(lambda: defaultdict(float))
    python: dict = defaultdict(float)
    for ev in prof.events():
        scope, parent = None, ev
        while parent is not None:
            if parent.name.startswith("phase:"):
                scope = parent.name[6:]
                break
            parent = parent.cpu_parent
        if ev.name.startswith("phase:"):
            python[ev.name[6:]] += ev.self_cpu_time_total
        elif ev.name.startswith("ProfilerStep"):
            continue
        else:
            ops[scope or "outside phases"][category(ev.name)] += ev.self_cpu_time_total
    return ops, python


def run_job(name: str, fn, engine, threads: int) -> list[list]:
    fn()  # warm-up (and the unprofiled time)
    t = time.perf_counter()
    fn()
    plain_wall = time.perf_counter() - t
    undo = instrument(engine)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            fn()
            wall_us = (time.perf_counter() - t) * 1e6
    finally:
        for u in undo:
            u()
    ops, python = breakdown(prof, wall_us)
    accounted = sum(sum(c.values()) for c in ops.values()) + sum(python.values())
    cats = [c for c, _ in CATEGORIES] + ["other ops"]
    rows = []
    for phase in list(PHASES) + ["outside phases"]:
        row_ops = ops.get(phase, {})
        total = sum(row_ops.values()) + python.get(phase, 0.0)
        if total:
            rows.append(
                [phase, 100 * total / wall_us]
                + [100 * row_ops.get(c, 0.0) / wall_us for c in cats]
                + [100 * python.get(phase, 0.0) / wall_us]
            )
    rows.append(["not seen by the profiler", 100 * max(wall_us - accounted, 0.0) / wall_us] + [0.0] * len(cats) + [0.0])
    print(
        f"\n## {name} ({threads} thread(s); unprofiled {plain_wall:.2f} s, profiled {wall_us / 1e6:.2f} s; "
        f"load average {load_average()}): % of the profiled wall time\n"
    )
    print(table(["phase", "total %"] + [f"{c} %" for c in cats] + ["Python %"], rows))
    totals = defaultdict(float)
    for row_ops in ops.values():
        for c, v in row_ops.items():
            totals[c] += v
    print(
        "\nwhole job by category: "
        + ", ".join(f"{c} {100 * totals[c] / wall_us:.1f}%" for c in cats)
        + f", Python in phases {100 * sum(python.values()) / wall_us:.1f}%"
    )
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--parts", default="icqs,plain,decode")
    ap.add_argument("--scale", type=float, default=0.05, help="fraction of the ICQS job's 50 questions")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    config, weights, tok = load_model_files(args.model)
    engine = Engine(config, weights, tok, dtype=DTYPES[args.dtype])
    print(f"# profile_step ({machine()}; load average {load_average()})")
    if "icqs" in parts:
        from bench_icqs_workload import QUESTIONS, build_job

        _, _, requests = build_job(max(1, round(QUESTIONS * args.scale)), 11, 16, 4)
        run_job(
            f"ICQS-shaped job, {len(requests)} requests, shared", lambda: engine.score(requests), engine, args.threads
        )
    if "plain" in parts:
        from bench_scoring import make_requests

        pairs = make_requests(64)
        run_job(
            "plain scoring, 64 unrelated pairs, unshared",
            lambda: engine.score(pairs, share_prefix=False),
            engine,
            args.threads,
        )
    if "decode" in parts:
        from bench_generation import prompts

        ids = prompts(tok, args.prompts)
        run_job(
            f"decode, {args.prompts} prompts x {args.new_tokens} tokens",
            lambda: engine.generate(ids, max_tokens=args.new_tokens),
            engine,
            args.threads,
        )


if __name__ == "__main__":
    main()
