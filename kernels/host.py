"""Host-built index tensors sent to the device without waiting for it."""

from __future__ import annotations

import torch


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
