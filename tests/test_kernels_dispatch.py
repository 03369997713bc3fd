"""The kernel dispatch: backend selection (ENGINE_KERNELS / set_backend), the CPU default, the fallback to the
torch references when the native library is absent, and the log line naming the path that runs."""
import logging

import pytest
import torch

import kernels
from kernels import dispatch, native_ops
from kernels.rmsnorm import rms_norm_ref

CPU = torch.device("cpu")


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
        expected = "native" if op in dispatch.CPU_NATIVE_OPS else "torch"
        assert dispatch.resolve(op, CPU).__module__ == f"kernels.{dispatch.IMPLS[op][expected].split(':')[0]}"
    assert "kernels: cascade_attention on cpu -> native" in caplog.text
    assert "kernels: store_kv on cpu -> torch" in caplog.text
    assert kernels.describe("cpu").startswith("auto on cpu:")


def test_missing_native_library_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(native_ops, "load", lambda: False)
    caplog.set_level(logging.WARNING, logger="kernels")
    assert dispatch.resolve("cascade_attention", CPU).__name__ == "cascade_attention_ref"
    assert dispatch.resolve("rms_norm", CPU).__name__ == "rms_norm_ref"
    assert caplog.text.count("native CPU ops are not built") == 1
    kernels.set_backend("native")
    with pytest.raises(RuntimeError, match="not built"):
        dispatch.resolve("cascade_attention", CPU)


def test_forced_native_uses_references_for_ops_without_native_version():
    kernels.set_backend("native")
    assert dispatch.resolve("store_kv", CPU).__name__ == "store_kv_ref"


def test_entry_points_follow_the_backend():
    x, w, res = torch.randn(4, 40), torch.randn(40), torch.randn(4, 40)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, res)
    for backend in ("torch", "auto"):
        kernels.set_backend(backend)
        out, new_res = kernels.rms_norm(x, w, 1e-6, res)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new_res, ref_res)
