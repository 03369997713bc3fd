"""Turns (context, continuation) requests into token ids, following lm-evaluation-harness's convention.

- Trailing whitespace of the context moves to the front of the continuation; the continuation's tokens are the
  tokens of encode(context + continuation) after the first len(encode(context)) tokens, so the boundary is tokenized
  as the whole string would be.
- A BOS token is prepended only when the model's tokenizer asks for one (`add_bos`); an empty context becomes
  [BOS] (or [EOS] for models without BOS), as lm-evaluation-harness does.
- Requests given as token ids are used as they are."""
from __future__ import annotations

from .errors import UserError
from .tokenizer import Tokenizer


def encode_pair(tok: Tokenizer, context, continuation) -> tuple[list[int], list[int]]:
    if isinstance(context, str) != isinstance(continuation, str):
        raise UserError("a request's context and continuation must both be text or both be token ids")
    if isinstance(context, str):
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = tok.encode(context + continuation)
        ctx = tok.encode(context)
        cont = whole[len(ctx):]
    else:
        ctx, cont = [int(t) for t in context], [int(t) for t in continuation]
    if not cont:
        raise UserError("empty continuation: nothing to score")
    start = tok.bos_id if tok.bos_id is not None else tok.eos_id
    if (isinstance(context, str) and tok.add_bos and tok.bos_id is not None) or not ctx:
        ctx = [start] + ctx
    return ctx, cont
