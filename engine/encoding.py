"""Turns (context, continuation) requests and generation prompts into token ids, following lm-evaluation-harness's
convention.

- Trailing whitespace of the context moves to the front of the continuation; the continuation's tokens are the
  tokens of encode(context + continuation) after the first len(encode(context)) tokens, so the boundary is tokenized
  as the whole string would be.
- A BOS token is prepended only when the tokenizer asks for one (`add_bos`); an empty context becomes
  [BOS] (or [EOS] for models without BOS), as lm-evaluation-harness does.
- Requests given as token ids are used as they are (checked against the vocabulary by engine/validation.py)."""

from __future__ import annotations

import operator

from .tokenizer import Tokenizer
from .validation import RequestError, check_job


def with_bos(tok: Tokenizer, ids: list[int]) -> list[int]:
    """The token ids of a text as the model reads it from the start of a sequence: BOS first when the model's
    tokenizer asks for one."""
    return [tok.bos_id] + ids if tok.add_bos and tok.bos_id is not None else ids


def start_token(tok: Tokenizer) -> int:
    """The token that stands for an empty context (lm-evaluation-harness's prefix token): BOS, or EOS without one."""
    return tok.bos_id if tok.bos_id is not None else tok.eos_id


def token_ids(values, *, index: int | None = None, field: str | None = None, label: str | None = None) -> list[int]:
    """A caller's token ids as a list of the engine's own: Python ints as they are; other integers (numpy's, a 0-d
    integer tensor) converted; anything else (a float, a string, a bool, a value that is not a sequence) is a
    RequestError naming the request and the field, never truncated to an int."""
    try:
        ids = list(values)
    except TypeError:
        raise RequestError(
            f"expected text or a list of token ids, got {type(values).__name__}", index=index, field=field, label=label
        ) from None
    kinds = set(map(type, ids))
    if kinds <= {int}:
        return ids
    if bool not in kinds:
        try:
            return list(map(operator.index, ids))
        except TypeError:
            pass
    raise RequestError(f"token ids must be integers, got {_not_index(ids)!r}", index=index, field=field, label=label)


def _not_index(ids: list):
    """The first of `ids` that is a bool or no integer (operator.index refuses it)."""
    for t in ids:
        if type(t) is bool:
            return t
        try:
            operator.index(t)
        except TypeError:
            return t
    return None


def encode_pair(tok: Tokenizer, context, continuation) -> tuple[list[int], list[int]]:
    return encode_pairs(tok, [(context, continuation)])[0]


def encode_pairs(tok: Tokenizer, requests) -> list[tuple[list[int], list[int]]]:
    """encode_pair for a whole job: each distinct context and each whole text is tokenized once, in batches. The
    requests of one context share one list of its ids (a context given as text, or the same list of token ids
    given for several requests), so that the job checks and reads each context once; nobody changes them."""
    pairs = []
    for i, request in enumerate(check_job(requests, "requests must be a list of (context, continuation) pairs")):
        if not isinstance(request, (tuple, list)) or len(request) != 2:
            what = f"{len(request)} items" if isinstance(request, (tuple, list)) else type(request).__name__
            raise RequestError(f"a request is a (context, continuation) pair, got {what}", index=i)
        context, continuation = request
        if isinstance(context, str) != isinstance(continuation, str):
            raise RequestError(
                "context and continuation must both be text or both be token ids", index=i, field="continuation"
            )
        spaces = len(context) - len(context.rstrip()) if isinstance(context, str) else 0
        pairs.append((context[:-spaces], context[-spaces:] + continuation) if spaces else (context, continuation))
    texts = list(dict.fromkeys(t for c, x in pairs if isinstance(c, str) for t in (c, c + x)))
    ids = dict(zip(texts, tok.encode_batch(texts))) if texts else {}
    start = start_token(tok)
    contexts: dict = {}  # a context's text, or id() of its list of ids (alive in `pairs`) -> its ids as the model reads
    out = []
    for i, (context, continuation) in enumerate(pairs):
        if isinstance(context, str):
            whole = ids[context + continuation]
            ctx = contexts.get(context)
            if ctx is None:
                ctx = contexts[context] = with_bos(tok, ids[context]) or [start]
            cont = whole[len(ids[context]) :]
        else:
            ctx = contexts.get(id(context))
            if ctx is None:
                ctx = contexts[id(context)] = token_ids(context, index=i, field="context") or [start]
            cont = token_ids(continuation, index=i, field="continuation")
        if not cont:
            raise RequestError("empty continuation: nothing to score", index=i, field="continuation")
        out.append((ctx, cont))
    return out


def prompt_ids(tok: Tokenizer, prompt, index: int | None = None, label: str | None = None) -> list[int]:
    """A generation prompt's token ids: text encoded with BOS as the model asks, token ids as they are (`token_ids`;
    checked against the vocabulary by engine/validation.py); an empty prompt is the start token alone."""
    if isinstance(prompt, str):
        ids = with_bos(tok, tok.encode(prompt))
    else:
        ids = token_ids(prompt, index=index, field="prompt", label=label)
    return ids or [start_token(tok)]
