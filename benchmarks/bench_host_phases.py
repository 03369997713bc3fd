"""The host's share of a closed scoring job: the ICQS-shaped job on a tiny model (two layers of width 64, random
weights, the GPU check's tokenizer), so that the forward costs little and what is timed is the engine's own work:
encoding and checking the requests, adding them to the prefix tree, planning, building and recording the steps.

    .venv/bin/python benchmarks/bench_host_phases.py [--questions 50] [--calls 3] [--threads 1]

Each `Engine.score` call is cut at the loop's first launch and at its last finish (the GPU check's timeline wraps
`Engine._launch` and `Engine._finish`): the time before the first launch is host work no device step can hide; in
the pipelined loop the host's work can run while the device computes (on a GPU; on the CPU the forward runs in the
host's thread, so nothing overlaps here); what comes after the last finish is collecting the results.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_icqs_workload import QUESTIONS, build_job
from common import load_average, machine, table
from gpu_check import LoopTimeline, speed_tokenizer

from engine import Engine
from engine.config import ModelConfig
from engine.encoding import encode_pairs


def tiny_engine(tok) -> Engine:
    from tiny_models import hf_config, random_weights

    cfg = hf_config("llama", vocab_size=tok.vocab_size, max_position_embeddings=4096)
    weights = random_weights(cfg, seed=0, std=0.02, device="cpu", dtype=torch.float32)
    return Engine(ModelConfig.from_hf(cfg), weights, tok, dtype=torch.float32, kv_tokens=65536, token_budget=8192)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--questions", type=int, default=QUESTIONS, help="questions of the ICQS-shaped job (50: 8,800 requests)"
    )
    ap.add_argument("--calls", type=int, default=3, help="timed calls of Engine.score")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = speed_tokenizer()
    engine = tiny_engine(tok)
    ids = encode_pairs(tok, build_job(args.questions, 11, 16, 4)[2])
    engine.score(ids[:50])  # warm-up
    print(f"# bench_host_phases ({machine()}; load average {load_average()})")
    rows, calls = [], []
    for i in range(args.calls):
        with LoopTimeline(engine) as timeline:
            t0 = time.perf_counter()
            engine.score(ids)
            wall = time.perf_counter() - t0
        s = timeline.summary(t0)
        after = wall - s["host_before_loop_s"] - s["loop_s"]
        calls.append({"wall_s": wall, "after_s": after, "steps": engine.last_stats.forward_steps, **s})
        rows.append([i + 1, wall, s["host_before_loop_s"], s["loop_s"], s["launch_s"], s["finish_s"], after])
    print(f"\n{len(ids):,} requests, {engine.last_stats.forward_steps} steps (load average {load_average()})\n")
    print(
        table(
            ["call", "wall s", "before the first launch s", "loop s", "in launches s", "in finishes s", "after s"], rows
        )
    )
    return {"requests": len(ids), "calls": calls}


if __name__ == "__main__":
    main()
