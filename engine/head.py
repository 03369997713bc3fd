"""The LM head of a step: after the forward has written the step's hidden states into the KV cache, the plan's score
rows go through the fused LM head + log-softmax (kernels' target log-prob: log-prob, is-greedy and top k per row,
each distinct (slot, target) once) and its sample rows through the LM head and the batched sampler (sampling.py).
It reads the plan (engine/plan.py) and the hidden states, never a request; the scheduler records what it returns."""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .model import LlamaModel
from .plan import HeadOutput, SampleOutput, ScoreOutput, StepPlan
from .sampling import sample


def run_head(plan: StepPlan, model: LlamaModel, kv: KVCache) -> HeadOutput:
    """The step's score and sample rows through the LM head (None for a kind of row the plan has none of)."""
    return HeadOutput(
        score(plan, model, kv) if plan.score_rows else None,
        sample_tokens(plan, model, kv) if plan.sample_rows else None,
    )


def score(plan: StepPlan, model: LlamaModel, kv: KVCache) -> ScoreOutput:
    """The plan's score rows through the fused LM head + log-softmax, in the plan's head batch (each distinct
    (slot, target) once, mapped back to every row asking it by the plan's inverse index)."""
    rows = plan.score_rows
    cached = 0 if plan.cached_hidden is None else len(plan.cached_hidden)
    hidden = kv.read_hidden([r.slot for r in rows[cached:]])
    if cached:
        hidden = torch.cat([plan.cached_hidden, hidden])
    targets = torch.tensor([r.target for r in rows], device=model.device)
    if plan.head_rows is not None:
        idx = torch.tensor(plan.head_rows, device=model.device)
        hidden, targets = hidden[idx], targets[idx]
    out = model.target_logprobs(hidden, targets, top_k=plan.top_k).rows()
    return ScoreOutput(out if plan.head_inverse is None else [out[i] for i in plan.head_inverse], len(out))


def sample_tokens(plan: StepPlan, model: LlamaModel, kv: KVCache) -> SampleOutput:
    """A token for each of the plan's sample rows, drawn with the row's own sampling parameters."""
    rows = plan.sample_rows
    logits = model.logits(kv.read_hidden([r.slot for r in rows]))
    tokens, lps = sample(logits, [r.temperature for r in rows], [r.top_p for r in rows], [r.generator for r in rows])
    return SampleOutput(tokens.tolist(), lps.tolist())
