"""Host-built index tensors: built from Python ints in a few array ops (`index_ranges`), sent to the device without
waiting for it (`to_device`, or `copy_to` into a buffer already there)."""

from __future__ import annotations

import numpy as np
import torch


def index_ranges(starts, lengths) -> torch.Tensor:
    """range(start, start + length) for each pair, concatenated (int64, on the host), in a few array ops whatever
    the count."""
    return torch.from_numpy(index_ranges_np(starts, lengths))


def index_ranges_np(starts, lengths) -> np.ndarray:
    """index_ranges as a numpy array."""
    n = np.asarray(lengths, dtype=np.int64)
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(n) - n)  # value minus output index, per range
    return np.arange(int(n.sum()), dtype=np.int64) + np.repeat(shift, n)


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t`, a host tensor built for one call, on `device`, copied without waiting for the work already queued
    there. torch's blocking host-to-device copy synchronises the stream, so the host would wait for the step
    before to finish (no planning of the next step while the device computes this one); a copy from pageable
    memory may do the same in the driver. So on a GPU the tensor goes through pinned memory and is copied
    asynchronously (torch's caching host allocator keeps the pinned block until the copy has run). Elsewhere it
    is a plain `to`."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def copy_to(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`src`, a host tensor, into `dst` (a buffer on any device, of src's shape) without waiting for the device's
    queued work: through pinned memory on a GPU, as `to_device`."""
    dst.copy_(src.pin_memory() if dst.is_cuda else src, non_blocking=dst.is_cuda)
