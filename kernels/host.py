"""Host-built index tensors sent to the device without waiting for it."""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t`, a host tensor built for one call and not written again, on `device`, copied without waiting for the
    work already queued there. A blocking host-to-device copy makes torch synchronise the stream, so the host
    would wait for the step before to finish (no planning of the next step while the device computes this one);
    a non-blocking copy from pageable memory is staged at once, so the source may be dropped when this returns.
    On the CPU it is `t` itself."""
    return t.to(device, non_blocking=True)
