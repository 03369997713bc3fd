"""benchmarks/gpu_check.py --smoke: the GPU check at tiny sizes on the CPU (Triton interpreter), run the way the GPU
machine runs it (a fresh interpreter from the checkout, PYTHONPATH=.) with the packages that machine lacks made
unimportable, so that a new import of one of them on the check's path fails here before it costs a GPU run."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# found, not imported: importing triton here would turn the interpreter off for the kernel tests collected later
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:  # gpu_results
    sys.path.insert(0, str(ROOT / "benchmarks"))
# The GPU machine's image, as `pip list` shows it once torch==2.11.0, triton==3.6.0, transformers==5.17.0,
# safetensors, tokenizers, numpy, PyYAML, jinja2, pytest and pytest-benchmark are installed in an empty Python 3.12
# venv (their own dependencies come with them; checked 2026-11-27, benchmarks/README.md "The GPU check"). Every
# other installed distribution is made unimportable in the check's child interpreters.
IMAGE = frozenset(
    """
    annotated-doc annotated-types anyio certifi click cuda-bindings cuda-pathfinder cuda-toolkit filelock fsspec h11
    hf-xet httpcore httpx huggingface-hub idna iniconfig jinja2 markdown-it-py markupsafe mdurl mpmath networkx numpy
    nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink
    nvidia-nvshmem-cu13 nvidia-nvtx packaging pip pluggy py-cpuinfo2 pydantic pydantic-core pygments pytest
    pytest-benchmark pyyaml regex rich safetensors setuptools shellingham sympy tokenizers torch tqdm transformers
    triton typer typing-extensions typing-inspection
    """.split()
)
# the checkout's own packages and script folders' modules: on the path there as here (PYTHONPATH=.)
PROJECT = frozenset(
    p.stem if p.suffix == ".py" else p.name
    for folder in (ROOT, ROOT / "benchmarks", ROOT / "tests")
    for p in folder.iterdir()
    if p.suffix == ".py" or (p / "__init__.py").is_file()
)


# what the image was made from; their dependencies as installed here are taken to be there too (this venv's
# transformers or huggingface_hub may be newer than the image's and need a package the image's do not)
IMAGE_ROOTS = (
    "torch",
    "triton",
    "transformers",
    "safetensors",
    "tokenizers",
    "numpy",
    "pyyaml",
    "jinja2",
    "pytest",
    "pytest-benchmark",
)


def _dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_dists() -> set[str]:
    """IMAGE and the dependency closure, as installed here, of IMAGE_ROOTS (extras left out)."""
    from packaging.requirements import Requirement

    seen, todo = set(IMAGE_ROOTS), list(IMAGE_ROOTS)
    while todo:
        try:
            requires = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                name = _dist_name(req.name)
                if name not in seen:
                    seen.add(name)
                    todo.append(name)
    return seen | IMAGE


def image_modules() -> set[str]:
    """The top-level modules installed here that the image holds too."""
    dists = image_dists()
    owners = importlib.metadata.packages_distributions()
    return {top for top, names in owners.items() if any(_dist_name(d) in dists for d in names)}


def absent_from_image() -> list[str]:
    """The top-level modules installed here whose distributions the image does not hold (an allow-list: a package
    added to this venv is absent there until someone checks the image has it)."""
    held = image_modules()
    owners = importlib.metadata.packages_distributions()
    return sorted(top for top in owners if top not in PROJECT and top not in held and top.isidentifier())


@pytest.fixture(scope="module")
def gpu_image_env(tmp_path_factory) -> dict:
    """The environment of a child interpreter in which the packages the image lacks cannot be imported (a
    sitecustomize that marks them missing in sys.modules: `import scipy` raises ModuleNotFoundError and find_spec
    says absent). The check's sections and its pytest run inherit it."""
    site = tmp_path_factory.mktemp("gpu_image")
    (site / "sitecustomize.py").write_text(
        f"import sys\nfor _m in {absent_from_image()!r}:\n    sys.modules[_m] = None\n"
    )
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
        "paged_decode_attention",
        "paged_decode_attention_unsplit",
        "linear",
        "linear_row_tiles",
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
    assert all(a["greedy_equal_read_first"] for a in parity["archs"].values())  # overlap off: the same tokens
    # the decode steps in fixed shapes (eager on the CPU; replayed from CUDA graphs on a GPU): the same tokens
    assert parity["decode_graphs_equal"] is True
    assert all(a["decode_graphs"]["fixed_shape_steps_eager"] > 0 for a in parity["archs"].values())
    assert all(0 < a["bf16_max_abs"] <= a["bf16_tol"] for a in parity["archs"].values())
    # the native ops where the library is built, else the torch references: bitwise either way
    assert parity["deterministic_bitwise"] is True and len(parity["deterministic"]) == 2
    # each op probed alone vs in batches ran (the Triton linear under the interpreter: its numpy products round a
    # row by its place in a tile, so its bits are the GPU run's to judge)
    ops = {d["op"] for d in parity["deterministic_ops"] if "error" not in d}
    assert "linear (Triton, batch-invariant)" in ops and len(ops) == 6, parity["deterministic_ops"]

    speed = report["speed"]
    # speed_1b was cut off before any result
    assert set(speed) == {"icqs_8b", "plain_8b", "decode_64", "icqs_8b_deterministic"}
    det = speed["icqs_8b_deterministic"]  # the same job in the deterministic mode, against the fast mode's run
    assert det["mfu"] > 0 and det["vs_fast_mode"] > 0 and det["max_abs_vs_fast_mode"] < 0.5, det
    assert det["tokens_computed"] == speed["icqs_8b"]["tokens_computed"]
    for job in ("icqs_8b", "plain_8b"):
        s = speed[job]
        assert s["mfu"] > 0 and s["vs_hf"] > 0 and s["hf_requests_timed"] > 0 and s["max_abs"] < 0.5, s
        assert s["engine_peak_gib"] > 0 and s["hf_peak_gib"] > 0
        prof = s["device_profile"]  # one more run under torch.profiler: where the device's time went
        assert 0 < prof["device_busy_s"] and prof["top"] and prof["top"][0]["s"] > 0, prof
        assert s["sync_points"] == {"skipped": "no CUDA device"}  # torch's sync debug mode: CUDA only
    # the ICQS job shares its demo sets: far fewer tokens computed than requested
    assert speed["icqs_8b"]["tokens_computed"] < speed["icqs_8b"]["tokens_requested"] / 2
    assert speed["plain_8b"]["tokens_computed"] == speed["plain_8b"]["tokens_requested"]
    decode = speed["decode_64"]
    assert decode["vs_hf"] > 0 and decode["tokens_computed"] > 0
    assert decode["launch_ms_per_step"] > 0 and decode["finish_ms_per_step"] > 0 and decode["device_profile"]["top"]
    # the same decode with each step's tokens read before the next is planned (the overlap's comparison)
    assert decode["read_first"]["sequences_equal_overlapped"] == "4/4", decode["read_first"]
    assert decode["read_first"]["overlapped_vs_read_first"] > 0 and "overlap off" in decode["note"]
    graphs = decode["graphs"]  # the same decode from the fixed-shape path: its time, its tokens against the eager's
    assert graphs["vs_eager"] > 0 and graphs["sequences_equal_eager"] == "4/4", graphs
    assert graphs["stats"]["fixed_shape_steps_eager"] > 0 and graphs["stats"]["capture_failed"] is None

    md = (tmp_path / "gpu_check.md").read_text()
    assert "icqs_8b, one more run under torch.profiler" in md and "| kernel | s | share of busy | calls |" in md
    assert "| speed_1b | cut off |" in md and "## Kernels" in md and "## Parity" in md and "## Speed" in md
    assert (tmp_path / "logs" / "parity.log").read_text()
    filed_into_a_copy_of_the_results(tmp_path)


def filed_into_a_copy_of_the_results(run_dir: Path) -> None:
    """benchmarks/gpu_results.py files the smoke run into a copy of benchmarks/results: run 4's files, the sections
    that produced results taken from it, the 1B rows (its speed_1b was cut off before any) kept from run 1."""
    import gpu_results

    results = run_dir / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    before = json.loads((results / "gpu_check.json").read_text())
    assert gpu_results.main([str(run_dir), "--code", "test", "--results", str(results)]) == 2  # a smoke run
    assert gpu_results.main([str(run_dir), "--code", "test", "--results", str(results), "--allow-smoke"]) == 0
    n = len(before["runs"]) + 1
    assert (results / "gpu_check_runs" / f"run{n}.json").is_file()
    assert (results / "gpu_check_runs" / f"run{n}.md").is_file()
    after = json.loads((results / "gpu_check.json").read_text())
    assert {k: v["run"] for k, v in after["sections"].items()} == {
        **{k: v.get("run") for k, v in before["sections"].items()},
        **{k: n for k in ("bounds", "kernels", "parity", "speed_8b")},
    }
    assert after["speed"]["icqs_8b"]["run"] == n and after["speed"]["icqs_8b"]["shape"] == "tiny Llama 3 (smoke)"
    assert after["speed"]["icqs_1b"] == before["speed"]["icqs_1b"]
    assert after["runs"][-1]["sections"] == ["bounds", "kernels", "parity", "speed_8b"]
    assert after["device"] == json.loads((run_dir / "gpu_check.json").read_text())["device"]
    settled = gpu_results.decisions(after)  # the smoke run's decode rows decide; its kernels timed one case only
    assert settled[0].startswith("decode_graphs: ") and " -> " in settled[0]
    assert settled[1].startswith("overlap: read-first ") and " -> " in settled[1]  # CPU times: no verdict


def test_what_a_run_settles():
    """gpu_results.decisions: each option or kernel built before a GPU measured it, decided from its figures."""
    import gpu_results

    def t(op, case, triton_ms, torch_ms):
        return {"model": "llama3-8b", "op": op, "case": case, "triton_ms": triton_ms, "torch_ms": torch_ms}

    report = {
        "speed": {
            "decode_64": {
                "graphs": {"ms_per_step": 7.0, "vs_eager": 3.0, "sequences_equal_eager": "64/64"},
                "read_first": {
                    "ms_per_step": 9.0,
                    "overlapped_vs_read_first": 1.3,
                    "sequences_equal_overlapped": "64/64",
                },
            }
        },
        "parity": {
            "decode_graphs_equal": True,
            "deterministic_ops": [
                {"op": "linear (Triton, batch-invariant)", "dtype": d, "bitwise": True} for d in ("float32", "bfloat16")
            ],
        },
        "kernels": {
            "timings": [
                t("paged_decode_attention", "1 seq x 1 tok, 8192 keys", 0.05, 1.0),
                t("paged_decode_attention_unsplit", "1 seq x 1 tok, 8192 keys", 0.4, 1.0),
                t("linear", "qkv: 4096 x 4096 -> 6144", 0.30, 0.27),
                t("linear_row_tiles", "qkv: 4096 x 4096 -> 6144", 0.30, 0.40),
                t("linear_row_tiles", "down: 4096 x 14336 -> 4096", 0.70, 0.95),
            ]
        },
        "bounds": {
            "host_copy": {
                "host_copy": {"read_ms": 0.1, "later_work_ms": 30.0},
                "tolist": {"read_ms": 29.0, "later_work_ms": 30.0},
                "reads_before_later_work": True,
            }
        },
    }
    lines = gpu_results.decisions(report)
    assert lines[0].endswith("make it the default on CUDA") and lines[1].endswith("keep it on on CUDA")
    assert "(8.00x)" in lines[2] and lines[2].endswith("keep the split")
    assert lines[3].endswith("use it for the deterministic mode's GPU linears") and "1.36x the row tiles" in lines[3]
    assert lines[4].endswith("the pipelined loop can read step N while N+1 runs")
    # the other way: tokens that differ, a slower split, a linear that loses its bits or its speed
    report["speed"]["decode_64"]["graphs"]["sequences_equal_eager"] = "63/64"
    report["kernels"]["timings"][0]["triton_ms"] = 0.5
    report["parity"]["deterministic_ops"][1]["bitwise"] = False
    lines = gpu_results.decisions(report)
    assert lines[0].endswith("keep it off") and lines[2].endswith("raise SPLIT_MIN_KEYS or drop the split")
    assert lines[3].endswith("keep the row tiles")
    assert gpu_results.decisions({})[0] == "decode_graphs: not measured in this report"


def test_filing_bad_input_writes_nothing(tmp_path, capsys):
    import gpu_results

    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "gpu_check.json").write_text("{")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "gpu_check.json").write_text("[1, 2]")
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "gpu_check.json").write_text(json.dumps({"sections": {}}))
    cases = {
        (str(tmp_path / "nowhere"), "--code", "x"): "no such folder",
        (str(tmp_path / "results"), "--code", "x"): "no such file",
        (str(tmp_path / "notjson"), "--code", "x"): "not JSON",
        (str(tmp_path / "other"), "--code", "x"): "not a GPU check's report",
        (str(tmp_path / "ok"),): "--code: say which commit",
    }
    for args, expected in cases.items():
        assert gpu_results.main([*args, "--results", str(results)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert list(results.iterdir()) == []


# imported by the GPU path only where present, each behind `except ImportError` (a package that is not in the image
# and is not needed there)
OPTIONAL_ON_GPU = {"kernels.flash_attention": {"flash_attn"}}

_CLOSURE = r"""
import ast, importlib, json, sys
from pathlib import Path

root = Path(sys.argv[1])
tree = ast.parse((root / "benchmarks" / "gpu_check.py").read_text())
wanted = []  # (module, names imported from it)
for node in ast.walk(tree):
    if isinstance(node, ast.Import):
        wanted += [(a.name, []) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
        wanted.append((node.module, [a.name for a in node.names]))
errors = []

def load(name, attrs=()):
    try:
        mod = importlib.import_module(name)
        for a in attrs:  # a function, a class or a submodule
            if not hasattr(mod, a):
                importlib.import_module(f"{name}.{a}")
    except Exception as e:
        errors.append(f"{name}: {type(e).__name__}: {e}")

sys.path[:0] = [str(root / "benchmarks"), str(root / "tests"), str(root)]
for name, attrs in wanted:
    load(name, attrs)
# the GPU path's kernel modules: those the dispatch table loads by name, and every other module of kernels/
import bench_kernels_gpu
from kernels import dispatch
for table in (dispatch.IMPLS, bench_kernels_gpu.EXTRA_IMPLS):
    for backends in table.values():
        for spec in backends.values():
            module, attr = spec.split(":")
            load(f"kernels.{module}", [attr])
for path in sorted((root / "kernels").glob("*.py")):
    load(f"kernels.{path.stem}")
files = sorted({m.__name__: getattr(m, "__file__", None) for m in list(sys.modules.values()) if m}.items())
print(json.dumps({"errors": errors, "modules": [[n, f] for n, f in files if f]}))
"""


def test_import_closure_holds_only_the_image(gpu_image_env):
    """Every module gpu_check.py imports (at the top and inside its sections) and every kernel module of the GPU
    path imports in a child where the packages the image lacks are missing; and no function of engine/ or kernels/
    loaded there imports such a package on a path the CPU smoke run does not take (the CUDA branches), except the
    optional ones that fall back when absent."""
    out = subprocess.run(
        [sys.executable, "-c", _CLOSURE, str(ROOT)],
        cwd=ROOT,
        env=gpu_image_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["errors"] == []
    loaded = dict(report["modules"])
    assert {"engine.engine", "kernels.attention_triton", "kernels.logprob_triton", "bench_icqs_workload"} <= set(loaded)
    allowed = set(sys.stdlib_module_names) | PROJECT | image_modules() | {"__future__"}
    outside = []
    for name, file in loaded.items():
        path = Path(file)
        if path.suffix != ".py" or not any(path.is_relative_to(ROOT / d) for d in ("engine", "kernels")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = {node.module.split(".")[0]}
            else:
                continue
            for top in tops - allowed - OPTIONAL_ON_GPU.get(name, set()):
                outside.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {top}, which the GPU image lacks")
    assert outside == [], outside


def test_an_interpreter_numpy_mismatch_is_named(monkeypatch):
    """triton 3.6's interpreter with numpy >= 2.4 fails every kernel with a loop over a runtime bound (a CPU run of
    the check in the image's package set): the report says why, not only that they failed."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check

    error = "InterpreterError: TypeError('only 0-dimensional arrays can be converted to Python scalars')"
    cause = gpu_check.known_cause(error)
    assert "triton-lang/triton#9171" in cause and "numpy < 2.4" in cause
    assert gpu_check.known_cause("InterpreterError: IndexError('out of bounds')") is None
    md = gpu_check.markdown({"kernels": {"passed": 0, "failed": 1, "note": cause}})
    assert f"note: {cause}" in md
