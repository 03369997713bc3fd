"""The kernel dispatch: backend selection (ENGINE_KERNELS / set_backend), the CPU default, the fallback to the
torch references when the native library is absent, and the log line naming the path that runs."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels
import kernels.linear
from kernels import dispatch, native_ops
from kernels.linear import Panels, linear, panels_available
from kernels.rmsnorm import rms_norm_ref

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_dispatch(monkeypatch):
    monkeypatch.delenv("ENGINE_KERNELS", raising=False)
    dispatch.set_backend(None)
    dispatch._state.pop("warned", None)
    yield
    dispatch.set_backend(None)


def test_unknown_backend_is_rejected(monkeypatch):
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.set_backend("cuda")
    monkeypatch.setenv("ENGINE_KERNELS", "fast")
    with pytest.raises(ValueError, match="ENGINE_KERNELS"):
        kernels.get_backend()


def test_environment_then_set_backend(monkeypatch):
    monkeypatch.setenv("ENGINE_KERNELS", "torch")
    assert kernels.get_backend() == "torch"
    assert dispatch.resolve("cascade_attention", CPU).__name__ == "cascade_attention_ref"
    kernels.set_backend("native")
    assert kernels.get_backend() == "native"
    kernels.set_backend(None)
    assert kernels.get_backend() == "torch"


def test_cpu_default_is_native_where_measured_faster(caplog):
    if not native_ops.load():
        pytest.skip("native library not built")
    caplog.set_level(logging.INFO, logger="kernels")
    for op in dispatch.IMPLS:
        native = op in dispatch.CPU_NATIVE_OPS or (op in dispatch.CPU_NATIVE_AVX2_OPS and panels_available())
        expected = "native" if native else "torch"
        assert dispatch.resolve(op, CPU).__module__ == f"kernels.{dispatch.IMPLS[op][expected].split(':')[0]}"
    assert "kernels: cascade_attention on cpu -> native" in caplog.text
    head = "native" if panels_available() else "torch"
    assert f"kernels: target_logprobs on cpu -> {head}" in caplog.text
    assert kernels.describe("cpu").startswith("auto on cpu:")


def test_fused_lm_head_is_native_only_on_avx2_builds(monkeypatch):
    if not native_ops.load():
        pytest.skip("native library not built")
    monkeypatch.setattr(kernels.linear, "panels_available", lambda: False)  # e.g. an AVX-512 build
    assert dispatch.resolve("target_logprobs", CPU).__name__ == "target_logprobs_ref"
    kernels.set_backend(None)
    monkeypatch.setattr(kernels.linear, "panels_available", lambda: True)
    assert dispatch.resolve("target_logprobs", CPU).__name__ == "target_logprobs_native"


def test_missing_native_library_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(native_ops, "load", lambda: False)
    caplog.set_level(logging.WARNING, logger="kernels")
    assert dispatch.resolve("cascade_attention", CPU).__name__ == "cascade_attention_ref"
    assert dispatch.resolve("rms_norm", CPU).__name__ == "rms_norm_ref"
    assert caplog.text.count("native CPU ops are not built") == 1
    kernels.set_backend("native")
    with pytest.raises(RuntimeError, match="not built"):
        dispatch.resolve("cascade_attention", CPU)


def same(a: kernels.LogProbs, b: kernels.LogProbs) -> bool:
    """Two LogProbs with the same fields, bitwise (a missing top k on both sides)."""
    fields = ("logprob", "greedy", "top_ids", "top_logprobs")
    return all(
        (getattr(a, f) is None and getattr(b, f) is None) or torch.equal(getattr(a, f), getattr(b, f)) for f in fields
    )


def test_forced_native_target_logprobs_hands_what_it_lacks_to_the_reference():
    if not native_ops.load():
        pytest.skip("native library not built")
    from kernels.logprob import target_logprobs_ref

    kernels.set_backend("native")
    fn = dispatch.resolve("target_logprobs", CPU)
    assert fn is native_ops.target_logprobs_native
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(5, 24, generator=g), torch.randn(70, 24, generator=g)
    t = torch.randint(0, 70, (5,), generator=g)
    assert same(fn(h, w, t, 3), target_logprobs_ref(h, w, t, 3))  # the top k: the reference itself
    assert same(fn(h.half(), w.half(), t), target_logprobs_ref(h.half(), w.half(), t))  # fp16 too


def test_entry_points_follow_the_backend():
    x, w, res = torch.randn(4, 40), torch.randn(40), torch.randn(4, 40)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, res)
    for backend in ("torch", "auto"):
        kernels.set_backend(backend)
        out, new_res = kernels.rms_norm(x, w, 1e-6, res)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new_res, ref_res)


def test_importing_the_kernels_changes_no_environment_variable():
    code = (
        "import os, sys; before = dict(os.environ); import kernels, engine.model; "
        "sys.exit(0 if dict(os.environ) == before else 1)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(ROOT)
    assert subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT).returncode == 0


def test_forced_triton_on_cpu_asks_for_the_interpreter_instead_of_setting_it():
    code = (
        "import os, torch, kernels; kernels.set_backend('triton'); x = torch.randn(3, 8); w = torch.randn(8); "
        "out, _ = kernels.rms_norm(x, w, 1e-6); "
        "from kernels.rmsnorm import rms_norm_ref; torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6)[0])"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1 and "start the process with TRITON_INTERPRET=1" in run.stderr, run.stderr[-2000:]
    env["TRITON_INTERPRET"] = "1"
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_step_kernels_pick_the_mode_once(monkeypatch):
    w = torch.randn(48, 40).bfloat16()
    x = torch.randn(5, 40).bfloat16()
    fast, det = kernels.StepKernels(False), kernels.StepKernels(True)
    if panels_available():  # both modes run the native panels (rows invariant by construction)
        assert isinstance(fast.weight(w), Panels) and isinstance(det.weight(w), Panels)
        assert torch.equal(det.linear(x, det.weight(w)), linear(x, Panels(w)))
        torch.testing.assert_close(fast.linear(x, fast.weight(w)), F.linear(x, w), rtol=1e-2, atol=1e-2)
    monkeypatch.setattr(kernels.linear, "panels_available", lambda: False)
    assert det.weight(w) is w  # elsewhere the deterministic mode keeps plain weights (row tiles of F.linear)
    assert not isinstance(fast.weight(w), Panels)
    assert torch.equal(fast.linear(x, fast.weight(w)), F.linear(x, w))
    assert torch.equal(det.linear(x, w), F.linear(x, w))


def test_step_kernels_target_logprobs_follow_the_mode(monkeypatch):
    """Both modes run the native fused LM head where it is picked (its rows are invariant by construction); the
    deterministic mode takes the batch-invariant tiles where it is not, or for what the native op hands on."""
    from kernels import batch_invariant
    from kernels.logprob import target_logprobs_ref

    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(5, 40, generator=g).bfloat16(), torch.randn(300, 40, generator=g).bfloat16()
    t = torch.randint(0, 300, (5,), generator=g)
    fast, det = kernels.StepKernels(False), kernels.StepKernels(True)
    if native_ops.load() and panels_available():
        native = native_ops.target_logprobs_native(h, w, t)
        for mode in (fast, det):
            assert same(mode.target_logprobs(h, w, t), native)
        top = det.target_logprobs(h, w, t, 2)  # the top k: the native op hands it on, so the tiles run
        assert same(top, batch_invariant.target_logprobs(h, w, t, 2))
    kernels.set_backend(None)
    monkeypatch.setattr(kernels.linear, "panels_available", lambda: False)
    tiles, ref = batch_invariant.target_logprobs(h, w, t), target_logprobs_ref(h, w, t)
    assert same(det.target_logprobs(h, w, t), tiles) and same(fast.target_logprobs(h, w, t), ref)
