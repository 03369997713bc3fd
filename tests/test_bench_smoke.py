"""Smoke tests of the engine benchmarks on a tiny model: they run end to end through their main functions and their
numbers make sense (no timing assertions: the machine may be shared)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_host_phases  # noqa: E402
import bench_icqs_workload  # noqa: E402
import bench_scoring  # noqa: E402


def test_icqs_workload_benchmark(tiny_model_dir, capsys):
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
            "6",
            "--skip-llamacpp",
        ]
    )
    stats = out["stats"]
    assert out["requests"] == stats["requests"] == 3 * 2 * 2 * 4  # ratios x demo sets x questions x models
    # the demo sets and each question are computed once, not once per request
    assert 0 < stats["tokens_computed"] == stats["unique_tokens"] < stats["tokens_requested"] / 3
    assert stats["forward_steps"] >= 1 and stats["preemptions"] == 0
    # sharing changes nothing: the sample scored without sharing, and by transformers, gives the same log-probs
    assert out["diffs"]["engine_unshared"] <= 1e-5
    assert out["diffs"]["transformers"] <= 1e-4
    assert out["diffs"]["fp32_unshared"] <= 1e-5
    assert 0 < out["kv_peak"] <= out["kv_budget"] and out["weights"] > 0 and out["peak_rss"] > out["weights"]
    printed = capsys.readouterr().out
    assert "llama.cpp skipped: --skip-llamacpp" in printed
    assert "| transformers, one forward per request, sample | 6 |" in printed


def test_scoring_benchmark(tiny_model_dir):
    out = bench_scoring.main(["--model", str(tiny_model_dir), "--dtype", "float32", "--requests", "3", "--repeat", "1"])
    assert out["requests"] == 3
    assert out["tokens_computed"] == out["tokens_requested"] > 3 * 100  # no sharing: every token computed
    assert out["spread"]["engine float32"] <= 1e-4
    assert out["engine_tokens_per_s"] > 0 and out["hf_tokens_per_s"] > 0


def test_host_phases_benchmark(capsys):
    """Each call's phases: host work before the loop, the loop holding its launches and finishes, none after the
    call's end."""
    out = bench_host_phases.main(["--questions", "2", "--calls", "2"])
    assert out["requests"] == len(bench_icqs_workload.build_job(2, 11, 16, 4)[2])
    for call in out["calls"]:
        assert call["host_before_loop_s"] > 0 and call["after_s"] >= 0 and call["steps"] >= 1
        assert 0 < call["launch_s"] + call["finish_s"] <= call["loop_s"]
    assert "| call | wall s | before the first launch s |" in capsys.readouterr().out
