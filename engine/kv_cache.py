"""The page store: the paged KV cache (`KVCache`), fixed-size pages with checked reference counts, and the page
runs (`PageRun`) it hands to the prefix tree (engine/prefix_cache.py), one per node.

Per layer, K and V are [num_pages * page_size + 1, Hkv, D]; a token's K/V live at slot = page * page_size + offset
(the last slot is scratch, no page's).
Beside them, `hidden` [num_pages * page_size, hidden_size] keeps the final (normed) hidden state of each computed
token that a request asked for when it was computed (`has_hidden` says which: the model's last layer runs its
o-projection and MLP on those rows only), so that a later request scores a continuation of a cached prefix (or asks
its log-probs again) with the LM head alone, without recomputing the layers (a request that needs a state that was
not kept computes its continuation's positions anew: Scheduler._add_score); and `memo` keeps, per slot, what
scoring that token computed (its log-prob given its prefix, whether it was the argmax, the top k), so that asking
again costs nothing.

A page run is one node's pages and the cache slot of each of its tokens; only this module changes it (grow, split,
free): a split cuts a run wherever its node is cut, the page holding the cut then shared by reference count. A
double free or a reference to a free page raises at once."""

from __future__ import annotations

import os

import numpy as np
import torch

from kernels import TokenLogProb, to_device

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
    per_token = (2 * config.num_layers * config.num_kv_heads * config.head_dim + config.hidden_size) * torch.empty(
        (), dtype=dtype
    ).element_size()
    limit = memory_bytes(device)
    if limit is not None and tokens * per_token > limit:
        raise UserError(
            f"kv_tokens={tokens:,} needs {tokens * per_token / 2**30:,.1f} GiB of KV cache "
            f"({per_token:,} bytes a token), more than the {limit / 2**30:,.1f} GiB of memory of "
            f"{torch.device(device)}; lower --kv-tokens"
        )


class KVCache:
    def __init__(self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device):
        self.num_pages, self.page_size = num_pages, page_size
        check_fits(config, num_pages * page_size, dtype, device)
        # one slot past the pages' (`scratch_slot`, never handed out): the padding rows of a fixed-shape step (a
        # decode step replayed from a CUDA graph, engine/decode_graphs.py) store their K/V there
        self.scratch_slot = num_pages * page_size
        shape = (config.num_layers, num_pages * page_size + 1, config.num_kv_heads, config.head_dim)
        # empty, not zeros: a slot is read only after its K/V were written, and untouched pages cost no memory
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.hidden = torch.empty(num_pages * page_size, config.hidden_size, dtype=dtype, device=device)
        # which slots' hidden states are kept: on the host, so that adding a request (Scheduler._add_score asks
        # hidden_kept) never waits for the device, even while a step runs there
        self.has_hidden = np.zeros(num_pages * page_size, dtype=bool)
        # absolute position of the token at each slot, written with its K/V: sliding-window layers mask by it
        self.positions = (
            torch.empty(num_pages * page_size + 1, dtype=torch.int64, device=device) if config.sliding_window else None
        )
        self.refcount = [0] * num_pages
        self.epoch = [0] * num_pages  # bumped each time a page is handed out: older memo entries are stale
        self.memo: dict[int, tuple[int, TokenLogProb]] = {}  # slot -> (its page's epoch, what scoring it computed)
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

    def write_hidden(self, written: torch.Tensor, kept: torch.Tensor, kept_here: torch.Tensor, hidden: torch.Tensor):
        """The tokens just computed at slots `written` (host): keep the final hidden states `hidden` of those at
        slots `kept` (host; `kept_here`: the same slots on the cache's device); the others have none."""
        self.has_hidden[written.numpy()] = False
        self.has_hidden[kept.numpy()] = True
        self.hidden[kept_here] = hidden

    def hidden_kept(self, slots: list[int]) -> bool:
        """Whether every one of these computed tokens' final hidden states is kept (read on the host)."""
        return not slots or bool(self.has_hidden[slots].all())

    def read_hidden(self, slots: list[int]) -> torch.Tensor:
        """The kept hidden states at these slots (a copy: later steps may reuse the slots)."""
        return self.hidden[to_device(torch.tensor(slots, dtype=torch.long), self.hidden.device)]

    def memo_get(self, slot: int, top_k: int) -> TokenLogProb | None:
        """What scoring the token at `slot` given its prefix computed, if it was scored since its page was handed
        out, with at least top_k alternatives; else None."""
        entry = self.memo.get(slot)
        if entry is None or entry[0] != self.epoch[slot // self.page_size]:
            return None
        known = entry[1]
        if top_k and (known.top_ids is None or len(known.top_ids) < top_k):
            return None
        return known

    def memo_put(self, slot: int, scored: TokenLogProb):
        self.memo[slot] = (self.epoch[slot // self.page_size], scored)

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

    # ---- page runs: the pages of one prefix-tree node and the slot of each of its tokens ----------------------------
    def grow(self, run: "PageRun", end: int) -> bool:
        """Allocate pages so the run's tokens [0, end) have slots. False (nothing allocated) when the pool is short."""
        ps = self.page_size
        capacity = len(run.pages) * ps - run.offset
        if end <= capacity:
            return True
        new = self.alloc(-(-(end - capacity) // ps))
        if new is None:
            return False
        base = torch.tensor(new, dtype=torch.long).repeat_interleave(ps) * ps + torch.arange(ps).repeat(len(new))
        if not run.pages:
            run.offset = 0
        fill = min(len(base), len(run.slots) - capacity)
        run.slots[capacity : capacity + fill] = base[:fill]
        run.pages += new
        return True

    def split(self, run: "PageRun", m: int) -> "PageRun":
        """Cut a run after m tokens (0 < m < its length): returns the upper run (tokens [0, m)); `run` keeps the tail.
        The page holding the cut is then shared by reference count, each half writing only its own slots."""
        ps = self.page_size
        upper = PageRun(0)
        upper.slots = run.slots[:m].clone()
        if run.pages:
            upper.offset = run.offset
            upper.pages = run.pages[: min(len(run.pages), -(-(run.offset + m) // ps))]
            self.incref(upper.pages)
            first = (run.offset + m) // ps
            self.release(run.pages[:first])
            offset = (run.offset + m) % ps if first < len(run.pages) else 0
            run.pages, run.offset = run.pages[first:], offset
        run.slots = run.slots[m:].clone()
        return upper

    def free(self, run: "PageRun"):
        """Release a run's pages (its slots are meaningless until it grows again)."""
        self.release(run.pages)
        run.pages, run.offset = [], 0

    def bytes_per_token(self) -> int:
        return 2 * self.k[:, :1].numel() * self.k.element_size() + self.hidden[:1].numel() * self.hidden.element_size()


class PageRun:
    """The pages one prefix-tree node holds and the cache slot of each of its tokens (read by the tree; changed only by
    the KVCache methods grow / split / free)."""

    __slots__ = ("pages", "offset", "slots")

    def __init__(self, capacity: int):
        self.pages: list[int] = []
        self.offset = 0  # offset of the run's first token inside pages[0]
        self.slots = torch.empty(capacity, dtype=torch.long)
