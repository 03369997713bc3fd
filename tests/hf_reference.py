"""The naive reference for parity tests: a transformers model holding our weights, and continuation log-probs
from one full forward per (context, continuation) request, with no cache and no prefix sharing."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from engine.config import ModelConfig


class RefScore(NamedTuple):
    logprob: float  # sum over the continuation tokens
    token_logprobs: list[float]
    is_greedy: bool  # every continuation token is the argmax of its distribution
    num_tokens: int


def hf_model_from_weights(config: ModelConfig, weights: dict[str, torch.Tensor], dtype=torch.float32, device=None):
    """`AutoModelForCausalLM.from_config(config.to_hf())` with our HF-named weights loaded strictly (every
    parameter set, nothing left over; with tied embeddings lm_head is the embedding matrix). `device`: where the
    model is built and held (default: the CPU), e.g. "cuda": its parameters are made there, not copied over."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = dict(config.to_hf())
    hf_config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation="eager")
    model.to(device or "cpu")
    state = {k: v.to(dtype=dtype, device=device or "cpu") for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if config.tie_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise ValueError(f"weights do not match the HF model: missing {missing}, unexpected {unexpected}")
    if config.tie_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise ValueError("HF model did not tie lm_head to the embeddings")
    return model.eval()


@torch.no_grad()
def hf_logprobs(model, tokenizer, requests: Sequence[tuple]) -> list[RefScore]:
    """log P(continuation | context) for each (context, continuation) request (both str or both token ids),
    turned into token ids by the engine's own rule (engine.encoding.encode_pair, lm-evaluation-harness's
    convention), so that a parity test compares the computation only."""
    from engine.encoding import encode_pair

    out = []
    for context, continuation in requests:
        context, continuation = encode_pair(tokenizer, context, continuation)
        ids = torch.tensor([context + continuation], device=model.device)
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].double()
        logp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(continuation, device=model.device)
        token_lp = logp.gather(1, target[:, None])[:, 0]
        greedy = bool((logp.argmax(dim=-1) == target).all())
        out.append(RefScore(float(token_lp.sum()), token_lp.tolist(), greedy, len(continuation)))
    return out
