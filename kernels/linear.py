"""Linear layers with weights prepacked once at load (CPU, bf16 and fp32).

`F.linear` on bf16 CPU tensors hands oneDNN a plain [out, in] weight, which it reorders into its blocked layout
on every call. `prepack` does that reorder once; `linear(x, w)` then runs the same oneDNN kernel on the blocked
copy: the results are bitwise those of `F.linear` (tests/test_kernels_linear.py). Measured on SmolLM2's shapes
(1 thread): at a decode step's 32 rows a layer's four linears take 11% less time and the LM head 15% less (one of
the four, 576x960, took 8% more), at 1 row 1.7-2.6x faster; about the same for prefill chunks of hundreds of rows.
fp32 weights are packed too: F.linear runs MKL's sgemm for them, which packs the weight on every call; on an
AVX2 EPYC (1 thread) oneDNN's packed kernel ran the LM head's 32 decode rows 1.66x faster, the MLP's 1.38x and
1024-row chunks ~10% faster, equal to F.linear to fp32 rounding (not bitwise: another summation order).
Other dtypes and devices keep the plain weight: the reference `linear_ref` (= F.linear) runs for them.

A packed weight is an opaque oneDNN tensor: only `linear` may use it (no slicing, no .T). The model keeps plain
copies where other code reads the weight (the LM head in the fused target log-prob, the deterministic mode).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

linear_ref = F.linear


class Packed:
    """A weight in oneDNN's blocked layout, usable only by linear()."""
    __slots__ = ("blocked",)

    def __init__(self, blocked: torch.Tensor):
        self.blocked = blocked


def prepack(weight: torch.Tensor, rows_hint: int = 32):
    """A Packed copy of `weight` where oneDNN runs it (bf16 and fp32 on the CPU) and it computes F.linear on a
    probe: bitwise in bf16, to fp32 rounding in fp32 (oneDNN's kernel sums in another order than MKL's, which
    F.linear runs for fp32); else the weight unchanged. linear() takes either."""
    if not (weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float32)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return weight
    try:
        packed = Packed(torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint))
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got, want = linear(probe, packed), F.linear(probe, weight)
        if torch.equal(got, want) if weight.dtype == torch.bfloat16 else \
                torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())):
            return packed
    except RuntimeError:
        pass
    return weight


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for a plain or a Packed weight."""
    if isinstance(weight, Packed):
        return torch.ops.mkldnn._linear_pointwise(x, weight.blocked, bias, "none", [], "")
    return F.linear(x, weight, bias)
