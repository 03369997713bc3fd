"""Cost of the deterministic mode on the ICQS-shaped job (benchmarks/bench_icqs_workload.py's requests): the same
job scored by the default engine and by the deterministic one, interleaved (default, deterministic, default, ...),
candidate-scores/s of each and their ratio; and how much the bf16 scores move when the job changes (the first
`--probe` requests scored alone vs inside the whole job) in each mode.

    flock /tmp/bench.lock .venv/bin/python benchmarks/bench_deterministic.py [--scale 0.1] [--rounds 2]

`--demo-runs NAME=DIR ...` instead compares finished `icqs demo --out DIR` runs (e.g. bf16 and fp32, with and
without --deterministic): for each pair, the share of candidates whose ICQS argmax ratio differs, and each run's
leaderboard ranking.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_icqs_workload import QUESTIONS, add_job_args, build_job
from common import load_average, machine

from engine import Engine
from engine.loader import load_model_files


def compare_demo_runs(runs: dict[str, str]) -> None:
    """Argmax-ratio disagreement between `icqs demo` runs, and their leaderboard rankings (ICQS, ICQS-Epistemic)."""
    import itertools
    import json
    from pathlib import Path

    scores, ranks = {}, {}
    for name, out in runs.items():
        rows = [json.loads(line) for line in (Path(out) / "scores.jsonl").read_text().splitlines()]
        scores[name] = {(r["method"], r["id"]): r["score"] for r in rows if r["method"] in ("icqs", "epistemic")}
        for board in json.loads((Path(out) / "leaderboard.json").read_text()):
            if board["method"] in ("icqs", "epistemic"):
                models = board["measures"]["score"]["models"]
                ranks[name, board["method"]] = " > ".join(m["model"] for m in sorted(models, key=lambda m: m["rank"]))
    for method in ("icqs", "epistemic"):
        print(f"{method}: leaderboard ranking per run")
        for name in runs:
            print(f"  {name:28} {ranks[name, method]}")
        for a, b in itertools.combinations(runs, 2):
            keys = [k for k in scores[a] if k[0] == method]
            differ = sum(scores[a][k] != scores[b][k] for k in keys)
            print(f"  argmax ratio differs, {a} vs {b}: {differ}/{len(keys)} = {100 * differ / len(keys):.1f}%")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo-runs", nargs="+", metavar="NAME=DIR", help="compare finished `icqs demo` runs")
    add_job_args(ap, scale=0.1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2, help="timed runs of each mode, interleaved")
    ap.add_argument("--probe", type=int, default=20, help="requests scored alone to measure the job dependence")
    args = ap.parse_args(argv)
    if args.demo_runs:
        compare_demo_runs(dict(item.split("=", 1) for item in args.demo_runs))
        return {}
    print(f"# deterministic vs default, ICQS-shaped job ({machine()}; load average {load_average()})")
    config, weights, tok = load_model_files(args.model)
    engines = {
        det: Engine(config, weights, tok, dtype=args.dtype, token_budget=args.token_budget, deterministic=det)
        for det in (False, True)
    }
    questions = max(1, round(QUESTIONS * args.scale))
    _, candidates, requests = build_job(questions, args.ratios, args.demos, args.demo_sets, 0)
    print(f"{len(requests)} requests ({questions} questions), {args.dtype}, token budget {args.token_budget}")
    for eng in engines.values():
        eng.score(requests[:2])  # warm-up
    times = {False: [], True: []}
    scores = {}
    for _ in range(args.rounds):
        for det, eng in engines.items():
            t0 = time.perf_counter()
            res = eng.score(requests)
            times[det].append(time.perf_counter() - t0)
            scores[det] = [r.logprob for r in res]
    rate = {det: len(requests) / min(ts) for det, ts in times.items()}
    drift = {}
    for det, eng in engines.items():
        alone = [r.logprob for r in eng.score(requests[: args.probe])]
        drift[det] = float(np.max(np.abs(np.array(alone) - np.array(scores[det][: args.probe]))))
    modes = np.abs(np.array(scores[True]) - np.array(scores[False]))
    print(
        f"default:       {rate[False]:8.1f} candidate-scores/s  (runs: {', '.join(f'{t:.1f}' for t in times[False])} s)"
    )
    print(
        f"deterministic: {rate[True]:8.1f} candidate-scores/s  (runs: {', '.join(f'{t:.1f}' for t in times[True])} s)"
    )
    print(
        f"deterministic / default: {rate[True] / rate[False]:.3f} ({100 * (1 - rate[True] / rate[False]):+.1f}% slower)"
    )
    print(
        f"first {args.probe} requests alone vs in the job, max |diff| nats: default {drift[False]:.3g}, "
        f"deterministic {drift[True]:.3g}"
    )
    print(f"deterministic vs default scores: max |diff| {modes.max():.3g}, mean {modes.mean():.3g} nats")
    print(f"load average at the end: {load_average()}")
    return dict(rate=rate, drift=drift, requests=len(requests))


if __name__ == "__main__":
    main()
