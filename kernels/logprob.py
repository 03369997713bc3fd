"""Fused target log-prob: hidden states x LM head -> log-softmax of the target token only.

The vocabulary is walked in tiles with an online log-sum-exp, so no [tokens x vocab] tensor is ever written."""
from __future__ import annotations

import torch

VOCAB_TILE = 8192
ROW_TILE = 512


def target_logprobs_ref(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        vocab_tile: int = VOCAB_TILE, row_tile: int = ROW_TILE):
    """hidden [N, Dm], weight [V, Dm], targets [N] int64 -> (logprob [N] fp32, is_greedy [N] bool).

    is_greedy: the target's logit is the largest (lm-evaluation-harness's `is_greedy`)."""
    N, V = hidden.shape[0], weight.shape[0]
    logprob = torch.empty(N, dtype=torch.float32, device=hidden.device)
    greedy = torch.empty(N, dtype=torch.bool, device=hidden.device)
    for r0 in range(0, N, row_tile):
        h, t = hidden[r0:r0 + row_tile], targets[r0:r0 + row_tile]
        n = h.shape[0]
        run_max = torch.full((n,), float("-inf"), device=h.device)
        run_sum = torch.zeros(n, device=h.device)
        tgt = torch.empty(n, device=h.device)
        for v0 in range(0, V, vocab_tile):
            # fp32 product: bf16 logits (ulp 0.125 at 20) would quantise the log-probs the scores are made of
            logits = h.float() @ weight[v0:v0 + vocab_tile].float().T  # [n, tile]
            tile_max = logits.max(dim=-1).values
            new_max = torch.maximum(run_max, tile_max)
            run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(logits - new_max[:, None]).sum(-1)
            run_max = new_max
            inside = (t >= v0) & (t < v0 + logits.shape[1])
            if inside.any():
                rows = inside.nonzero().squeeze(1)
                tgt[rows] = logits[rows, t[rows] - v0]
        logprob[r0:r0 + n] = tgt - run_max - torch.log(run_sum)
        greedy[r0:r0 + n] = tgt >= run_max
    return logprob, greedy
