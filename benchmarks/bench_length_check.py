"""The length check a score run makes before any work (icqs.score_run.check_lengths), against tokenizing every
request whole (encode_pairs, as the engine does), on the demo task scaled up: same verdicts, and how long each takes.

    python benchmarks/bench_length_check.py --copies 25      # 2000 candidates x 15 demo sets (ICQS + Epistemic)
"""

from __future__ import annotations

import argparse
import time

from engine import Engine
from engine.encoding import encode_pairs
from icqs.candidates import Candidate
from icqs.demo import demo_candidates, demo_task
from icqs.methods import METHODS
from icqs.score_run import check_lengths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=25, help="copies of the demo's 80 candidates (each x made unique)")
    p.add_argument("--methods", default="icqs,epistemic")
    args = p.parse_args()
    eng = Engine.load(None, dtype="float32")
    task = demo_task()
    cands = [
        Candidate(f"c{i}", c.model, f"{c.x} number {i}", c.y, line=i + 1)
        for i, c in enumerate(demo_candidates(task) * args.copies)
    ]
    methods = args.methods.split(",")
    t0 = time.perf_counter()
    check_lengths(eng, task, cands, methods, "coupled")
    quick = time.perf_counter() - t0
    t0 = time.perf_counter()
    jobs = [j for m in methods for j in METHODS[m].requests(task, cands, "coupled")]
    encoded = encode_pairs(eng.tokenizer, [(j.context, j.continuation) for j in jobs])
    longest = max(len(a) + len(b) + j.generated for j, (a, b) in zip(jobs, encoded))
    whole = time.perf_counter() - t0
    print(
        f"{len(cands)} candidates, {len(jobs)} requests, longest {longest} tokens (limit {eng.max_request_tokens}): "
        f"check_lengths {quick:.2f} s, every request tokenized whole {whole:.2f} s ({whole / quick:.0f}x)"
    )


if __name__ == "__main__":
    main()
