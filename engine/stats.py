"""The engine's counters (`EngineStats`): what it computed and cached since it was made (`Engine.stats`) or over
one closed job (`Engine.last_stats`), plus the state of the loop when the snapshot was taken.

Readers use the attributes, or `dataclasses.asdict` / `dataclasses.fields(EngineStats)` for the names (the
server's /health and /metrics, run.json totals); a snapshot is a copy, never written by the engine afterwards."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass
class EngineStats:
    requests: int = 0  # requests added (score and generate)
    tokens_requested: int = 0  # input tokens the requests asked for (context + continuation - 1, or the prompt)
    tokens_computed: int = 0  # tokens that went through the model's layers (prefill, recompute and decode)
    unique_tokens: int = 0  # distinct input tokens a closed job left to compute when it was added (jobs only)
    cache_hit_tokens: int = 0  # requested tokens already computed when their request came
    peak_kv_pages: int = 0  # the most KV pages held at once (since the engine was made, or during the job)
    forward_steps: int = 0  # steps that ran the model's layers
    hidden_rows: int = 0  # computed tokens whose final hidden state was asked for (the others skip the last
    # layer's o-projection and MLP)
    attention_keys: int = 0  # (query, key) pairs of a layer's attention: a computed token sees its position + 1 keys
    preemptions: int = 0  # nodes whose pages were freed while still needed (recomputed later)
    evicted_nodes: int = 0  # cached prefixes nobody referenced, evicted (least recently used first) for pages
    kv_waits: int = 0  # times a chunk waited for free pages
    memo_hits: int = 0  # scored tokens answered from the log-prob memo (prefix_cache.py), without the LM head
    generated_tokens: int = 0  # tokens sampled by generate requests
    scored_tokens: int = 0  # continuation tokens whose log-prob was recorded
    lm_head_rows: int = 0  # rows through the LM head for scoring (one per (position, target) asked in a step)
    kv_pages_used: int = 0  # KV pages held when the snapshot was taken
    kv_pages_total: int = 0  # KV pages in the cache
    running: int = 0  # requests with some result computed and not done, at the snapshot
    waiting: int = 0  # requests added and nothing computed for them yet, at the snapshot

    def count_step(self, tokens: int, hidden_rows: int, attention_keys: int):
        """A step that ran the model's layers on `tokens` tokens."""
        self.forward_steps += 1
        self.tokens_computed += tokens
        self.hidden_rows += hidden_rows
        self.attention_keys += attention_keys

    def copy(self) -> "EngineStats":
        return replace(self)

    def plus(self, other: "EngineStats") -> "EngineStats":
        """The totals of two jobs (or of the shards of one): counters and unique tokens added, the larger peak; the
        state fields are `other`'s (the later snapshot)."""
        return replace(
            other,
            **{name: getattr(self, name) + getattr(other, name) for name in COUNTERS},
            unique_tokens=self.unique_tokens + other.unique_tokens,
            peak_kv_pages=max(self.peak_kv_pages, other.peak_kv_pages),
        )

    def since(self, before: "EngineStats") -> "EngineStats":
        """The counters' growth since `before` (a snapshot of the same engine); the state fields are this one's."""
        return replace(self, **{name: getattr(self, name) - getattr(before, name) for name in COUNTERS})


COUNTERS = tuple(
    f.name
    for f in fields(EngineStats)
    if f.name not in ("peak_kv_pages", "unique_tokens", "kv_pages_used", "kv_pages_total", "running", "waiting")
)
