"""The engine: loads a model, then scores continuations and generates text on one prefix-shared paged KV cache.

A score job: tokenize every request, insert all of them into the prefix tree (each request's tokens reused from
the cache up to, not past, its first scored position), let the planner compute every pending node once, and read
the log-prob of each continuation token from the fused target log-prob kernel."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

import kernels

from .config import ModelConfig
from .errors import UserError
from .kv_cache import KVCache
from .loader import load_model_files
from .model import LlamaModel
from .planner import Planner, drop, keep_cached
from .prefix_tree import Node, insert
from .requests import encode_pairs
from .step import build_step

log = logging.getLogger("engine")

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class ScoreResult:
    logprob: float
    token_logprobs: list[float]
    num_tokens: int
    is_greedy: bool


@dataclass
class EngineOptions:
    kv_tokens: int = 65536  # KV cache capacity in tokens
    page_size: int = 16
    token_budget: int = 1024  # new tokens per forward step
    keep_cache: bool = False  # online mode: keep computed prefixes across calls (LRU-evicted under pressure)
    deterministic: bool = False  # batch-invariant ops: a request's scores do not depend on the rest of the job
    stats: dict = field(default_factory=dict)


def new_stats() -> dict:
    return dict(requests=0, tokens_requested=0, tokens_computed=0, unique_tokens=0, cache_hit_tokens=0,
                peak_kv_pages=0, forward_steps=0, preemptions=0, evicted_nodes=0)


class Engine:
    def __init__(self, config: ModelConfig, weights: dict, tokenizer, dtype=torch.bfloat16, device="cpu",
                 **options):
        self.config, self.tokenizer, self.device = config, tokenizer, torch.device(device)
        self.dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        self.options = EngineOptions(**options)
        self.model = LlamaModel(config, weights, self.dtype, self.device, self.options.deterministic)
        pages = -(-self.options.kv_tokens // self.options.page_size)
        self.kv = KVCache(config, pages, self.options.page_size, self.dtype, self.device)
        self.root = Node([], None, 0)
        self.last_stats = new_stats()
        log.info("engine: %s, %d layers, %s on %s, kernels: %s", config.arch, config.num_layers, self.dtype,
                 self.device, kernels.describe(str(self.device.type)))

    @classmethod
    def load(cls, model: str | None = None, dtype="bfloat16", device="cpu", threads: int | None = None,
             **options) -> "Engine":
        if isinstance(dtype, str) and dtype not in DTYPES:
            raise UserError(f"unknown dtype {dtype!r} (use one of {', '.join(DTYPES)})")
        if threads is not None:
            torch.set_num_threads(threads)
        config, weights, tokenizer = load_model_files(model)
        return cls(config, weights, tokenizer, dtype=dtype, device=device, **options)

    # ---- scoring -------------------------------------------------------------------------------------------
    def score(self, requests, share_prefix: bool = True, progress: bool = False) -> list[ScoreResult]:
        """log P(continuation | context) for each (context, continuation) request (text or token ids)."""
        stats = self.last_stats = new_stats()
        self.kv.peak_used = self.kv.used_pages
        encoded = encode_pairs(self.tokenizer, requests)
        self._check_lengths(encoded)
        logprobs = [[0.0] * len(cont) for _, cont in encoded]
        greedy = [[False] * len(cont) for _, cont in encoded]
        root = self.root if self.options.keep_cache else Node([], None, 0)
        for i, (ctx, cont) in enumerate(encoded):
            full = ctx + cont
            first = len(ctx) - 1  # first scored position: its hidden state predicts cont[0]
            if share_prefix:
                reused, path = insert(root, full[:-1], first, self.kv)
            else:
                leaf = Node(full[:-1], root, 0)
                leaf.key = ("request", i)
                root.children[leaf.key] = leaf
                root.open_children += 1
                reused, path = 0, [leaf]
            for node in reversed(path):
                lo = max(first, node.start)
                node.rows += [(p - node.start, i, p - first, full[p + 1]) for p in range(lo, node.start + len(node))]
                if node.start <= first:
                    break
            stats["cache_hit_tokens"] += reused
            stats["tokens_requested"] += len(full) - 1
        stats["requests"] = len(encoded)
        stats["unique_tokens"] = _pending_tokens(root)
        bar = tqdm(total=stats["unique_tokens"], unit="tok", desc="scoring", disable=not progress)

        def execute(chunks):
            batch, scored = build_step(chunks, self.device)
            hidden = self.model.forward(batch, self.kv)
            if scored:
                targets = torch.tensor([s[3] for s in scored], device=self.device)
                lp, gr = self.model.target_logprobs(hidden, targets)
                for (_, req, j, _), v, g in zip(scored, lp.tolist(), gr.tolist()):
                    logprobs[req][j], greedy[req][j] = v, g
            bar.update(sum(b - a for _, a, b in chunks))

        try:
            Planner(root, self.kv, self.options.token_budget, self.options.keep_cache, stats).run(execute)
        finally:
            bar.close()
            if self.options.keep_cache:
                keep_cached(root, self.kv)
            else:
                for child in list(root.children.values()):
                    drop(child, self.kv)
        stats["peak_kv_pages"] = max(stats["peak_kv_pages"], self.kv.peak_used)
        return [ScoreResult(sum(lp), lp, len(lp), all(g)) for lp, g in zip(logprobs, greedy)]

    def _check_lengths(self, encoded):
        limit = min(self.config.max_position, self.options.kv_tokens)
        for i, (ctx, cont) in enumerate(encoded):
            if len(ctx) + len(cont) > limit:
                raise UserError(f"request {i}: {len(ctx) + len(cont)} tokens exceed the model's maximum of {limit}")

    # ---- generation ----------------------------------------------------------------------------------------
    def generate(self, prompts, max_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, stop: list[str] | None = None, progress: bool = False):
        from .generation import generate

        return generate(self, prompts, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        stop=stop, progress=progress)


def _pending_tokens(node: Node) -> int:
    return sum(len(c) - c.done + _pending_tokens(c) for c in node.children.values())
