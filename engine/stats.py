"""The engine's counters (`EngineStats`): what it computed and cached since it was made (`Engine.stats`) or over
one closed job (`Engine.last_stats`), plus the state of the loop when the snapshot was taken.

One schema for every reader: each field declares its kind and what it counts (`kind(name)`, `describe(name)`), and
everything else is derived from the fields: how two snapshots add up (`plus`, `since`), the wire form
(`to_dict` / `from_dict`, which refuses a missing or unknown name: the server's /health and its client, the Ray
runner's Arrow struct), the Prometheus metrics (frontends/server/metrics.py), run.json's totals and their help
(`counters()`, `describe`). A field added here shows up in all of them. A snapshot is a copy, never written by the
engine afterwards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace

# the kinds of field: how a field of two snapshots combines
COUNTER = "counter"  # grows with the work done: summed over jobs, subtracted for the growth since a snapshot
PEAK = "peak"  # the most held at once: the larger of two
JOB = "job"  # a closed job's own figure (zero in the running engine's snapshot): summed over jobs
STATE = "state"  # the loop's state when the snapshot was taken: the later snapshot's


def _field(kind: str, text: str):
    return field(default=0, metadata={"kind": kind, "help": text})


@dataclass
class EngineStats:
    requests: int = _field(COUNTER, "score requests (context, continuation) and generation prompts added")
    tokens_requested: int = _field(
        COUNTER,
        "input tokens the requests asked for (context + continuation - 1, or the prompt), as if none were shared",
    )
    tokens_computed: int = _field(COUNTER, "tokens that went through the model's layers (prefill, recompute, decode)")
    unique_tokens: int = _field(JOB, "distinct input tokens a closed job left to compute when it was added")
    cache_hit_tokens: int = _field(
        COUNTER, "requested tokens already computed (the prefix cache) when their request came"
    )
    peak_kv_pages: int = _field(PEAK, "the most KV pages held at once (since the engine was made, or during the job)")
    forward_steps: int = _field(COUNTER, "steps that ran the model's layers")
    hidden_rows: int = _field(
        COUNTER,
        "computed tokens whose final hidden state was asked for (the others skip the last layer's o-projection and MLP)",
    )
    attention_keys: int = _field(
        COUNTER, "(query, key) pairs of a layer's attention: a computed token sees its position + 1 keys"
    )
    preemptions: int = _field(COUNTER, "nodes whose pages were freed while still needed (recomputed later)")
    evicted_nodes: int = _field(COUNTER, "cached prefixes nobody referenced, evicted (least recently used first)")
    kv_waits: int = _field(COUNTER, "times a chunk waited for free KV pages")
    memo_hits: int = _field(COUNTER, "scored tokens answered from the log-prob memo, without the LM head")
    generated_tokens: int = _field(COUNTER, "tokens sampled by generate requests")
    scored_tokens: int = _field(COUNTER, "continuation tokens whose log-prob was recorded")
    lm_head_rows: int = _field(COUNTER, "rows through the LM head for scoring (one per (position, target) in a step)")
    kv_pages_used: int = _field(STATE, "KV pages held when the snapshot was taken")
    kv_pages_total: int = _field(STATE, "KV pages in the cache")
    running: int = _field(STATE, "requests with some result computed and not done, at the snapshot")
    waiting: int = _field(STATE, "requests added and nothing computed for them yet, at the snapshot")

    def count_step(self, tokens: int, hidden_rows: int, attention_keys: int):
        """A step that ran the model's layers on `tokens` tokens."""
        self.forward_steps += 1
        self.tokens_computed += tokens
        self.hidden_rows += hidden_rows
        self.attention_keys += attention_keys

    def copy(self) -> "EngineStats":
        return replace(self)

    def plus(self, other: "EngineStats") -> "EngineStats":
        """The totals of two jobs (or of the shards of one): counters and job figures added, the larger peak; the
        state fields are `other`'s (the later snapshot)."""
        return replace(
            other,
            **{name: getattr(self, name) + getattr(other, name) for name in (*COUNTERS, *_BY_KIND[JOB])},
            **{name: max(getattr(self, name), getattr(other, name)) for name in _BY_KIND[PEAK]},
        )

    def since(self, before: "EngineStats") -> "EngineStats":
        """The counters' growth since `before` (a snapshot of the same engine); the other fields are this one's."""
        return replace(self, **{name: getattr(self, name) - getattr(before, name) for name in COUNTERS})

    def counters(self) -> dict[str, int]:
        """The counters only (COUNTERS), by name: what run.json and lm-eval's results sum."""
        return {name: getattr(self, name) for name in COUNTERS}

    # ---- the wire form ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, int]:
        """Every field by name (JSON, an Arrow struct): `from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "EngineStats":
        """The EngineStats of `to_dict`'s form; a ValueError naming what is wrong for anything else (a missing or
        unknown name, a value that is not an integer), so a sender and a reader of different schemas fail loudly
        rather than drop or zero a field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"engine stats: expected an object of counters, got {type(data).__name__}")
        missing, unknown = [n for n in NAMES if n not in data], sorted(str(k) for k in data if k not in NAMES)
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(unknown)}"] if unknown else []
        )
        if problems:
            raise ValueError("engine stats: " + "; ".join(problems))
        bad = [n for n in NAMES if not isinstance(data[n], int) or isinstance(data[n], bool)]
        if bad:
            raise ValueError(f"engine stats: {bad[0]}: {data[bad[0]]!r} is not an integer")
        return cls(**{n: data[n] for n in NAMES})


NAMES = tuple(f.name for f in fields(EngineStats))
_KINDS = {f.name: f.metadata.get("kind") for f in fields(EngineStats)}
if not set(_KINDS.values()) <= {COUNTER, PEAK, JOB, STATE}:  # a field declared without _field
    raise TypeError(f"EngineStats fields without a kind: {sorted(n for n, k in _KINDS.items() if k is None)}")
_BY_KIND = {kind: tuple(n for n in NAMES if _KINDS[n] == kind) for kind in (COUNTER, PEAK, JOB, STATE)}
COUNTERS = _BY_KIND[COUNTER]


def kind(name: str) -> str:
    """COUNTER, PEAK, JOB or STATE: how the field combines (and, for a server, whether it is a counter or a gauge)."""
    return _KINDS[name]


def describe(name: str) -> str:
    """What the field counts, in one line (the metrics' help, run.json's stats_help)."""
    return next(f.metadata["help"] for f in fields(EngineStats) if f.name == name)
