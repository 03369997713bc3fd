"""The paged KV cache: fixed-size pages with reference counts.

Per layer, K and V are [num_pages * page_size, Hkv, D]; a token's K/V live at slot = page * page_size + offset.
Pages are allocated per prefix-tree node and shared by reference count when a node is split."""
from __future__ import annotations

import torch

from .config import ModelConfig


class KVCache:
    def __init__(self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device):
        self.num_pages, self.page_size = num_pages, page_size
        shape = (config.num_layers, num_pages * page_size, config.num_kv_heads, config.head_dim)
        # empty, not zeros: a slot is read only after its K/V were written, and untouched pages cost no memory
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.refcount = [0] * num_pages
        self.free_pages = list(range(num_pages - 1, -1, -1))  # pop() hands out low pages first
        self.peak_used = 0

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self.free_pages)

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages (refcount 1), or None when fewer than n are free."""
        if n > len(self.free_pages):
            return None
        pages = [self.free_pages.pop() for _ in range(n)]
        for p in pages:
            self.refcount[p] = 1
        self.peak_used = max(self.peak_used, self.used_pages)
        return pages

    def incref(self, pages: list[int]):
        for p in pages:
            self.refcount[p] += 1

    def release(self, pages: list[int]):
        for p in pages:
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self.free_pages.append(p)

    def bytes_per_token(self) -> int:
        return 2 * self.k[:, :1].numel() * self.k.element_size()
