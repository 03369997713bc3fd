"""A guard for code meant to run on the host's facts alone: inside `refused_tensor_reads()`, reading a tensor's
values back into Python (tolist, item, cpu, numpy, truth value) raises. On a GPU each such read makes the host wait
for the device, which the pipelined engine loop must not do while it builds a step."""

from __future__ import annotations

import contextlib

import torch

READS = ("tolist", "item", "cpu", "numpy", "__bool__")


@contextlib.contextmanager
def refused_tensor_reads(what: str):
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def refuse(*_args, **_kw):
        raise AssertionError(f"{what} read a tensor back")

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
