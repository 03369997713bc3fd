"""The tile policy of the Triton launchers: GPU tile sizes for CUDA tensors, small ones under the CPU interpreter.
`forced_gpu_tiles()` makes the launchers pick the GPU's tiles for CPU (or meta) tensors too: the ahead-of-time
compilation (kernels/aot.py) records the launches a GPU step makes that way."""

from __future__ import annotations

import contextlib

import torch

_force = {"gpu": False}


def gpu_tiles(t: torch.Tensor) -> bool:
    """Whether a launcher picks its GPU tile sizes for tensors like `t`: on CUDA, or inside forced_gpu_tiles()."""
    return t.is_cuda or _force["gpu"]


@contextlib.contextmanager
def forced_gpu_tiles():
    _force["gpu"] = True
    try:
        yield
    finally:
        _force["gpu"] = False
