"""kernels/linear.py: a weight prepacked in oneDNN's layout gives bitwise the results of F.linear in bf16 and
F.linear's to fp32 rounding in fp32 (CPU), for every row count (decode steps of 1 row to prefill chunks of
hundreds) and with a bias; fp16 is not packed."""
import pytest
import torch
import torch.nn.functional as F

import kernels  # noqa: F401  (sets the oneDNN ISA cap before the first GEMM)
from kernels.linear import Packed, linear, linear_ref, prepack


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
