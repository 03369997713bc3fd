"""Smoke tests of the engine-loop benchmarks on a tiny model: the streamed ICQS job (producer thread, AsyncEngine)
gives the closed job's scores with the same tokens computed; generation, the judge workload and the threads
comparison run end to end (no timing assertions: the machine may be shared)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_generation  # noqa: E402
import bench_icqs_workload  # noqa: E402


def test_streamed_icqs_job_matches_the_closed_job(tiny_model_dir, capsys):
    out = bench_icqs_workload.main(
        [
            "--model",
            str(tiny_model_dir),
            "--dtype",
            "float32",
            "--scale",
            "0.04",
            "--ratios",
            "3",
            "--demo-sets",
            "2",
            "--demos",
            "2",
            "--sample",
            "2",
            "--skip-llamacpp",
            "--skip-hf",
            "--fp32-check",
            "0",
            "--stream",
        ]
    )
    for mode in ("ids", "text"):
        assert out["stream"][mode]["token_ratio"] <= 1.1  # in-flight sharing and the cache: no recomputation
    printed = capsys.readouterr().out
    assert "streamed, token ids" in printed and "| max abs diff vs closed |" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| streamed")]
    assert all(float(r.split("|")[-2]) <= 1e-5 for r in rows)


def test_generation_judge_and_threads_benchmarks(tiny_model_dir):
    out = bench_generation.main(
        [
            "--model",
            str(tiny_model_dir),
            "--dtype",
            "float32",
            "--prompts",
            "3",
            "--new-tokens",
            "4",
            "--repeat",
            "1",
            "--judge-scorings",
            "30",
            "--judge-tokens",
            "3",
            "--judge-demos",
            "1",
            "--thread-requests",
            "2",
        ]
    )
    gen = out["gen"]
    assert gen["engine (this tree)"]["tokens"] > 0 and gen["transformers generate, batch 3"]["tokens"] > 0
    judge = out["judge"]
    assert judge["tokens_computed"] - judge["generated"] <= judge["unique"] + 64 * 30  # prefix computed once
    assert len(out["threads"]) == 6
