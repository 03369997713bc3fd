"""The ICQS-shaped scoring job through the server, against the same job in-process (a closed `Engine.score`).

    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_server.py [--scale 0.1] [--clients 32]
                                                                     [--per-call 20] [--dtype float32]

The requests are those of benchmarks/bench_icqs_workload.py (demo set + question, answer). A server process
(`python -m engine serve`, loopback only) gets them from --clients concurrent clients (asyncio + httpx), twice:
through /v1/score (--per-call consecutive pairs a call, i.e. candidates of one demo set) and through
/v1/completions as lm-evaluation-harness's local-completions sends them (token ids, echo, logprobs 1, max_tokens 1,
one prompt a call; the log-likelihood is the sum of token_logprobs[ctxlen:-1]). The in-process job runs in this
process while the server idles, before and after the server runs (interleaved). Printed: candidate-scores/s and
the ratio to in-process, p50/p99 latency of a call, errors, and the largest difference from the in-process
scores (float32 by default, so equal means within 1e-5)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
from bench_icqs_workload import QUESTIONS, add_job_args, build_job
from common import ROOT, load_average, machine, table, timed

from engine import Engine
from engine.encoding import encode_pairs
from frontends.client import Client


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_args(ap, scale=0.1)
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients")
    ap.add_argument("--per-call", type=int, default=20, help="pairs per /v1/score call")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=None, help="model threads, in-process and in the server")
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--skip-completions", action="store_true")
    return ap.parse_args(argv)


def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "serve",
        "--port",
        "0",
        "--dtype",
        args.dtype,
        "--token-budget",
        str(args.token_budget),
        "--max-queue",
        "100000",
        "--served-model-name",
        "bench",
    ]
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if m := re.search(r"serving \S+ on (http://\S+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    raise SystemExit("the server did not start")


def score_calls(requests, per_call: int) -> list[dict]:
    """/v1/score bodies: `per_call` consecutive (context, continuation) pairs each."""
    return [{"pairs": [list(p) for p in requests[i : i + per_call]]} for i in range(0, len(requests), per_call)]


def echo_calls(prompts) -> list[dict]:
    """/v1/completions bodies as lm-evaluation-harness's local-completions sends a loglikelihood request: token
    ids (here context + continuation), echo, logprobs 1, max_tokens 1, temperature 0; one prompt a call."""
    return [
        {"prompt": ctx + cont, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0} for ctx, cont in prompts
    ]


def echo_logprobs(result: dict | None) -> list | None:
    """The prompt's per-position log-probs of an echo answer (position 0: None), the generated token left out."""
    return result["choices"][0]["logprobs"]["token_logprobs"][:-1] if result else None


def candidate_scores(path: str, results, calls, encoded) -> list[float]:
    """Each request's log P(continuation | context) from the answers of `path` (NaN where a call failed)."""
    if path == "/v1/score":
        return [
            d["logprob"] if r else np.nan
            for r, call in zip(results, calls)
            for d in (r["data"] if r else [None] * len(call["pairs"]))
        ]
    return [float(np.sum(echo_logprobs(r)[len(ctx) :])) if r else np.nan for r, (ctx, _) in zip(results, encoded)]


async def run_clients(url: str, calls: list[dict], path: str, clients: int):
    """Send every call (a JSON body) with `clients` concurrent clients; (responses, latencies, errors, wall s)."""
    import httpx

    results, latencies, errors = [None] * len(calls), [], []
    todo = iter(range(len(calls)))

    async def client():
        async with httpx.AsyncClient(base_url=url, timeout=600) as http:
            for i in todo:
                t0 = time.perf_counter()
                try:
                    r = await http.post(path, json=calls[i])
                    r.raise_for_status()
                    results[i] = r.json()
                except Exception as e:  # noqa: BLE001 - counted and reported
                    errors.append(f"{type(e).__name__}: {e}")
                latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return results, latencies, errors, time.perf_counter() - t0


def main(argv=None):
    args = parse_args(argv)
    questions = max(1, round(QUESTIONS * args.scale))
    _, candidates, requests = build_job(questions, args.ratios, args.demos, args.demo_sets)
    print(f"# Server vs in-process, ICQS-shaped job ({machine()}; load average {load_average()})")
    print(
        f"{len(requests)} requests ({questions} questions, {len(candidates)} candidates), {args.dtype}, "
        f"{args.clients} clients, {args.per_call} pairs per /v1/score call"
    )
    opts = dict(dtype=args.dtype, token_budget=args.token_budget)
    if args.threads:
        opts["threads"] = args.threads
    engine = Engine.load(args.model, **opts)
    engine.score(requests[:2])  # warm-up

    def in_process():
        with timed() as t:
            res = engine.score(requests)
        return [r.logprob for r in res], t.wall

    want, wall_a = in_process()
    proc, url = start_server(args)
    rows = []
    try:
        client = Client(url)
        encoded = encode_pairs(client.tokenizer, requests)
        client.score(requests[:2])  # warm-up
        runs = {"/v1/score": score_calls(requests, args.per_call)}
        if not args.skip_completions:
            runs["/v1/completions"] = echo_calls(encoded)
        got = {}
        for path, calls in runs.items():
            results, lat, errors, wall = asyncio.run(run_clients(url, calls, path, args.clients))
            got[path] = (candidate_scores(path, results, calls, encoded), lat, errors, wall)
        client.close()
    finally:
        proc.terminate()
        proc.wait(60)
    want_b, wall_b = in_process()
    wall0 = (wall_a + wall_b) / 2
    rows.append(
        [
            "in-process Engine.score (closed job), mean of before/after",
            1,
            f"{wall_a:.2f} / {wall_b:.2f}",
            len(requests) / wall0,
            1.0,
            "-",
            "-",
            0,
            f"{np.max(np.abs(np.subtract(want, want_b))):.3g}",
        ]
    )
    out = {}
    for path, (scores, lat, errors, wall) in got.items():
        diff = np.nanmax(np.abs(np.subtract(scores, want))) if not np.all(np.isnan(scores)) else float("nan")
        out[path] = dict(errors=len(errors), max_abs_diff=float(diff), rate=len(requests) / wall)
        rows.append(
            [
                f"server {path}",
                args.clients,
                f"{wall:.2f}",
                len(requests) / wall,
                wall0 / wall,
                f"{np.percentile(lat, 50) * 1e3:.0f}",
                f"{np.percentile(lat, 99) * 1e3:.0f}",
                len(errors),
                f"{diff:.3g}",
            ]
        )
        if errors:
            print(f"{path}: {len(errors)} errors, first: {errors[0]}")
    print(
        table(
            [
                "runner",
                "clients",
                "wall s",
                "candidate-scores/s",
                "vs in-process",
                "p50 ms",
                "p99 ms",
                "errors",
                "max abs diff vs in-process",
            ],
            rows,
        )
    )
    print(f"load average at the end: {load_average()}")
    return out


if __name__ == "__main__":
    main()
