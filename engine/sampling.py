"""Batched sampling for every generating row of a step: greedy, temperature and top-p (nucleus), in one pass.

Each request draws from its own seeded torch.Generator (one uniform number per token), so a request's tokens do
not depend on which other requests share its steps, and torch's global RNG is never touched. The draw is
inverse-CDF over the probabilities sorted in descending order: the same token as a multinomial draw would give
for the same uniform number, without a host sync per row."""

from __future__ import annotations

import torch

import kernels
from kernels import to_device


def new_generator(seed: int | None, device) -> torch.Generator:
    """A request's own generator: seeded, or from fresh OS entropy (never from or into the global RNG)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def sample(
    logits: torch.Tensor, temperature: list[float], top_p: list[float], generators: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] (the model's dtype; computed on in fp32) -> (tokens [n] int64, their log-probs [n] fp32 under
    the model's distribution).

    Row i is greedy (argmax) when temperature[i] <= 0 or top_p[i] <= 0, else sampled at temperature[i] from the
    smallest set of tokens whose probability mass reaches top_p[i] (the top token is always kept). The greedy
    rows take the fused argmax and log-prob (kernels.greedy_logprobs); only the sampled rows are copied to fp32."""
    n = logits.shape[0]
    tokens, logprobs = kernels.greedy_logprobs(logits)
    sampled = [i for i in range(n) if temperature[i] > 0 and top_p[i] > 0]
    if sampled:
        dev = logits.device  # the rows' parameters copied without waiting for the device (kernels.to_device)
        idx = to_device(torch.tensor(sampled), dev)
        rows = logits[idx].float()
        temp = to_device(torch.tensor([temperature[i] for i in sampled]), dev)[:, None]
        p = to_device(torch.tensor([top_p[i] for i in sampled]), dev)[:, None]
        probs, order = torch.sort(torch.softmax(rows / temp, dim=-1), dim=-1, descending=True)
        before = torch.cumsum(probs, dim=-1) - probs
        probs = torch.where(before < p, probs, 0.0)  # the top token always stays (before = 0 < p)
        cdf = torch.cumsum(probs, dim=-1)
        u = torch.cat([torch.rand(1, generator=generators[i], device=logits.device) for i in sampled])
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=cdf.shape[1] - 1)
        picked = order.gather(1, pick).squeeze(1)
        tokens[idx] = picked
        logprobs[idx] = torch.log_softmax(rows, dim=-1).gather(1, picked[:, None]).squeeze(1)
    return tokens, logprobs
