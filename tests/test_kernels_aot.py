"""Every Triton kernel compiled ahead of time for sm_80 (A100) and sm_90 (H100) on this machine, no GPU needed.

The launches are those a GPU step makes (kernels/aot.py runs each launcher with the GPU tile choices on meta
tensors of a model's widths); each must lower to a cubin and fit the target's shared memory per block. The
compiles run in a subprocess without TRITON_INTERPRET: the interpreter the other kernel tests use on a CPU and
Triton's compiler cannot share one process. The table of shared memory per kernel is printed (`pytest -s`) and
by `python -m kernels.aot`."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:  # not imported here: see above
    pytest.skip("triton is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
# SmolLM2 (head_dim 64) in bf16, Llama 3 8B (head_dim 128, GQA 4) in bf16 and in fp32, Gemma-3 270M (head_dim 256,
# GQA 4: the widest tiles; its sliding window's variants too) in both: the tile constexprs of the other shapes are
# among these (Qwen2 7B differs only in G, which the tiles ignore; `python -m kernels.aot` prints every model x
# dtype).
CASES = [
    ("smollm2-135m", "bfloat16"),
    ("llama3-8b", "bfloat16"),
    ("llama3-8b", "float32"),
    ("gemma-3-270m", "bfloat16"),
    ("gemma-3-270m", "float32"),
]
KERNELS = {
    "_rms_norm_kernel",
    "_rope_store_kv_kernel",
    "_silu_and_mul_kernel",
    "_linear_kernel",
    "_varlen_causal_kernel",
    "_paged_decode_kernel",
    "_paged_decode_combine_kernel",
    "_segment_merge_kernel",
    "_target_logprob_kernel",
}


@pytest.fixture(scope="module")
def aot_runs(tmp_path_factory):
    """Every case's compile started at once, one subprocess each writing to files (Triton compiles on one thread:
    on a 2-core machine this halves the ~5 minutes they take one after another)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    folder = tmp_path_factory.mktemp("aot")
    runs = {}
    for model, dtype in CASES:
        out, err = folder / f"{model}-{dtype}.out", folder / f"{model}-{dtype}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kernels.aot", "--json", "--models", model, "--dtypes", dtype],
                cwd=ROOT,
                env=env,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        runs[(model, dtype)] = (proc, out, err)
    yield runs
    for proc, _, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def compiled(request, aot_runs):
    proc, out, err = aot_runs[request.param]
    try:
        returncode = proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"kernels.aot for {request.param} ran past 15 minutes")
    stdout, stderr = out.read_text(), err.read_text()
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if not records:
        pytest.fail(f"kernels.aot compiled nothing (exit {returncode}):\n{stderr[-3000:]}")
    return returncode, records, stderr


def test_every_kernel_lowers_for_both_targets(compiled):
    rc, records, stderr = compiled
    for target in ("sm_80", "sm_90"):
        assert {r["kernel"] for r in records if r["target"] == target} == KERNELS, stderr[-3000:]
    attention = [r for r in records if r["kernel"] == "_segment_merge_kernel"]
    assert all(r["constexprs"]["BLOCK_R"] >= 64 for r in attention), "the launches must use the GPU tile choices"
    assert {r["constexprs"]["HAS_LIMITS"] for r in attention} == {False, True}  # cascade and deterministic merges
    assert {r["constexprs"]["HAS_STARTS"] for r in attention} == {False, True}  # and a sliding window's first keys
    assert all(r["ptx_lines"] > 0 for r in records)


def test_shared_memory_fits_the_target(compiled):
    rc, records, _ = compiled
    rows = [
        f"{r['target']} {r['kernel']:24} {r['num_warps']} warps {r['shared'] / 1024:7.1f} KiB of "
        f"{r['limit'] / 1024:.0f} KiB  " + " ".join(f"{k}={v}" for k, v in r["constexprs"].items())
        for r in records
    ]
    print("\n" + "\n".join(rows))
    too_large = [row for row, r in zip(rows, records) if not r["fits"]]
    assert not too_large, "shared memory over the per-block limit:\n" + "\n".join(too_large)
    assert rc == 0
