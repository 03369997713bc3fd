"""Prefix affinity and throughput of `--ray` on the ICQS-shaped job (bench_icqs_workload.build_job, reduced):

    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_distributed.py [--scale 0.1] [--ratios 6] [--demos 8]
        [--demo-sets 2] [--dtype bfloat16] [--model PATH]

Back to back in one process, on a local Ray cluster with this machine's cores: the single-process engine (all
cores), then frontends.ray_runner with 1 worker (all cores), 2 workers (cores / 2 threads each, so they do not
oversubscribe the cores), and 2 workers with naive (round-robin) partitioning. Printed for each: tokens computed
over all workers (and / the single-process job's), the planner's count, the start seconds (the single process: loading
the model; Ray: starting the worker actors, each loading the model, once per run: DistributedEngine.start), the
scoring wall seconds, the busiest worker's seconds inside Engine.score, requests/s on both, and
the largest |logprob| difference from the single-process scores. Then the planner alone (no model run) on the
whole job for 2 to 64 shards: the tokens the workers would compute, prefix-keyed vs naive.
"""

from __future__ import annotations

import argparse
import os
import time

import ray
from bench_icqs_workload import QUESTIONS, add_job_args, build_job
from common import load_average

from engine import Engine
from engine.encoding import encode_pairs
from frontends import ray_runner
from frontends.ray_runner import Cluster, DistributedEngine, plan_shards


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_args(ap, scale=0.1, ratios=6, demos=8, demo_sets=2)
    ap.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    ap.add_argument("--skip-plan", action="store_true", help="skip the planner-only table for the whole job")
    ap.add_argument("--plan-only", action="store_true", help="only the planner-only table (no model runs)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cores = os.cpu_count() or 1
    questions = max(1, round(QUESTIONS * args.scale))
    _, candidates, requests = build_job(questions, args.ratios, args.demos, args.demo_sets)
    if args.plan_only:
        return plan_table(args)
    print(
        f"job: {len(requests)} requests ({len(candidates)} candidates x {args.ratios} ratios x {args.demo_sets} "
        f"demo sets of {args.demos} demos), {args.dtype}, {cores} cores; load average before: {load_average()}"
    )

    t = time.perf_counter()
    eng = Engine.load(args.model, dtype=args.dtype, threads=cores)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    local = eng.score(requests)
    local_s = time.perf_counter() - t
    base = eng.last_stats.tokens_computed
    rows = [("single process", cores, base, base, load_s, local_s, local_s, 0.0)]
    del eng

    ray_runner.init_local_cluster(num_cpus=cores)
    try:
        for name, workers, naive in (
            ("ray, 1 worker", 1, False),
            ("ray, 2 workers", 2, False),
            ("ray, 2 workers, naive", 2, True),
        ):
            threads = max(1, cores // workers)
            with DistributedEngine(
                Cluster(
                    args.model,
                    {"dtype": args.dtype, "threads": threads, "keep_cache": True},
                    workers=workers,
                    naive=naive,
                )
            ) as d:
                t = time.perf_counter()
                d.start()  # the workers, each loading the model: once per run
                start_s = time.perf_counter() - t
                t = time.perf_counter()
                got = d.score(requests)
                wall = time.perf_counter() - t
            s = d.last_stats
            diff = max(abs(a.logprob - b.logprob) for a, b in zip(got, local))
            rows.append(
                (
                    name,
                    threads,
                    s.tokens_computed,
                    sum(d.last_plan.shard_tokens),
                    start_s,
                    wall,
                    max(d.busy_seconds.values()),
                    diff,
                )
            )
            print(
                f"{name}: seconds inside Engine.score per worker: "
                f"{', '.join(f'{v:.1f}' for v in sorted(d.busy_seconds.values()))}"
            )
    finally:
        ray.shutdown()

    print(
        "\n| runner | threads/worker | tokens computed | x single | planned | start s | score wall s "
        "| busiest worker s | req/s (wall) | req/s (busy) | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, threads, computed, planned, start_s, wall, busy, diff in rows:
        print(
            f"| {name} | {threads} | {computed:,} | {computed / base:.3f} | {planned:,} | {start_s:.1f} | {wall:.1f} "
            f"| {busy:.1f} "
            f"| {len(requests) / wall:.1f} | {len(requests) / busy:.1f} | {diff:.2g} |"
        )
    print(f"load average after: {load_average()}")

    if not args.skip_plan:
        plan_table(args)


def plan_table(args):
    """The planner alone on the whole ICQS job and on one with 4x the questions: tokens the workers would compute."""
    tokenizer = Engine.load(args.model, dtype=args.dtype).tokenizer
    for questions in (QUESTIONS, 4 * QUESTIONS):
        _, _, job = build_job(questions, 11, 16, 4)
        encoded = encode_pairs(tokenizer, job)
        one = plan_shards(encoded, 1).shard_tokens[0]
        print(f"\nplanner only, the ICQS job with {questions} questions ({len(job)} requests, {one:,} unique tokens):")
        print("| shards | prefix-keyed tokens (x single) | largest shard / mean | keys | naive tokens (x single) |")
        print("|---|---|---|---|---|")
        for shards in (2, 4, 8, 16, 32, 64, 128):
            p, n = plan_shards(encoded, shards), plan_shards(encoded, shards, naive=True)
            mean = sum(p.shard_tokens) / shards
            print(
                f"| {shards} | {sum(p.shard_tokens):,} ({sum(p.shard_tokens) / one:.3f}) | "
                f"{max(p.shard_tokens) / mean:.2f} | {p.keys} | {sum(n.shard_tokens):,} "
                f"({sum(n.shard_tokens) / one:.2f}) |"
            )
    print(f"(frontends.ray_runner cuts {ray_runner.SHARDS_PER_WORKER} shards per worker)")


if __name__ == "__main__":
    main()
