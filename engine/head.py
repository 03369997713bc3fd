"""The LM head of a step: after the forward has written the step's hidden states into the KV cache, the plan's score
rows go through the fused LM head + log-softmax (kernels' target log-prob: log-prob, is-greedy and top k per row,
each distinct (slot, target) once) and its sample rows through the LM head and the batched sampler (sampling.py).
It reads the plan (engine/plan.py) and the hidden states, never a request; the scheduler records what it returns.
Nothing is read from the device before `PendingHead.result()`."""

from __future__ import annotations

import torch

from kernels import HostCopy, LogProbs, to_device

from .kv_cache import KVCache
from .model import LlamaModel
from .plan import HeadOutput, SampleOutput, ScoreOutput, StepPlan
from .sampling import sample


class PendingHead:
    """A step's LM head launched: the score rows' log-probs and the sample rows' tokens on their way to the host
    (kernels.HostCopy: queued behind the step, so reading them never waits for a step launched after it) until
    `result()` reads them; `sampled` (the tokens on the device, in the plan's sample-row order) feeds the next step
    when it is launched before this one is read (engine/step.py)."""

    def __init__(self, plan: StepPlan, score: LogProbs | None, sample: tuple[torch.Tensor, torch.Tensor] | None):
        self.plan = plan
        self._score = (
            None if score is None else HostCopy(score.logprob, score.greedy, score.top_ids, score.top_logprobs)
        )
        self._sample = None if sample is None else HostCopy(*sample)
        self.sampled = None if sample is None else sample[0]

    def result(self) -> HeadOutput:
        plan, out, sampled = self.plan, None, None
        if self._score is not None:
            rows = LogProbs(*self._score.get()).rows()
            out = ScoreOutput(rows if plan.head_inverse is None else [rows[i] for i in plan.head_inverse], len(rows))
        if self._sample is not None:
            tokens, lps = self._sample.get()
            sampled = SampleOutput(tokens.tolist(), lps.tolist())
        return HeadOutput(out, sampled)


def launch_head(plan: StepPlan, model: LlamaModel, kv: KVCache) -> PendingHead:
    """The step's score and sample rows through the LM head, the score rows' results left on the device."""
    return PendingHead(
        plan,
        score(plan, model, kv) if plan.score_rows else None,
        sample_tokens(plan, model, kv) if plan.sample_rows else None,
    )


def score(plan: StepPlan, model: LlamaModel, kv: KVCache) -> LogProbs:
    """The plan's score rows through the fused LM head + log-softmax, in the plan's head batch (each distinct
    (slot, target) once; PendingHead maps them back to every row asking by the plan's inverse index)."""
    rows = plan.score_rows
    cached = 0 if plan.cached_hidden is None else len(plan.cached_hidden)
    hidden = kv.read_hidden([r.slot for r in rows[cached:]])
    if cached:
        hidden = torch.cat([plan.cached_hidden, hidden])
    targets = to_device(torch.tensor([r.target for r in rows]), model.device)
    if plan.head_rows is not None:
        idx = to_device(torch.tensor(plan.head_rows), model.device)
        hidden, targets = hidden[idx], targets[idx]
    return model.target_logprobs(hidden, targets, top_k=plan.top_k)


def sample_tokens(plan: StepPlan, model: LlamaModel, kv: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """A token for each of the plan's sample rows, drawn with the row's own sampling parameters: (tokens [n]
    int64, their log-probs [n] fp32), left on the device."""
    rows = plan.sample_rows
    logits = model.logits(kv.read_hidden([r.slot for r in rows]))
    return sample(logits, [r.temperature for r in rows], [r.top_p for r in rows], [r.generator for r in rows])
