"""The torch device a --device value names, checked before any work (cpu, cuda, cuda:N)."""

from __future__ import annotations

import logging
import re

from .errors import UserError

log = logging.getLogger("engine")


def resolve_device(name: str | None, cpu_fallback: bool = False, local: bool = True) -> str:
    """The torch device string for a --device value (None or 'auto': cuda when available, else cpu).
    `cpu_fallback`: a cuda device on a machine without a GPU gives cpu and a warning instead of an error (for
    callers whose default is cuda, such as lm-evaluation-harness). `local=False` (Ray workers): only the form is
    checked here (cpu or cuda, one GPU per worker), the GPUs by the cluster."""
    import torch

    if name is None or name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", name.strip())
    if not m or (m.group(1) == "cpu" and m.group(2) is not None):
        raise UserError(f"--device {name!r}: expected cpu, cuda or cuda:N")
    if not local:
        if m.group(2) is not None:
            raise UserError(f"--device {name}: with --ray each worker gets a GPU of its own: use --device cuda")
        return m.group(1)
    if m.group(1) == "cuda":
        if not torch.cuda.is_available() and cpu_fallback:
            log.warning("device %s: no CUDA GPU is available on this machine; running on cpu", name)
            return "cpu"
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU is available on this machine (use --device cpu)")
        index = int(m.group(2) or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name.strip()
