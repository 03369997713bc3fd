"""Fused target log-prob: hidden states x LM head -> log-softmax of the target token only, and optionally the k
most likely tokens with their log-probs.

The vocabulary is walked in tiles with an online log-sum-exp and a running top-k (merged tile by tile), so no
[tokens x vocab] tensor is ever written."""

from __future__ import annotations

from dataclasses import dataclass

import torch

VOCAB_TILE = 8192
ROW_TILE = 512


@dataclass(frozen=True, slots=True)
class TokenLogProb:
    """One row of a LogProbs in Python values: what scoring one token computed (the prefix cache's memo entry)."""

    logprob: float
    greedy: bool
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None


@dataclass(frozen=True, slots=True)
class LogProbs:
    """What every target log-prob implementation returns for N rows (hidden state, target token)."""

    logprob: torch.Tensor  # [N] fp32: log P(target)
    greedy: torch.Tensor  # [N] bool: the target's logit is the largest (lm-evaluation-harness's is_greedy)
    top_ids: torch.Tensor | None = None  # [N, k] int64 with top_k > 0: the k most likely tokens, best first
    top_logprobs: torch.Tensor | None = None  # [N, k] fp32: their log-probs

    def __len__(self) -> int:
        return self.logprob.shape[0]

    def first(self, n: int) -> "LogProbs":
        """The first n rows."""
        return LogProbs(
            self.logprob[:n],
            self.greedy[:n],
            None if self.top_ids is None else self.top_ids[:n],
            None if self.top_logprobs is None else self.top_logprobs[:n],
        )

    def rows(self) -> list[TokenLogProb]:
        """Each row in Python values (one transfer per field)."""
        lp, greedy = self.logprob.tolist(), self.greedy.tolist()
        if self.top_ids is None:
            return [TokenLogProb(a, b) for a, b in zip(lp, greedy)]
        return [TokenLogProb(*row) for row in zip(lp, greedy, self.top_ids.tolist(), self.top_logprobs.tolist())]


def target_logprobs_ref(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    top_k: int = 0,
    vocab_tile: int = VOCAB_TILE,
    row_tile: int = ROW_TILE,
) -> LogProbs:
    """hidden [N, Dm], weight [V, Dm], targets [N] int64 -> LogProbs: logprob [N] fp32, is_greedy [N] bool, and
    with top_k > 0 also top ids [N, k] int64 and top logprobs [N, k] fp32, best first, ties to the lower token id.

    is_greedy: the target's logit is the largest (lm-evaluation-harness's `is_greedy`). Every log-prob is
    logit - max - log(sum exp), so the target's value and its entry in the top k are the same number."""
    N, V = hidden.shape[0], weight.shape[0]
    k = min(top_k, V)
    logprob = torch.empty(N, dtype=torch.float32, device=hidden.device)
    greedy = torch.empty(N, dtype=torch.bool, device=hidden.device)
    top_ids = torch.empty(N, k, dtype=torch.long, device=hidden.device)
    top_lps = torch.empty(N, k, dtype=torch.float32, device=hidden.device)
    for r0 in range(0, N, row_tile):
        h, t = hidden[r0 : r0 + row_tile], targets[r0 : r0 + row_tile]
        n = h.shape[0]
        run_max = torch.full((n,), float("-inf"), device=h.device)
        run_sum = torch.zeros(n, device=h.device)
        tgt = torch.empty(n, device=h.device)
        best = torch.empty(n, 0, device=h.device)
        best_ids = torch.empty(n, 0, dtype=torch.long, device=h.device)
        for v0 in range(0, V, vocab_tile):
            # fp32 product: bf16 logits (ulp 0.125 at 20) would quantise the log-probs the scores are made of
            logits = h.float() @ weight[v0 : v0 + vocab_tile].float().T  # [n, tile]
            tile_max = logits.max(dim=-1).values
            new_max = torch.maximum(run_max, tile_max)
            run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(logits - new_max[:, None]).sum(-1)
            run_max = new_max
            inside = (t >= v0) & (t < v0 + logits.shape[1])
            if inside.any():
                rows = inside.nonzero().squeeze(1)
                tgt[rows] = logits[rows, t[rows] - v0]
            if k:  # merge this tile's best k with the running best k; stable sort keeps the lower id on ties
                tile_vals, tile_ids = torch.topk(logits, min(k, logits.shape[1]), dim=-1, sorted=True)
                vals = torch.cat([best, tile_vals], 1)
                ids = torch.cat([best_ids, tile_ids + v0], 1)
                order = torch.sort(vals, dim=-1, descending=True, stable=True).indices[:, :k]
                best, best_ids = vals.gather(1, order), ids.gather(1, order)
        log_sum = torch.log(run_sum)
        logprob[r0 : r0 + n] = tgt - run_max - log_sum
        greedy[r0 : r0 + n] = tgt >= run_max
        if k:
            top_ids[r0 : r0 + n], top_lps[r0 : r0 + n] = best_ids, best - run_max[:, None] - log_sum[:, None]
    return LogProbs(logprob, greedy, top_ids, top_lps) if top_k > 0 else LogProbs(logprob, greedy)


def greedy_logprobs_ref(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] (any float dtype) -> (tokens [n] int64: the first index of each row's largest logit, their
    log-probs [n] fp32 under log-softmax, computed in fp32): greedy decoding's choice."""
    x = logits.float()
    tokens = torch.argmax(x, dim=-1)
    return tokens, torch.log_softmax(x, dim=-1).gather(1, tokens[:, None]).squeeze(1)
