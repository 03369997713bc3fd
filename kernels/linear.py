"""Linear layers with weights prepacked once at load (CPU, bf16 and fp32).

`F.linear` on bf16 CPU tensors hands oneDNN a plain [out, in] weight, which it reorders into its blocked layout
on every call. `prepack` does that reorder once; `linear(x, w)` then runs the same oneDNN kernel on the blocked
copy: the results are bitwise those of `F.linear` (tests/test_kernels_linear.py), without the per-call reorder
that dominates a decode step's few rows. fp32 weights are packed too: F.linear runs MKL's sgemm for them, which
packs the weight on every call; oneDNN's packed kernel is equal to F.linear to fp32 rounding (not bitwise: another
summation order). benchmarks/RESULTS.md has the measurements.

`prepack(w, panels=True)` (what the engine asks for where the native library was built for AVX2, not AVX-512)
packs an fp32 or bf16 weight for the native op instead (kernels/native/linear.cpp, `Panels`): panels of 24 output
columns and a 4 x 24 register tile. fp32: on an AVX2 CPU it runs the decode step's rows faster than oneDNN's
packed kernel. bf16: such a CPU has no bf16 arithmetic (no avx512_bf16 or AMX) and torch emulates its bf16 GEMM
at a fraction of the fp32 rate; the op widens each bf16 panel to fp32 (exact) and sums in fp32, rounding each
output to bf16 once, at the fp32 rate (benchmarks/RESULTS.md). Each output is one FMA chain over the
inputs, so a row's result is the same whatever else the call holds and on any thread count: the deterministic
mode uses the panels too (kernels/dispatch.StepKernels). Where AVX-512 is built, oneDNN keeps the weights (the
panels were not measured there). Other dtypes and devices keep the plain weight: the reference `linear_ref`
(= F.linear) runs for them.

A packed weight is opaque: only `linear` may use it (no slicing, no .T). The model keeps plain copies where
other code reads the weight (the embedding and the LM head in the fused target log-prob).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native_ops

linear_ref = F.linear
PANEL = 24  # output columns per panel of the native op (kPanel in kernels/native/linear.cpp, which checks it)


class Packed:
    """A weight in oneDNN's blocked layout, usable only by linear()."""

    __slots__ = ("blocked",)

    def __init__(self, blocked: torch.Tensor):
        self.blocked = blocked


class Panels(Packed):
    """An fp32 or bf16 weight [N, K] as the native op's panels: `blocked` is [ceil(N / PANEL), K, PANEL] in the
    weight's dtype, panel p holding output columns p * PANEL .. (p + 1) * PANEL - 1 (zero rows past N)."""

    __slots__ = ("out_features",)

    def __init__(self, weight: torch.Tensor):
        n, k = weight.shape
        p = -(-n // PANEL)
        padded = weight if p * PANEL == n else F.pad(weight, (0, 0, 0, p * PANEL - n))
        super().__init__(padded.reshape(p, PANEL, k).transpose(1, 2).contiguous())
        self.out_features = n


def panels_available() -> bool:
    """Whether the native panel linear runs here and was measured faster than oneDNN (fp32) and torch (bf16): a
    native library built for AVX2 (without AVX-512)."""
    return native_ops.load() and native_ops.simd() == "avx2"


def panels_for(dtype: torch.dtype, device) -> bool:
    """Whether prepack(panels=True) packs weights of this dtype on this device as Panels."""
    return torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16) and panels_available()


def _pack(weight: torch.Tensor, rows_hint: int, panels: bool):
    """The packed form prepack() tries for `weight`, or None where it keeps the plain weight."""
    if weight.device.type != "cpu":
        return None
    if panels and weight.dim() == 2 and panels_for(weight.dtype, weight.device):
        return Panels(weight)
    if (
        weight.dtype in (torch.bfloat16, torch.float32)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    ):
        return Packed(torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint))
    return None


def prepack(weight: torch.Tensor, rows_hint: int = 32, panels: bool = False):
    """A packed copy of `weight` that computes F.linear on a probe: with `panels`, an fp32 or bf16 CPU weight as
    Panels where panels_available() (sums in fp32 in their own order: equal to F.linear to the dtype's rounding);
    else a Packed copy where oneDNN runs it (bf16 and fp32 on the CPU; bitwise F.linear in bf16, to fp32 rounding
    in fp32, whose kernels sum in another order than MKL's, which F.linear runs); else the weight unchanged.
    linear() takes any of them."""
    try:
        packed = _pack(weight, rows_hint, panels)
        if packed is None:
            return weight
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got = linear(probe, packed)
        if weight.dtype == torch.bfloat16 and not isinstance(packed, Panels):
            return packed if torch.equal(got, F.linear(probe, weight)) else weight
        want = _float_linear(probe, weight)
        rtol = 1e-4 if weight.dtype == torch.float32 else 1e-2  # bf16: the output's rounding (2^-8)
        if torch.allclose(got.float(), want, rtol=rtol, atol=rtol * 0.1 * float(want.abs().max())):
            return packed
    except RuntimeError:
        pass
    return weight


def _float_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear in fp32 of a few rows x, the weight widened 1M elements at a time: no fp32 copy of a whole bf16
    weight (twice its bytes) beside its packed form while a model loads."""
    rows = max(1, (1 << 20) // weight.shape[1])
    xf = x.float()
    return torch.cat([F.linear(xf, weight[i : i + rows].float()) for i in range(0, weight.shape[0], rows)], dim=-1)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for a plain, a Packed or a Panels weight."""
    if isinstance(weight, Panels):
        y = native_ops.linear_panels_native(x.reshape(-1, x.shape[-1]), weight.blocked, weight.out_features, bias)
        return y.view(*x.shape[:-1], weight.out_features)
    if isinstance(weight, Packed):
        return torch.ops.mkldnn._linear_pointwise(x, weight.blocked, bias, "none", [], "")
    return F.linear(x, weight, bias)
