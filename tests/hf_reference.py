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


def hf_model_from_weights(config: ModelConfig, weights: dict[str, torch.Tensor], dtype=torch.float32):
    """`AutoModelForCausalLM.from_config(config.to_hf())` with our HF-named weights loaded strictly (every
    parameter set, nothing left over; with tied embeddings lm_head is the embedding matrix)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = dict(config.to_hf())
    hf_config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation="eager")
    state = {k: v.to(dtype) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if config.tie_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise ValueError(f"weights do not match the HF model: missing {missing}, unexpected {unexpected}")
    if config.tie_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise ValueError("HF model did not tie lm_head to the embeddings")
    return model.eval()


def encode_pair(tokenizer, context: str, continuation: str, add_bos: bool) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's split: trailing whitespace of the context moves to the continuation, the whole
    text is encoded and the continuation is what follows the context's own tokens. An empty context becomes
    [BOS] (or [EOS] without one)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    bos = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
    if not context:
        prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        return [prefix], tokenizer.encode(continuation)
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return bos + ctx, whole[len(ctx):]


@torch.no_grad()
def hf_logprobs(model, tokenizer, requests: Sequence[tuple], add_bos: bool | None = None) -> list[RefScore]:
    """log P(continuation | context) for each (context, continuation) request, each a str or a list of token
    ids; strings need `tokenizer` (an engine Tokenizer) and get BOS when `add_bos` (default: tokenizer.add_bos).
    Token-id requests are used as given."""
    out = []
    for context, continuation in requests:
        if isinstance(context, str) or isinstance(continuation, str):
            use_bos = tokenizer.add_bos if add_bos is None else add_bos
            context, continuation = encode_pair(tokenizer, str(context), str(continuation), use_bos)
        context, continuation = list(context), list(continuation)
        if not context or not continuation:
            raise ValueError("the reference needs a non-empty context and continuation")
        ids = torch.tensor([context + continuation])
        logits = model(input_ids=ids).logits[0, len(context) - 1:-1].double()
        logp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(continuation)
        token_lp = logp.gather(1, target[:, None])[:, 0]
        greedy = bool((logp.argmax(dim=-1) == target).all())
        out.append(RefScore(float(token_lp.sum()), token_lp.tolist(), greedy, len(continuation)))
    return out
