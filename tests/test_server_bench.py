"""The server load benchmark (benchmarks/bench_server.py) end to end on a tiny model: a `python -m engine serve`
subprocess on 127.0.0.1, a few concurrent clients, both endpoints; every score equals the in-process score. Its
vLLM side by side (benchmarks/bench_vllm.py) needs vLLM's own virtualenv, which CI does not have: only importing
it is checked here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_server  # noqa: E402


def test_server_benchmark_scores_equal_in_process(tiny_model_dir):
    out = bench_server.main(
        [
            "--model",
            str(tiny_model_dir),
            "--scale",
            "0.02",
            "--ratios",
            "2",
            "--demo-sets",
            "1",
            "--demos",
            "2",
            "--clients",
            "3",
            "--per-call",
            "3",
            "--threads",
            "1",
        ]
    )
    assert set(out) == {"/v1/score", "/v1/completions"}
    for path, res in out.items():
        assert res["errors"] == 0 and res["max_abs_diff"] <= 1e-5 and res["rate"] > 0, (path, res)


def test_vllm_benchmark_is_importable_without_vllm():
    import bench_vllm
    import vllm_worker  # noqa: F401  (imports vLLM only inside main)

    assert bench_vllm.continuation_sum([None, -1.0, -2.0, -0.5], 2) == -2.5
    assert bench_vllm.continuation_sum([None, None, -2.0], 1) != bench_vllm.continuation_sum([None, None, -2.0], 1)
