"""The one validation of a request, used by every front (Engine, the HTTP server, the score command, the Ray
driver, the lm-eval backend, icqs's length check): token ids inside the vocabulary, lengths under the model's maximum
and the KV cache's capacity (`Limits`), and the options (top_k, max_tokens, temperature, top_p, seed).

A check that fails raises `RequestError`, a UserError that carries which request (`index`, `label`) and which
field is wrong as attributes, so a front names the request its own way (an input file's line, an HTTP `param`)
without reading the message back."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .errors import UserError


class RequestError(UserError):
    """A request that fails validation. str(): "<label>: <reason>"; `reason` is the message without the label,
    `index` the request's position in its call (None for a single request), `field` the wrong part ("context",
    "continuation", "prompt", "length", "top_k", "max_tokens", "temperature", "top_p", "seed")."""

    def __init__(self, reason: str, *, index: int | None = None, field: str | None = None, label: str | None = None):
        self.reason, self.index, self.field = reason, index, field
        self.label = label if label is not None else (f"request {index}" if index is not None else None)
        super().__init__(f"{self.label}: {reason}" if self.label else reason)

    def with_index(self, index: int) -> "RequestError":
        """The same error as the request at `index` of a call (its label kept)."""
        return RequestError(self.reason, index=index, field=self.field, label=self.label)

    def at(self, path: str, line: int) -> UserError:
        """The same error named by an input file's line instead of the request's label."""
        return UserError(self.reason, path, line)


@dataclass(frozen=True)
class Limits:
    """What bounds one request: the vocabulary, the model's context length and the KV cache's capacity in tokens
    (whole pages). A request holds at most `max_request_tokens` = the smaller of the two."""

    vocab_size: int
    max_position: int
    kv_tokens: int

    @classmethod
    def of(cls, config, kv_tokens: int, page_size: int) -> "Limits":
        """The limits of an engine with this model config and KV cache options (kv_tokens rounded up to pages)."""
        return cls(config.vocab_size, config.max_position, -(-kv_tokens // page_size) * page_size)

    @property
    def max_request_tokens(self) -> int:
        return min(self.max_position, self.kv_tokens)

    def describe(self) -> str:
        """What the limit is, for messages."""
        if self.max_position <= self.kv_tokens:
            return f"the model's maximum context length of {self.max_position}"
        return f"the KV cache of {self.kv_tokens} tokens (kv_tokens)"


def _label(index, label):
    return label if label is not None else (f"request {index}" if index is not None else None)


def check_token_ids(
    ids, vocab_size: int, *, index: int | None = None, field: str | None = None, label: str | None = None
) -> None:
    """Token ids given by a caller must be integers (Python ints; not bools, floats or strings) naming rows of the
    model's embedding."""
    if ids and set(map(type, ids)) <= {int} and 0 <= min(ids) and max(ids) < vocab_size:
        return  # the common case, in C: a big job's hundreds of thousands of ids in milliseconds
    for t in ids:
        if type(t) is not int:
            raise RequestError(
                f"token ids must be integers, got {t!r}", index=index, field=field, label=_label(index, label)
            )
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(
            f"token id {bad} is outside the model's vocabulary (0..{vocab_size - 1})",
            index=index,
            field=field,
            label=_label(index, label),
        )


def check_top_k(top_k, vocab_size: int, *, index: int | None = None, label: str | None = None) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RequestError(
            f"top_k must be a non-negative integer, got {top_k!r}",
            index=index,
            field="top_k",
            label=_label(index, label),
        )
    if top_k > vocab_size:
        raise RequestError(
            f"top_k={top_k} exceeds the vocabulary ({vocab_size})",
            index=index,
            field="top_k",
            label=_label(index, label),
        )


def check_score(
    ctx,
    cont,
    top_k: int,
    limits: Limits,
    *,
    index: int | None = None,
    label: str | None = None,
    seen: set[int] | None = None,
) -> None:
    """A score request's token ids (context and continuation), its top_k and its length. `seen`: the ids (id()) of
    the context lists a job checked already, which a job's requests share (encode_pairs gives every request of a
    context the same list): each is checked once, and added here once checked."""
    if not cont:
        raise RequestError(
            "empty continuation: nothing to score", index=index, field="continuation", label=_label(index, label)
        )
    if seen is None or id(ctx) not in seen:
        check_token_ids(ctx, limits.vocab_size, index=index, field="context", label=label)
        if seen is not None:
            seen.add(id(ctx))
    check_token_ids(cont, limits.vocab_size, index=index, field="continuation", label=label)
    check_top_k(top_k, limits.vocab_size, index=index, label=label)
    check_score_length(len(ctx), len(cont), limits, index=index, label=label)


def check_scores(pairs, top_k: int, limits: Limits) -> None:
    """check_score for each (context, continuation) of a job (encode_pairs' output), indexed by its place; a context
    list the job's requests share is checked once."""
    seen: set[int] = set()
    for i, (ctx, cont) in enumerate(pairs):
        check_score(ctx, cont, top_k, limits, index=i, seen=seen)


def check_score_length(
    n_context: int, n_continuation: int, limits: Limits, *, index: int | None = None, label: str | None = None
) -> None:
    n = n_context + n_continuation
    if n > limits.max_request_tokens:
        raise RequestError(
            f"{n} tokens exceed {limits.describe()} (context + continuation)",
            index=index,
            field="length",
            label=_label(index, label),
        )


def check_generate_options(
    max_tokens, temperature, top_p, seed=None, *, index: int | None = None, label: str | None = None
) -> None:
    """The options of a generation: max_tokens a non-negative integer, temperature >= 0, top_p in [0, 1] (finite
    numbers), seed an integer or None."""
    label = _label(index, label)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise RequestError(
            f"max_tokens must be a non-negative integer, got {max_tokens!r}",
            index=index,
            field="max_tokens",
            label=label,
        )
    if not _number(temperature) or not temperature >= 0:
        raise RequestError(
            f"temperature must be a number >= 0, got {temperature!r}", index=index, field="temperature", label=label
        )
    if not _number(top_p) or not 0 <= top_p <= 1:
        raise RequestError(f"top_p must be in [0, 1], got {top_p!r}", index=index, field="top_p", label=label)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed must be an integer, got {seed!r}", index=index, field="seed", label=label)


def check_job(items, what: str):
    """A job's items: any iterable but a text, bytes or a mapping (whose iteration gives characters or keys, never
    requests); anything else is a RequestError `what`, naming the type given."""
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise RequestError(f"{what}, got {type(items).__name__}")
    return items


def check_stop(stop, *, index: int | None = None, label: str | None = None) -> list[str]:
    """A generation's stop strings as a list: None, one string, or a list of strings (as the OpenAI API takes
    them); anything else is a RequestError."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise RequestError(
        f"stop must be a string or a list of strings, got {stop!r}"[:200],
        index=index,
        field="stop",
        label=_label(index, label),
    )


def check_generate_length(
    n_prompt: int, max_tokens: int, limits: Limits, *, index: int | None = None, label: str | None = None
) -> None:
    n = n_prompt + max_tokens
    if n > limits.max_request_tokens:
        raise RequestError(
            f"{n} tokens exceed {limits.describe()} ({n_prompt} in the prompt, max_tokens={max_tokens} to generate)",
            index=index,
            field="length",
            label=_label(index, label),
        )


def check_generate(
    ids, max_tokens, temperature, top_p, seed, limits: Limits, *, index: int | None = None, label: str | None = None
) -> None:
    """A generation request: its prompt's token ids, its options, and prompt + max_tokens against the limits."""
    check_token_ids(ids, limits.vocab_size, index=index, field="prompt", label=label)
    check_generate_options(max_tokens, temperature, top_p, seed, index=index, label=label)
    check_generate_length(len(ids), max_tokens, limits, index=index, label=label)


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)
