"""The paged KV cache: fixed-size pages with checked reference counts.

Per layer, K and V are [num_pages * page_size, Hkv, D]; a token's K/V live at slot = page * page_size + offset.
Beside them, `hidden` [num_pages * page_size, hidden_size] keeps each computed token's final (normed) hidden
state, so that a later request scores any continuation of a cached prefix (or asks its log-probs again) with the
LM head alone, without recomputing the layers; and `memo` keeps, per slot, what scoring that token computed (its
log-prob given its prefix, whether it was the argmax, the top k), so that asking again costs nothing. Pages are
allocated per prefix-tree node and shared by reference
count when a node is split; a double free or a reference to a free page raises at once."""
from __future__ import annotations

import os

import torch

from .config import ModelConfig
from .errors import UserError


class PageError(AssertionError):
    """A page reference-count rule was broken (double free, incref of a free page, leak): an engine bug."""


def memory_bytes(device) -> int | None:
    """The memory a cache on `device` can use at most: the GPU's total memory, or the machine's physical memory
    (the CPU cache is allocated lazily, but a cache larger than the memory cannot be filled); None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(config: ModelConfig, tokens: int, dtype: torch.dtype, device) -> None:
    """A one-line UserError (before anything is allocated) when a cache of `tokens` tokens (K, V and the hidden
    states kept per slot) cannot fit in the device's memory."""
    per_token = (2 * config.num_layers * config.num_kv_heads * config.head_dim + config.hidden_size) * \
        torch.empty((), dtype=dtype).element_size()
    limit = memory_bytes(device)
    if limit is not None and tokens * per_token > limit:
        raise UserError(f"kv_tokens={tokens:,} needs {tokens * per_token / 2**30:,.1f} GiB of KV cache "
                        f"({per_token:,} bytes a token), more than the {limit / 2**30:,.1f} GiB of memory of "
                        f"{torch.device(device)}; lower --kv-tokens")


class KVCache:
    def __init__(self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device):
        self.num_pages, self.page_size = num_pages, page_size
        check_fits(config, num_pages * page_size, dtype, device)
        shape = (config.num_layers, num_pages * page_size, config.num_kv_heads, config.head_dim)
        # empty, not zeros: a slot is read only after its K/V were written, and untouched pages cost no memory
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.hidden = torch.empty(num_pages * page_size, config.hidden_size, dtype=dtype, device=device)
        self.refcount = [0] * num_pages
        self.epoch = [0] * num_pages  # bumped each time a page is handed out: older memo entries are stale
        self.memo: dict[int, tuple] = {}  # slot -> (epoch, logprob, is_greedy, top ids, top logprobs)
        self.free_pages = list(range(num_pages - 1, -1, -1))  # pop() hands out low pages first
        self.peak_used = 0  # the most pages held at once since the last reset_peak()

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self.free_pages)

    def reset_peak(self) -> int:
        """Start a new peak from the pages held now; returns the peak before."""
        peak, self.peak_used = self.peak_used, self.used_pages
        return peak

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages (refcount 1), or None when fewer than n are free."""
        if n > len(self.free_pages):
            return None
        pages = [self.free_pages.pop() for _ in range(n)]
        for p in pages:
            if self.refcount[p] != 0:
                raise PageError(f"page {p} handed out while still referenced ({self.refcount[p]})")
            self.refcount[p] = 1
            self.epoch[p] += 1
        self.peak_used = max(self.peak_used, self.used_pages)
        return pages

    def incref(self, pages: list[int]):
        for p in pages:
            if self.refcount[p] <= 0:
                raise PageError(f"incref of free page {p}")
            self.refcount[p] += 1

    def release(self, pages: list[int]):
        for p in pages:
            if self.refcount[p] <= 0:
                raise PageError(f"double free of page {p}")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self.free_pages.append(p)

    def write_hidden(self, slots: torch.Tensor, hidden: torch.Tensor):
        """Keep the final hidden states of the tokens just computed at their slots."""
        self.hidden[slots] = hidden

    def read_hidden(self, slots: list[int]) -> torch.Tensor:
        """The kept hidden states at these slots (a copy: later steps may reuse the slots)."""
        return self.hidden[torch.tensor(slots, dtype=torch.long, device=self.hidden.device)]

    def memo_get(self, slot: int, top_k: int):
        """(logprob, is_greedy, top ids, top logprobs) of the token at `slot` given its prefix, if scored since
        its page was handed out with at least top_k alternatives; else None."""
        entry = self.memo.get(slot)
        if entry is None or entry[0] != self.epoch[slot // self.page_size]:
            return None
        if top_k and (entry[3] is None or len(entry[3]) < top_k):
            return None
        return entry[1:]

    def memo_put(self, slot: int, logprob: float, greedy: bool, top_ids, top_lps):
        self.memo[slot] = (self.epoch[slot // self.page_size], logprob, greedy, top_ids, top_lps)

    def check(self, owners: list[list[int]]):
        """Every page's refcount equals the number of owners listing it, and the free list holds exactly the
        unreferenced pages (catches leaks as well as double frees)."""
        expect = [0] * self.num_pages
        for pages in owners:
            for p in pages:
                expect[p] += 1
        if expect != self.refcount:
            bad = next(p for p in range(self.num_pages) if expect[p] != self.refcount[p])
            raise PageError(f"page {bad}: refcount {self.refcount[bad]}, owned by {expect[bad]} node(s)")
        if sorted(self.free_pages) != [p for p in range(self.num_pages) if expect[p] == 0]:
            raise PageError("the free list does not hold exactly the unreferenced pages")

    def bytes_per_token(self) -> int:
        return 2 * self.k[:, :1].numel() * self.k.element_size() + self.hidden[:1].numel() * self.hidden.element_size()
