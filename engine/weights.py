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
    (as stored, or float32 where it was quantized) into memory of its own; `shape(name)` reads nothing. The model
    converts each to its dtype and layout and drops it, so no whole-model intermediate copy ever exists."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], read: Callable[[str], torch.Tensor]):
        self._shapes, self._read = shapes, read

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._shapes:
            raise KeyError(name)
        return self._read(name)

    def __contains__(self, name) -> bool:  # (Mapping's default would read the tensor)
        return name in self._shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


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
