"""SwiGLU activation of the Llama MLP: silu(gate) * up, on the fused [.., 2 * intermediate] gate_up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
