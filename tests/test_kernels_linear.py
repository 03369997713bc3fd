"""kernels/linear.py: a weight prepacked in oneDNN's layout gives bitwise the results of F.linear in bf16 and
F.linear's to fp32 rounding in fp32 (CPU), for every row count (decode steps of 1 row to prefill chunks of
hundreds) and with a bias; fp16 is not packed. The native op's panels (kernels/native/linear.cpp) give F.linear's
results to fp32 rounding in fp32; in bf16 exactly the fp32 panels' results on the same (widened) values, rounded
once to bf16; each row independent of the others in the call and of the thread count."""

import pytest
import torch
import torch.nn.functional as F

import kernels  # noqa: F401  (sets the oneDNN ISA cap before the first GEMM)
from kernels import native_ops
from kernels.linear import Packed, Panels, linear, linear_ref, panels_available, prepack


@pytest.mark.parametrize("rows", [1, 3, 32, 33, 257])
def test_packed_bf16_linear_is_bitwise_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(200, 96, generator=g).bfloat16()
    b = torch.randn(200, generator=g).bfloat16()
    x = torch.randn(rows, 96, generator=g).bfloat16()
    p = prepack(w)
    if not isinstance(p, Packed):
        pytest.skip("oneDNN weight packing is not available in this torch build")
    assert torch.equal(linear(x, p), linear_ref(x, w))
    assert torch.equal(linear(x, p, b), F.linear(x, w, b))


@pytest.mark.parametrize("rows", [1, 3, 32, 33, 257])
def test_packed_fp32_linear_equals_f_linear_to_rounding(rows):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(200, 96, generator=g), torch.randn(200, generator=g)
    x = torch.randn(rows, 96, generator=g)
    p = prepack(w)
    if not isinstance(p, Packed):
        pytest.skip("oneDNN weight packing is not available in this torch build")
    torch.testing.assert_close(linear(x, p), linear_ref(x, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear(x, p, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_fp16_weights_stay_plain():
    w = torch.randn(8, 4).half()
    assert prepack(w) is w
    x = torch.randn(2, 4).half()
    assert torch.equal(linear(x, w), F.linear(x, w))


needs_panels = pytest.mark.skipif(
    not (native_ops.load() and native_ops.simd() in ("avx2", "avx512", "avx512bf16")),
    reason="the native panel linear needs the library built with AVX2 or wider",
)


@needs_panels
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 32, 33, 257, 300])
@pytest.mark.parametrize("out_features", [48, 200])
def test_panel_linear_equals_f_linear_to_rounding(rows, out_features):
    """Whole and partial 4-row tiles, a partial last panel (200 = 8 x 24 + 8), more rows than one row block (256),
    a bias, a 3-d input and a strided one."""
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    w, b = torch.randn(out_features, 97, generator=g), torch.randn(out_features, generator=g)
    x = torch.randn(rows, 97, generator=g)
    p = Panels(w)
    assert p.blocked.shape == (-(-out_features // 24), 97, 24)
    torch.testing.assert_close(linear(x, p), linear_ref(x, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear(x, p, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    wide = torch.randn(rows, 2 * 97, generator=g)[:, ::2]
    torch.testing.assert_close(linear(wide, p), F.linear(wide, w), rtol=1e-5, atol=1e-5)
    x3 = x.view(1, rows, 97)
    assert torch.equal(linear(x3, p, b), linear(x, p, b).view(1, rows, out_features))


@needs_panels
@pytest.mark.parametrize("rows", [1, 3, 4, 32, 257])
@pytest.mark.parametrize("out_features", [48, 200])
def test_bf16_panel_linear_is_the_fp32_panels_rounded_once(rows, out_features):
    """bf16 panels widen x, W and the bias exactly to fp32 and sum in fp32: bitwise the fp32 panels' result on
    the same values, rounded to bf16 once; within bf16 rounding of F.linear in fp32."""
    g = torch.Generator().manual_seed(rows * 1000 + out_features + 1)
    w, b = torch.randn(out_features, 97, generator=g).bfloat16(), torch.randn(out_features, generator=g).bfloat16()
    x = torch.randn(rows, 97, generator=g).bfloat16()
    p = Panels(w)
    assert p.blocked.dtype == torch.bfloat16
    got = linear(x, p, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    assert torch.equal(got, linear(x.float(), Panels(w.float()), b.float()).bfloat16())
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float(), b.float()), rtol=8e-3, atol=1e-2)
    wide = torch.randn(rows, 2 * 97, generator=g).bfloat16()[:, ::2]
    assert torch.equal(linear(wide, p), linear(wide.float(), Panels(w.float())).bfloat16())


@needs_panels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_panel_linear_rows_do_not_depend_on_the_call(dtype):
    """Each output is one FMA chain over the inputs: a row's result is bitwise the same alone, in any 4-row tile
    position, in a larger call, and on 1 or 2 threads."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(75, 130, generator=g).to(dtype), torch.randn(75, generator=g).to(dtype)
    x = torch.randn(37, 130, generator=g).to(dtype)
    p = Panels(w)
    full = linear(x, p, b)
    for r in (0, 1, 2, 3, 5, 36):
        assert torch.equal(linear(x[r : r + 1], p, b)[0], full[r])
        assert torch.equal(linear(x[max(0, r - 2) : r + 3], p, b)[min(r, 2)], full[r])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert torch.equal(linear(x, p, b), full)
    finally:
        torch.set_num_threads(threads)


@needs_panels
def test_panel_linear_rejects_mismatched_shapes():
    p = Panels(torch.randn(30, 16))
    with pytest.raises(RuntimeError, match="must be"):
        linear(torch.randn(4, 17), p)
    with pytest.raises(RuntimeError, match="both float32 or both bfloat16"):
        linear(torch.randn(4, 16).bfloat16(), p)
    with pytest.raises(RuntimeError, match="both float32 or both bfloat16"):
        native_ops.linear_panels_native(torch.randn(4, 16).half(), p.blocked.half(), 30)
    with pytest.raises(RuntimeError, match="bias must be"):
        linear(torch.randn(4, 16), p, torch.randn(30).bfloat16())
    with pytest.raises(RuntimeError, match="do not fit"):
        native_ops.linear_panels_native(torch.randn(4, 16), p.blocked, 49)


def test_prepack_picks_panels_only_where_measured():
    """fp32 and bf16 weights as panels where the library was built for AVX2 (without AVX-512); fp16 plain."""
    w = torch.randn(48, 32)
    assert isinstance(prepack(w, panels=True), Panels) == panels_available()
    assert isinstance(prepack(w.bfloat16(), panels=True), Panels) == panels_available()
    assert not isinstance(prepack(w), Panels)  # without panels=True: oneDNN or plain, as before
    half = w.half()
    assert prepack(half, panels=True) is half


def test_prepack_probe_widens_the_weight_in_blocks():
    """prepack's check against F.linear in fp32 widens a bf16 weight 1M elements at a time (no whole fp32 copy
    beside the packed one while a model loads: test_loader's bf16 peak fell from 1.24-1.30x to 1.15-1.18x): the
    blocks' outputs, concatenated in order, are F.linear's."""
    from kernels.linear import _float_linear

    w = torch.randn(3 * (2**20 // 64) + 5, 64).bfloat16()  # three whole blocks and a partial one
    x = torch.randn(3, 64).bfloat16()
    torch.testing.assert_close(_float_linear(x, w), F.linear(x.float(), w.float()), rtol=1e-6, atol=1e-5)
    assert _float_linear(x, w[:7]).shape == (3, 7)


def test_prepack_holds_no_fp32_copy_of_a_bf16_weight():
    """While prepack checks its packed form, no tensor larger than the packed copy itself is allocated: a whole
    fp32 copy of the bf16 weight (twice its bytes, the check before it went block by block) would be the load's
    peak (tests/test_loader.py). The torch profiler records every allocation's size."""
    from torch.profiler import ProfilerActivity, profile

    w = torch.randn(4096, 1024).bfloat16()  # 8 MiB; the check's blocks are 4 MiB of fp32
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        prepack(w, panels=True)
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert largest <= 1.05 * w.numel() * w.element_size(), largest
