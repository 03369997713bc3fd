"""benchmarks/gpu_check.py --smoke: the GPU check at tiny sizes on the CPU (Triton interpreter), run the way the GPU
machine runs it (a fresh interpreter from the checkout, PYTHONPATH=.) with the packages that machine lacks made
unimportable, so that a new import of one of them on the check's path fails here before it costs a GPU run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# found, not imported: importing triton here would turn the interpreter off for the kernel tests collected later
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[1]
# not in the GPU machine's image (Python 3.12, torch, triton, transformers and its dependencies, safetensors,
# tokenizers, numpy, PyYAML, jinja2, pytest): the engine imports them only on the paths that need them
ABSENT = (
    "gguf",
    "jsonschema",
    "scipy",
    "sklearn",
    "matplotlib",
    "pandas",
    "pyarrow",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "ray",
    "lm_eval",
    "hypothesis",
    "openai",
    "llama_cpp",
    "schemathesis",
)


@pytest.fixture(scope="module")
def gpu_image_env(tmp_path_factory) -> dict:
    """The environment of a child interpreter in which the ABSENT packages cannot be imported (a sitecustomize
    that marks them missing in sys.modules: `import scipy` raises ModuleNotFoundError and find_spec says absent)."""
    site = tmp_path_factory.mktemp("gpu_image")
    (site / "sitecustomize.py").write_text(f"import sys\nfor _m in {ABSENT!r}:\n    sys.modules[_m] = None\n")
    path = os.pathsep.join([str(site), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return dict(env, PYTHONPATH=path)


def run(args, env, timeout):
    return subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_image_lacks_the_blocked_packages(gpu_image_env):
    for name in ("jsonschema", "scipy.special"):
        out = subprocess.run(
            [sys.executable, "-c", f"import {name}"], env=gpu_image_env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, name


def test_bad_arguments_are_refused(gpu_image_env, tmp_path):
    out = run(["--out", str(tmp_path / "a"), "--smoke", "--cap", "nosuch=3"], gpu_image_env, 120)
    assert out.returncode == 2 and "error: --cap 'nosuch=3'" in out.stderr
    out = run(["--out", str(tmp_path / "b"), "--smoke", "--sections", "bounds,speed"], gpu_image_env, 120)
    assert out.returncode == 2 and "unknown section 'speed'" in out.stderr
    (tmp_path / "file").write_text("x")
    out = run(["--out", str(tmp_path / "file"), "--smoke"], gpu_image_env, 120)
    assert out.returncode == 2 and "exists and is not a folder" in out.stderr
    if not _cuda():
        out = run(["--out", str(tmp_path / "c")], gpu_image_env, 120)
        assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr
    assert not (tmp_path / "a" / "gpu_check.json").exists()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_smoke_run(gpu_image_env, tmp_path):
    """Every section at tiny sizes; the last one given a cap of 1 s, shorter than its start: it is recorded as cut
    off and the sections before it keep their results."""
    out = run(
        [
            "--out",
            str(tmp_path),
            "--smoke",
            "--sections",
            "bounds,kernels,parity,speed_8b,speed_1b",
            "--cap",
            "speed_1b=1",
        ],
        gpu_image_env,
        900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report.get("errors") is None, report["errors"]
    status = {name: s["status"] for name, s in report["sections"].items()}
    assert status == {"bounds": "ok", "kernels": "ok", "parity": "ok", "speed_8b": "ok", "speed_1b": "cut off"}

    assert report["device"] and report["matmul_tflops"] > 0 and report["bounds"]["bandwidth_gbs"] > 0
    kernels = report["kernels"]
    assert kernels["failed"] == 0 and kernels["passed"] >= 10 + 3, kernels
    assert {c["op"] for c in kernels["cases"]} == {
        "cascade_attention",
        "varlen_causal_attention",
        "segment_attention_merge",
        "rms_norm",
        "rope_store_kv",
        "silu_and_mul",
        "target_logprobs",
    }
    assert all(c["ok"] for c in kernels["cases"])
    # SDPA computes the prefill and shared-prefix cases (its math backend on the CPU): the same outputs
    sdpa = [c for c in kernels["cases"] if "sdpa_max_abs" in c]
    assert len(sdpa) == 3 and all(c["sdpa_ok"] and c["sdpa_max_abs"] < 1e-5 for c in sdpa)
    assert kernels["suite"]["passed"] >= 3 and kernels["suite"]["failed"] == 0
    assert kernels["timings"] and kernels["timings"][0]["triton_ms"] > 0

    parity = report["parity"]
    assert set(parity["archs"]) == {"llama", "qwen2", "qwen3", "gemma3"}
    assert 0 < parity["fp32_max_abs"] <= 1e-4 and parity["fp32_ok"]
    assert parity["bf16_ok"] and parity["greedy_equal"]
    assert all(0 < a["bf16_max_abs"] <= a["bf16_tol"] for a in parity["archs"].values())
    from kernels import native_ops

    if native_ops.load():  # the deterministic mode's CPU attention is the native op
        assert parity["deterministic_bitwise"] is True and len(parity["deterministic"]) == 2

    speed = report["speed"]
    assert set(speed) == {"icqs_8b", "plain_8b", "decode_64"}  # speed_1b was cut off before any result
    for job in ("icqs_8b", "plain_8b"):
        s = speed[job]
        assert s["mfu"] > 0 and s["vs_hf"] > 0 and s["hf_requests_timed"] > 0 and s["max_abs"] < 0.5, s
        assert s["engine_peak_gib"] > 0 and s["hf_peak_gib"] > 0
    # the ICQS job shares its demo sets: far fewer tokens computed than requested
    assert speed["icqs_8b"]["tokens_computed"] < speed["icqs_8b"]["tokens_requested"] / 2
    assert speed["plain_8b"]["tokens_computed"] == speed["plain_8b"]["tokens_requested"]
    assert speed["decode_64"]["vs_hf"] > 0 and speed["decode_64"]["tokens_computed"] > 0

    md = (tmp_path / "gpu_check.md").read_text()
    assert "| speed_1b | cut off |" in md and "## Kernels" in md and "## Parity" in md and "## Speed" in md
    assert (tmp_path / "logs" / "parity.log").read_text()
