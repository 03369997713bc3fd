"""OpenAI-style /v1/completions and /v1/chat/completions on the async engine.

Echo with log-probs is a score request: the prompt's first token is the context and the rest the continuation,
so every prompt position after the first gets its log-prob, its argmax flag and its top-k alternatives from the
prefix cache (the first position gets `null`, as in the OpenAI API). Generated tokens come from a generate request
submitted alongside; their log-probs and alternatives, when asked, come from one more score request over the
prompt (cached by then) and the generated tokens, so `top_logprobs` always holds the very numbers of
`token_logprobs` (a greedy token asked for its top-1 is its own: no second request)."""

from __future__ import annotations

import asyncio
import json
import time

from engine.async_engine import Permit
from engine.errors import UserError

from .schemas import ChatCompletionBody, CompletionBody, bad_request
from .state import ServerState

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # the engine's finish reasons in the OpenAI API


def _gen_params(req, max_tokens: int, seed_offset: int) -> dict:
    return dict(
        max_tokens=max_tokens,
        temperature=float(req.temperature),
        top_p=float(req.top_p),
        seed=None if req.seed is None else req.seed + seed_offset,
        stop=req.stop_list(),
    )


def _top_dict(state: ServerState, pairs, token: int, logprob: float) -> dict:
    """{token text: logprob}, best first, with the scored token itself (texts that collide keep the best)."""
    top = {}
    for t, lp in list(pairs) + [(token, logprob)]:
        top.setdefault(state.token_text(t), lp)
    return top


class Scored:
    """Log-probs of a stretch of tokens: per token its log-prob and its top-k (token id, log-prob) pairs, best
    first (None for a position without one: the first prompt token)."""

    def __init__(self, tokens, result, first_null: bool = False):
        pad = [None] * first_null
        self.tokens = tokens
        self.logprobs = pad + (list(result.token_logprobs) if result else [])
        self.tops = pad + (list(result.top_logprobs) if result else [])

    @classmethod
    def greedy(cls, gen):
        """A greedy generation's own log-probs: each token is the argmax, so it is its own top-1 alternative."""
        scored = cls(gen.token_ids, None)
        scored.logprobs = list(gen.token_logprobs)
        scored.tops = [[(t, lp)] for t, lp in zip(gen.token_ids, gen.token_logprobs)]
        return scored

    def top_dicts(self, state) -> list:
        return [
            None if top is None else _top_dict(state, top, t, lp)
            for t, lp, top in zip(self.tokens, self.logprobs, self.tops)
        ]


async def _score_all(state: ServerState, pairs, top_k: int, permit: Permit):
    return await state.aengine.score(pairs, top_k=top_k, permit=permit) if pairs else []


async def _run(state: ServerState, permit: Permit, prompts, req, max_tokens: int, echo: bool, top_k: int | None):
    """For each prompt: its echo Scored (or None) and its n generations with their Scored (or None), the engine
    requests drawn on `permit`."""
    n = req.n
    echo_pairs = [(ids[:1], ids[1:]) for ids in prompts if len(ids) > 1] if echo and top_k else []
    gens = (
        [
            state.aengine.generate(ids, permit=permit, **_gen_params(req, max_tokens, i * n + j))
            for i, ids in enumerate(prompts)
            for j in range(n)
        ]
        if max_tokens > 0
        else []
    )
    echo_results, *generations = await asyncio.gather(_score_all(state, echo_pairs, top_k, permit), *gens)
    echo_results = iter(echo_results)
    echoes = [
        (Scored(ids, next(echo_results) if len(ids) > 1 else None, first_null=True) if echo and top_k else None)
        for ids in prompts
    ]
    gen_scored = [None] * len(generations)
    if top_k == 1 and (req.temperature == 0 or req.top_p == 0):  # lm-eval's case: no second request
        gen_scored = [Scored.greedy(g) for g in generations]
    elif top_k and generations:
        which = [k for k, g in enumerate(generations) if g.token_ids]
        results = await _score_all(state, [(prompts[k // n], generations[k].token_ids) for k in which], top_k, permit)
        for k, res in zip(which, results):
            gen_scored[k] = Scored(generations[k].token_ids, res)
    return echoes, generations, gen_scored


def _completion_logprobs(state, echo: Scored | None, gen_scored: Scored | None) -> dict:
    parts = ([echo] if echo else []) + ([gen_scored] if gen_scored else [])
    tokens = [state.token_text(t) for p in parts for t in p.tokens]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [v for p in parts for v in p.logprobs],
        "top_logprobs": [t for p in parts for t in p.top_dicts(state)],
        "text_offset": offsets,
    }


async def completions(state: ServerState, req: CompletionBody):
    state.check_model(req.model)
    texts = req.prompts()
    prompts = await asyncio.to_thread(state.encode_prompts, texts, ["prompt"] * len(texts))  # off the event loop
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    for ids in prompts:
        state.check_length(len(ids), 0, "prompt")
        state.check_length(len(ids), max_tokens, "max_tokens")  # the prompt fits: the tokens asked for do not
    if req.stream:
        if req.echo or req.logprobs is not None:
            raise bad_request("stream", "streaming with `echo` or `logprobs` is not supported; ask without stream")
        if max_tokens == 0:
            raise bad_request("max_tokens", "a stream needs max_tokens >= 1")
    top_k = None if req.logprobs is None else max(req.logprobs, 1)  # the argmax is always among the alternatives
    permit = state.admit(
        len(prompts) * (req.n * (max_tokens > 0) * (2 if top_k else 1) + (1 if req.echo else 0)), "prompt"
    )
    rid, created = state.request_id("cmpl"), int(time.time())
    if req.stream:
        return _stream(state, permit, prompts, req, max_tokens, rid, created, chat=False)
    with permit:
        echoes, generations, gen_scored = await _run(state, permit, prompts, req, max_tokens, req.echo, top_k)
    choices = []
    for i, ids in enumerate(prompts):
        echo_text = state.tokenizer.decode(ids) if req.echo else ""
        for j in range(req.n):
            k = i * req.n + j
            gen = generations[k] if generations else None
            choice = {
                "index": k,
                "text": echo_text + (gen.text if gen else ""),
                "logprobs": None,
                "finish_reason": FINISH[gen.finish_reason] if gen else "length",
            }
            if top_k:
                choice["logprobs"] = _completion_logprobs(state, echoes[i], gen_scored[k] if gen else None)
            choices.append(choice)
    completion_tokens = sum(len(g.token_ids) for g in generations)
    prompt_tokens = sum(len(ids) for ids in prompts)
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _chat_prompt(state: ServerState, req: ChatCompletionBody) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    state.check_text(sum(len(m["content"]) for m in messages), "messages")  # before the template renders them
    try:
        text = state.tokenizer.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt)
    except UserError as e:
        raise bad_request("messages", str(e)) from None
    return state.encode_prompt(text, "messages", add_special_tokens=False)  # the template writes BOS itself


def _chat_logprobs(state, scored: Scored | None, top_logprobs: int) -> dict:
    def entry(token_id, lp):
        text = state.token_text(token_id)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    if scored is None:
        return {"content": []}
    return {
        "content": [
            {**entry(t, lp), "top_logprobs": [entry(a, b) for a, b in top[:top_logprobs]]}
            for t, lp, top in zip(scored.tokens, scored.logprobs, scored.tops)
        ]
    }


async def chat_completions(state: ServerState, req: ChatCompletionBody):
    state.check_model(req.model)
    ids = await asyncio.to_thread(_chat_prompt, state, req)  # the template and the tokenizer off the event loop
    # without max_tokens: what the context holds, at most the server's default (--default-max-tokens), as vLLM
    max_tokens = req.max_completion_tokens or req.max_tokens or min(state.max_len - len(ids), state.default_max_tokens)
    state.check_length(len(ids), 1, "messages")
    for key in ("max_completion_tokens", "max_tokens"):  # each one given must fit, the one used or not
        if getattr(req, key) is not None:
            state.check_length(len(ids), getattr(req, key), key)
    state.check_length(len(ids), max(max_tokens, 1), "messages")
    top_k = max(req.top_logprobs or 0, 1) if req.logprobs else None
    if req.stream and top_k:
        raise bad_request("stream", "streaming with `logprobs` is not supported; ask without stream")
    permit = state.admit(req.n * (2 if top_k else 1), "messages")
    rid, created = state.request_id("chatcmpl"), int(time.time())
    if req.stream:
        return _stream(state, permit, [ids], req, max_tokens, rid, created, chat=True)
    with permit:
        _, generations, gen_scored = await _run(state, permit, [ids], req, max_tokens, False, top_k)
    choices = []
    for j, gen in enumerate(generations):
        choice = {
            "index": j,
            "message": {"role": "assistant", "content": gen.text},
            "logprobs": _chat_logprobs(state, gen_scored[j], req.top_logprobs or 0) if top_k else None,
            "finish_reason": FINISH[gen.finish_reason],
        }
        choices.append(choice)
    completion_tokens = sum(len(g.token_ids) for g in generations)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(ids) + completion_tokens,
        },
    }


# ---- streaming (server-sent events) ---------------------------------------------------------------------------


def _stream(state: ServerState, permit: Permit, prompts, req, max_tokens: int, rid: str, created: int, chat: bool):
    """An async iterator of SSE lines: every choice's tokens as they come, each choice closed by its finish
    reason, then `data: [DONE]`. Closing the iterator (the client went away) cancels every stream; the permit is
    released when it ends."""
    n, queue = req.n, asyncio.Queue()

    async def pump(k, ids):
        try:
            async for event in state.aengine.stream(ids, permit=permit, **_gen_params(req, max_tokens, k)):
                await queue.put((k, event, None))
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            await queue.put((k, None, e))
        finally:
            await queue.put((k, None, None))

    def chunk(k, delta: str, finish):
        if chat:
            body = {"index": k, "delta": {"content": delta} if delta else {}, "logprobs": None, "finish_reason": finish}
        else:
            body = {"index": k, "text": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": state.model_name,
            "choices": [body],
        }

    async def events():
        tasks = [asyncio.ensure_future(pump(i * n + j, ids)) for i, ids in enumerate(prompts) for j in range(n)]
        try:
            if chat:
                for k in range(len(tasks)):
                    first = chunk(k, "", None)
                    first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                    yield f"data: {json.dumps(first)}\n\n"
            open_streams = len(tasks)
            while open_streams:
                k, event, error = await queue.get()
                if error is not None:
                    kind = "invalid_request_error" if isinstance(error, UserError) else "internal_error"
                    yield f"data: {json.dumps({'error': {'message': str(error), 'type': kind}})}\n\n"
                elif event is None:
                    open_streams -= 1
                else:
                    finish = FINISH[event.finish_reason] if event.finish_reason else None
                    if event.text_delta or finish:
                        yield f"data: {json.dumps(chunk(k, event.text_delta, finish))}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            permit.release()

    return events()
