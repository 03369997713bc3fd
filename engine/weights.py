"""A checkpoint's tensors read one at a time (engine/loader.py): the lean-loading half shared by the GGUF and the
safetensors readers."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch


class LazyWeights(Mapping):
    """A checkpoint's tensors by HF name, read one at a time: `weights[name]` reads that tensor from the file now
    (as stored, or float32 where it was quantized) into memory of its own, `read(name, dtype)` straight into a
    dtype; `shape(name)` reads nothing. The model converts each to its layout and drops it, so no whole-model
    intermediate copy ever exists."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], read: Callable[[str, torch.dtype | None], torch.Tensor]):
        self._shapes, self._read = shapes, read

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.read(name)

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor in `dtype` (None: as stored, float32 where quantized). A reader that converts as it goes
        (the GGUF dequantizer, a block of rows at a time) never holds a float32 copy of a bf16 weight."""
        if name not in self._shapes:
            raise KeyError(name)
        t = self._read(name, dtype)
        return t if dtype is None else t.to(dtype)

    def __contains__(self, name) -> bool:  # (Mapping's default would read the tensor)
        return name in self._shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


def read_as(weights: Mapping[str, torch.Tensor], name: str, dtype: torch.dtype) -> torch.Tensor:
    """weights[name] in `dtype`: a LazyWeights converts while it reads, a plain dict's tensor is cast."""
    return weights.read(name, dtype) if isinstance(weights, LazyWeights) else weights[name].to(dtype)


def shape_of(weights: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """weights[name]'s shape without reading it from a LazyWeights."""
    return weights.shape(name) if isinstance(weights, LazyWeights) else tuple(weights[name].shape)


_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)


def release_free_memory() -> None:
    """Gives the C heap's free pages back to the system (glibc malloc_trim; nothing elsewhere). Tensors freed while
    a model is built (the unfused and unpacked forms of each weight) leave free chunks in the heap that malloc
    would otherwise keep resident for good."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def release_pages(view: np.ndarray) -> None:
    """Drops the pages of a memory-mapped file region from this process's resident set (madvise DONTNEED on the
    whole pages it covers): the data stays in the file (and the page cache) and is read again if touched."""
    if view.nbytes == 0:
        return
    start = view.ctypes.data - view.ctypes.data % mmap.PAGESIZE
    end = view.ctypes.data + view.nbytes
    _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)
