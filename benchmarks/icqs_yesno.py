"""ICQS on a yes/no task with unbalanced gold labels: BIG-bench `entailed_polarity` (a fact, then a yes/no question
it settles; 99 of its 149 answers are "yes"), fetched at run time from the `bigbench==1.0.0` sdist on PyPI into the
user cache. Runs the comparison grid of benchmarks/icqs_grid.py: old vs new sampler, calibration on/off, plain
ICL, over several seeds. Z_g and Z_b keep the task's label shares (Z_b with the answer flipped), as do the held-out
questions.

    flock /tmp/bench.lock python benchmarks/icqs_yesno.py --test 40 --pool 20 --seeds 5 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icqs_grid import pair_candidates, run_grid  # noqa: E402

from commands.fetch import fetch_package_file  # noqa: E402
from engine import Engine  # noqa: E402
from icqs.io import atomic_write  # noqa: E402
from icqs.task import Example, Task  # noqa: E402

LABELS = ["no", "yes"]
TASK_FILE = "bigbench/benchmark_tasks/entailed_polarity/task.json"


def load_examples() -> tuple[str, list[Example]]:
    data = json.loads(fetch_package_file("bigbench==1.0.0", TASK_FILE, sdist=True).read_text(encoding="utf-8"))
    examples = [
        Example(" ".join(e["input"].split()), max(e["target_scores"], key=e["target_scores"].get))
        for e in data["examples"]
    ]
    return data["task_prefix"], examples


def build(args) -> tuple[Task, list]:
    prefix, data = load_examples()
    order = np.random.default_rng(args.split_seed).permutation(len(data))
    data = [data[i] for i in order]
    good = data[: args.pool]
    bad = [Example(e.x, LABELS[1 - LABELS.index(e.y)]) for e in data[args.pool : 2 * args.pool]]
    test = data[2 * args.pool : 2 * args.pool + args.test]
    task = Task(
        "bigbench-entailed-polarity",
        "{x}\nAnswer: {y}",
        good,
        bad,
        header=prefix.strip() + "\n\n",
        labels=list(LABELS),
        M=args.M,
        N=args.N,
        L=1,
    )
    return task, pair_candidates([(e.x, e.y) for e in test], LABELS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--test", type=int, default=40, help="held-out questions")
    p.add_argument("--pool", type=int, default=20, help="examples in each of Z_g and Z_b")
    p.add_argument("--M", type=int, default=4)
    p.add_argument("--N", type=int, default=8)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadiest on a shared machine)")
    p.add_argument("--out", default="runs/icqs_yesno")
    args = p.parse_args()
    task, cands = build(args)
    engine = Engine.load(args.model, dtype=args.dtype, threads=args.threads, keep_cache=True)
    gold_yes = np.mean([c.y == "yes" for c in cands if c.model == "correct"])
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"BIG-bench entailed_polarity (bigbench 1.0.0): {len(cands) // 2} held-out questions ({gold_yes:.0%} "
        f"gold 'yes') x (correct, wrong answer); |Z_g| = |Z_b| = {args.pool} (Z_g {np.mean([e.y == 'yes' for e in task.good]):.0%} "
        f"'yes'); M = {args.M}, N = {args.N}, L = 1, {args.seeds} seeds; model {args.model or 'SmolLM2-135M'} "
        f"{args.dtype}; {load}",
        "",
    ]
    table, _ = run_grid(engine, task, cands, Path(args.out) / (args.model or "smollm2"), args.seeds, "yes")
    text = "\n".join(lines + table) + "\n"
    atomic_write(Path(args.out) / "results.md", text)
    print(text)


if __name__ == "__main__":
    main()
