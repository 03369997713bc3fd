"""bf16 vs fp32, default vs --deterministic, on the sentiment experiment (issue 14): the share of candidates whose
ICQS / ICQS-Epistemic argmax ratio differs between runs, and whether the leaderboard ranking changes.

The task and candidates are the sentiment experiment's (benchmarks/icqs_sentiment.py: Pang & Lee sentences,
correct vs flipped labels); each combination is one `icqs score` run of its own, then
bench_deterministic.compare_demo_runs compares the run directories.

    .venv/bin/python benchmarks/sentiment_precision.py [--test 16] [--pool 20] [--M 4] [--N 8] [--L 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml
from bench_deterministic import compare_demo_runs
from common import load_average  # noqa: F401  (puts the repository and tests/ on sys.path)
from icqs_sentiment import add_task_args, build

from icqs.candidates import candidate_row
from icqs.cli import main as icqs_main
from icqs.demo import task_yaml

RUNS = {
    "bf16": ["--dtype", "bfloat16"],
    "fp32": ["--dtype", "float32"],
    "bf16-deterministic": ["--dtype", "bfloat16", "--deterministic"],
    "fp32-deterministic": ["--dtype", "float32", "--deterministic"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_task_args(p, test=16, pool=20, L=2)
    p.add_argument("--threads", type=int, default=1, help="the same for every run (deterministic mode pins it)")
    p.add_argument("--out", type=Path, default=Path("runs/sentiment_precision"))
    args = p.parse_args()
    task, cands = build(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "task.yaml").write_text(task_yaml(task), encoding="utf-8")
    (args.out / "candidates.jsonl").write_text(
        "".join(json.dumps(candidate_row(c)) + "\n" for c in cands), encoding="utf-8"
    )
    yaml.safe_load((args.out / "task.yaml").read_text(encoding="utf-8"))  # written as icqs reads it
    print(
        f"{len(cands)} candidates, M={args.M} N={args.N} L={args.L}, threads {args.threads}; "
        f"load average {load_average()}"
    )
    for name, flags in RUNS.items():
        t0 = time.time()
        status = icqs_main(
            [
                "score",
                str(args.out / "task.yaml"),
                str(args.out / "candidates.jsonl"),
                "--out",
                str(args.out / name),
                "--method",
                "icqs",
                "epistemic",
                "--threads",
                str(args.threads),
                "--quiet",
                *flags,
            ]
        )
        assert status == 0, f"{name}: icqs score failed"
        print(f"{name}: {time.time() - t0:.1f} s, load average {load_average()}")
    compare_demo_runs({name: str(args.out / name) for name in RUNS})


if __name__ == "__main__":
    main()
