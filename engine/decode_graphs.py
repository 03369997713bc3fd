"""Decode steps in fixed shapes, replayed from CUDA graphs (the engine option `decode_graphs`).

A decode step computes one token for each of a few dozen sequences: ~10 kernel launches a layer, each for a few
rows. On a GPU the host's Python and launch time for them can exceed the device's work (the GPU check's run 2:
35.6 ms a step at the Llama-3-8B shape against 5.4 ms to read the weights once). A CUDA graph records a step's
launches once and replays them in one call. The cascade attention cannot be recorded: its launches follow each
step's prefix tree (segments, waves, work items built on the host). So the recorded step is
`LlamaModel.forward_decode`, whose attention (kernels.paged_decode_attention) reads each row's context from a slot
table in device memory, and whose every input is a fixed device buffer that a replay reads anew.

`DecodeGraphs.forward(step)` takes a pure decode step (one new token per sequence, every row's final hidden state
kept, at most the largest bucket's rows) and runs it at the smallest bucket of rows that holds it (1, 2, 4, ...
256): the step's inputs are copied into the buffers (padding rows: token 0, position 0, the KV cache's scratch
slot, context length 0), and the bucket's graph is replayed. On a GPU every bucket's graph is captured when the
option is turned on (`capture_all`, on padding rows), each after one eager run that compiles the kernels. The slot
table grows by doubling when a context outgrows it; the graphs captured on the smaller one are dropped then, and
each bucket is captured again at its next step. Any other step returns None and the engine runs it eagerly, as it
does every step once a capture has failed (the error is logged once and kept in `stats()`).

Without CUDA (`capture=False`) the same fixed-shape step runs eagerly, so that the CPU tests check it against the
cascade; it is a GPU feature, off by default until the GPU check has measured it (benchmarks/gpu_check.py)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from kernels import copy_to, index_ranges

from .kv_cache import KVCache
from .model import LlamaModel
from .step import BuiltStep

log = logging.getLogger("engine")

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIRST_WIDTH = 256  # slots per row of the first slot table


class DecodeGraphs:
    def __init__(self, model: LlamaModel, kv: KVCache, max_rows: int, capture: bool):
        self.model, self.kv, self.capture = model, kv, capture
        top = next(b for b in BUCKETS if b >= min(max_rows, BUCKETS[-1]))
        self.buckets = [b for b in BUCKETS if b <= top]
        dev = model.device
        self.ids = torch.zeros(top, dtype=torch.long, device=dev)
        self.positions = torch.zeros(top, dtype=torch.long, device=dev)
        self.slots = torch.full((top,), kv.scratch_slot, dtype=torch.long, device=dev)
        self.lens = torch.zeros(top, dtype=torch.int32, device=dev)
        self.table = torch.zeros(top, 0, dtype=torch.int32, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.failed: str | None = None
        self.replays = self.eager_steps = self.captures = 0

    def stats(self) -> dict:
        return {
            "replays": self.replays,
            "fixed_shape_steps_eager": self.eager_steps,
            "captures": self.captures,
            "buckets_captured": sorted(self.graphs),
            "table_width": self.table.shape[1],
            "capture_failed": self.failed,
        }

    def forward(self, step: BuiltStep) -> torch.Tensor | None:
        """The final hidden states of a pure decode step's rows from the fixed-shape path, or None where the step
        is not one (or capture failed): the caller then runs the model's own forward."""
        batch = step.batch
        T = batch.token_ids.shape[0]
        if self.failed is not None or T == 0 or T > self.buckets[-1] or len(batch.cu_seqlens) != T + 1:
            return None
        if len(step.kept) != T:  # not every row's hidden state is asked for
            return None
        runs = [r for ctx in step.contexts for r in ctx]
        lens = np.asarray([sum(len(r) for r in ctx) for ctx in step.contexts], dtype=np.int64)
        if not np.array_equal(lens, np.asarray(batch.seq_starts, dtype=np.int64) + 1):
            return None  # a context whose slots do not hold positions 0.. in order (never expected)
        width = int(lens.max())
        if width > self.table.shape[1]:
            self._grow(width)
        bucket = next(b for b in self.buckets if b >= T)
        W = self.table.shape[1]
        table = np.zeros((T, W), dtype=np.int32)
        table.reshape(-1)[index_ranges(np.arange(T) * W, lens).numpy()] = torch.cat(runs).numpy()
        padded = np.zeros(bucket, dtype=np.int32)
        padded[:T] = lens
        copy_to(self.table[:T], torch.from_numpy(table))
        copy_to(self.lens[:bucket], torch.from_numpy(padded))
        self.ids[:T].copy_(batch.token_ids)
        self.positions[:T].copy_(batch.positions)
        self.slots[:T].copy_(batch.write_slots)
        if bucket > T:
            self.ids[T:bucket].zero_()
            self.positions[T:bucket].zero_()
            self.slots[T:bucket].fill_(self.kv.scratch_slot)
        out = self._run(bucket)
        return None if out is None else out[:T]

    def capture_all(self) -> None:
        """Every bucket's graph now (largest first), on padding rows only (token 0 at the scratch slot, context
        length 0: nothing but the scratch slot is written), so that no step waits for a capture later; the engine
        calls it when the option is turned on on a GPU. Without capture (a CPU) each bucket's step runs once
        eagerly. Stops at the first capture error (kept in `stats()`)."""
        if self.table.shape[1] == 0:
            self._grow(FIRST_WIDTH)
        self.ids.zero_()
        self.positions.zero_()
        self.slots.fill_(self.kv.scratch_slot)
        self.lens.zero_()
        for bucket in reversed(self.buckets):
            if not self.capture:
                self.model.forward_decode(*self._args(bucket))
            elif bucket not in self.graphs and self._capture(bucket) is None:
                return

    def _args(self, bucket: int) -> tuple:
        n = slice(0, bucket)
        return self.ids[n], self.positions[n], self.slots[n], self.kv, self.table[n], self.lens[n]

    def _run(self, bucket: int) -> torch.Tensor | None:
        if not self.capture:
            self.eager_steps += 1
            return self.model.forward_decode(*self._args(bucket))
        hit = self.graphs.get(bucket) or self._capture(bucket)
        if hit is None:
            return None
        hit[0].replay()
        self.replays += 1
        return hit[1]

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        """The bucket's graph and its output buffer, captured from the buffers as they are; None (and every step
        eager from now on) when the capture fails."""
        try:
            # one eager run on a side stream first (as torch.cuda.graph's documentation warms up): it compiles the
            # kernels and sets up the libraries' per-stream state; it writes the same K/V as the replay
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.model.forward_decode(*self._args(bucket))
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.model.forward_decode(*self._args(bucket))
        except Exception as e:  # noqa: BLE001  # a launch that cannot be captured: every step runs eagerly now
            self.failed = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            log.warning("decode graphs: capture of %d rows failed, running eagerly: %s", bucket, self.failed)
            self.graphs.clear()
            return None
        self.captures += 1
        hit = self.graphs[bucket] = (graph, out)
        return hit

    def _grow(self, width: int) -> None:
        """A slot table at least `width` wide (doubling); the graphs recorded the old table's address."""
        w = max(FIRST_WIDTH, self.table.shape[1])
        while w < width:
            w *= 2
        self.graphs.clear()
        self.table = torch.zeros(self.table.shape[0], w, dtype=torch.int32, device=self.table.device)
