"""The engine's own endpoints: /v1/score (many continuations of one query, or (context, continuation) pairs, or
next-token label distributions), /v1/generate (the engine's `generate`), and the tokenizer endpoints that
lm-evaluation-harness probes (/tokenizer_info, /tokenize, /detokenize) plus /v1/tokenizer, from which the
client (frontends/client.py) builds the very tokenizer the server uses.

Texts are tokenized off the event loop (a worker thread; the tokenizer releases the GIL), so that a call of many
long texts does not hold up the other clients, nor the server's view of a client that left or of a SIGTERM."""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict

from .schemas import DetokenizeBody, GenerateBody, ScoreBody, TokenizeBody
from .state import ServerState


def _score_item(i: int, res, top_k: int) -> dict:
    item = {
        "index": i,
        "logprob": res.logprob,
        "token_logprobs": res.token_logprobs,
        "num_tokens": res.num_tokens,
        "is_greedy": res.is_greedy,
    }
    if top_k:
        item["top_logprobs"] = [[list(p) for p in top] for top in res.top_logprobs]
    return item


async def score(state: ServerState, req: ScoreBody) -> dict:
    state.check_model(req.model)
    if req.pairs is not None:
        param, pairs = "pairs", [tuple(p) for p in req.pairs]
    else:
        param, pairs = "items", [(req.query, item) for item in req.items]
    encoded = await asyncio.to_thread(state.encode_pairs, pairs, param)  # the event loop serves others meanwhile
    if req.label_token_ids is None:
        with state.admit(len(encoded), param) as permit:
            results = await state.aengine.score(encoded, top_k=req.top_logprobs, permit=permit)
        data = [_score_item(i, r, req.top_logprobs) for i, r in enumerate(results)]
        usage = sum(len(c) + len(x) for c, x in encoded)
        return {
            "object": "list",
            "model": state.model_name,
            "data": data,
            "usage": {"prompt_tokens": usage, "total_tokens": usage},
        }
    labels = state.check_ids(list(req.label_token_ids), "label_token_ids")
    prefixes = [ctx + cont for ctx, cont in encoded]  # query + item: the labels' common context
    with state.admit(len(encoded) * len(labels), "label_token_ids") as permit:
        results = await state.aengine.score([(p, [t]) for p in prefixes for t in labels], permit=permit)
    data, scores = [], []
    for i in range(len(prefixes)):
        lps = [r.logprob for r in results[i * len(labels) : (i + 1) * len(labels)]]
        probs = [math.exp(lp) for lp in lps]
        if req.apply_softmax:
            total = sum(probs)
            probs = [p / total for p in probs]
        data.append({"index": i, "label_logprobs": lps, "scores": probs})
        scores.append(probs)
    usage = sum(len(p) for p in prefixes)
    return {
        "object": "list",
        "model": state.model_name,
        "data": data,
        "scores": scores,
        "usage": {"prompt_tokens": usage, "total_tokens": usage},
    }


async def generate(state: ServerState, req: GenerateBody) -> dict:
    """As Engine.generate: prompt i samples with seed + i."""
    state.check_model(req.model)
    prompts = await asyncio.to_thread(
        state.encode_prompts, req.prompts, [f"prompts[{i}]" for i in range(len(req.prompts))]
    )
    for i, ids in enumerate(prompts):
        state.check_length(len(ids), 1, f"prompts[{i}]")
        state.check_length(len(ids), req.max_tokens, "max_tokens")
    with state.admit(len(prompts), "prompts") as permit:
        gens = await asyncio.gather(
            *(
                state.aengine.generate(
                    ids,
                    permit=permit,
                    max_tokens=req.max_tokens,
                    temperature=float(req.temperature),
                    top_p=float(req.top_p),
                    seed=None if req.seed is None else req.seed + i,
                    stop=req.stop or [],
                )
                for i, ids in enumerate(prompts)
            )
        )
    return {
        "object": "list",
        "model": state.model_name,
        "data": [
            {
                "index": i,
                "text": g.text,
                "token_ids": g.token_ids,
                "finish_reason": g.finish_reason,
                "token_logprobs": g.token_logprobs,
            }
            for i, g in enumerate(gens)
        ],
        "usage": {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": sum(len(g.token_ids) for g in gens)},
    }


def _token(state: ServerState, token_id: int | None) -> str | None:
    return None if token_id is None else state.tokenizer.id_to_token(token_id)


def tokenizer_info(state: ServerState) -> dict:
    tok = state.tokenizer
    return {
        "eos_token": _token(state, tok.eos_id),
        "bos_token": _token(state, tok.bos_id),
        "pad_token": None,
        "eos_token_id": tok.eos_id,
        "bos_token_id": tok.bos_id,
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
        "model_max_length": state.max_len,
        "vocab_size": tok.vocab_size,
    }


def tokenizer_full(state: ServerState) -> dict:
    tok = state.tokenizer
    return {
        "model": state.model_name,
        "tokenizer_json": tok.backend.to_str(),
        "bos_id": tok.bos_id,
        "eos_ids": tok.eos_ids,
        "add_bos": tok.add_bos,
        "chat_template": tok.chat_template,
        "config": asdict(state.config),
        "max_len": state.max_len,
        "kv_tokens": state.limits.kv_tokens,
    }


def tokenize(state: ServerState, req: TokenizeBody) -> dict:
    state.check_model(req.model)
    ids = state.encode_prompt(req.prompt, "prompt", req.add_special_tokens) if req.prompt else []
    return {"tokens": ids, "count": len(ids), "max_model_len": state.max_len}


def detokenize(state: ServerState, req: DetokenizeBody) -> dict:
    state.check_model(req.model)
    state.check_text(len(req.tokens), "tokens")
    if req.tokens:
        state.check_ids(req.tokens, "tokens")
    return {"prompt": state.tokenizer.decode(req.tokens)}
