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


class HostCopy:
    """Device tensors read back to the host without making the host wait for work queued after them: each copy is
    queued now, right behind the work that computes it, into pinned memory (non-blocking), and a CUDA event marks
    its end; `get()` waits for that event only. A plain `.tolist()` later would be queued behind every step launched
    since, so the pipelined loop's read of step N would wait for step N + 1 too, and the device would idle while the
    host records N and plans N + 2. Elsewhere the tensors are kept as they are (None entries too)."""

    __slots__ = ("_host", "_event")

    def __init__(self, *tensors: torch.Tensor | None):
        self._event = None
        if any(t is not None and t.is_cuda for t in tensors):
            self._host = [
                None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                for t in tensors
            ]
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = list(tensors)

    def get(self) -> list[torch.Tensor | None]:
        """The host copies (waiting for the copies to land, on a GPU)."""
        if self._event is not None:
            self._event.synchronize()
        return self._host
