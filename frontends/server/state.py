"""What every handler shares: the async engine, the tokenizer, the limits, and the checks a request passes before
any of its work is queued (model name, token ids inside the vocabulary, lengths under the model's maximum, room
in the queue). The request checks are engine/validation.py's, the engine's own; a failed one is a 400 whose
`param` is the field of the HTTP body (the RequestError's index and field say which). Room in the queue is the
async engine's to give (`AsyncEngine.admit`: it owns the count of requests in flight and its bound); the server
only says it in HTTP."""

from __future__ import annotations

import asyncio
import time
import uuid

from engine.async_engine import Permit, QueueFull
from engine.encoding import encode_pairs, prompt_ids
from engine.validation import RequestError, check_generate_length, check_score_length, check_token_ids

from .limits import DEFAULT_MAX_TOKENS
from .schemas import APIError, bad_request


class ServerState:
    def __init__(
        self, aengine, engine, model_name: str, api_key: str | None = None, default_max_tokens: int = DEFAULT_MAX_TOKENS
    ):
        self.aengine, self.engine = aengine, engine
        self.tokenizer, self.config = engine.tokenizer, engine.config
        self.model_name, self.api_key = model_name, api_key
        self.default_max_tokens = default_max_tokens
        self.limits = engine.limits
        self.max_len = self.limits.max_request_tokens  # tokens a sequence may hold: the model's maximum or the KV cache
        # the longest text a request can hold: a longer one is refused before it is tokenized (a 50 MB text took a
        # minute and 7 GB to tokenize), and the token endpoints take no more characters or token ids than this
        self.max_text_chars = self.tokenizer.max_text_chars(self.max_len)
        self.created = int(time.time())
        self._token_text: dict[int, str] = {}

    # ---- checks --------------------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                400,
                f"model: unknown model {model!r} (this server serves {self.model_name!r})",
                param="model",
                code="model_not_found",
            )

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise bad_request(param, "empty prompt")
        try:
            check_token_ids(ids, self.limits.vocab_size, label=param)
        except RequestError as e:
            raise bad_request(param, e.reason) from None
        return ids

    def check_length(self, n_prompt: int, n_new: int, param: str) -> None:
        try:
            check_generate_length(n_prompt, n_new, self.limits, label=param)
        except RequestError as e:
            raise bad_request(param, e.reason) from None

    def check_text(self, n_chars: int, param: str) -> None:
        """A text of n_chars characters (or that many token ids) is at most the longest a request can hold."""
        if n_chars > self.max_text_chars:
            raise bad_request(
                param,
                f"{n_chars:,} characters or token ids: longer than any request can be (at most "
                f"{self.max_text_chars:,}, what {self.max_len:,} tokens of this model's "
                f"vocabulary can spell)",
            )

    def encode_prompts(self, prompts, params: list[str]) -> list[list[int]]:
        """encode_prompt of each prompt (named by its param), every one's length checked before any is tokenized."""
        for prompt, param in zip(prompts, params):
            self.check_text(len(prompt), param)
        return [self.encode_prompt(prompt, param) for prompt, param in zip(prompts, params)]

    def encode_prompt(self, prompt, param: str, add_special_tokens: bool = True) -> list[int]:
        """A prompt's token ids as the engine takes them (text: with BOS when the model asks for one, unless
        add_special_tokens is off, as for a chat template that writes its own); ids are checked."""
        if isinstance(prompt, str) and not prompt:
            raise bad_request(param, "empty prompt")
        self.check_text(len(prompt), param)
        if isinstance(prompt, str) and not add_special_tokens:
            return self.tokenizer.encode(prompt)
        if not isinstance(prompt, str):
            return self.check_ids(list(prompt), param)
        return prompt_ids(self.tokenizer, prompt)

    def encode_pairs(self, pairs, param: str) -> list[tuple[list[int], list[int]]]:
        """(context, continuation) requests as token ids, by the engine's own convention, each checked."""
        for i, (ctx, cont) in enumerate(pairs):
            self.check_text(len(ctx) + len(cont), f"{param}[{i}]")
        try:
            encoded = encode_pairs(self.tokenizer, pairs)
        except RequestError as e:
            raise bad_request(f"{param}[{e.index}]", e.reason) from None
        for i, (ctx, cont) in enumerate(encoded):
            self.check_ids(ctx + cont, f"{param}[{i}]")
            try:
                check_score_length(len(ctx), len(cont), self.limits, label=f"{param}[{i}]")
            except RequestError as e:
                raise bad_request(f"{param}[{i}]", e.reason) from None
        return encoded

    def admit(self, n: int, param: str) -> Permit:
        """Room for n more engine requests in flight (queued or running), held by the permit until it is released
        and drawn on by the engine calls made with it; else 503 + Retry-After, or a 400 naming `param` for a call
        that can never fit."""
        try:
            return self.aengine.admit(n)
        except QueueFull as e:
            raise queue_full_error(e, param) from None

    # ---- helpers -------------------------------------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    @staticmethod
    def request_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:24]}"


def queue_full_error(e: QueueFull, param: str | None) -> APIError:
    """A call the engine's queue bound refused: 400 naming `param` when the call alone is larger than the bound,
    else 503 + Retry-After (the queue is full now)."""
    if e.never_fits:
        return bad_request(param, f"{e.n} requests in one call exceed the server's limit of {e.max_queue}")
    return APIError(
        503,
        f"the server is busy ({e.in_flight} requests in flight, at most {e.max_queue}); retry later",
        headers={"Retry-After": "1"},
    )


async def cancel_on_disconnect(request, coro):
    """Await `coro`; if the client disconnects first, cancel it (the engine then aborts its requests) and answer
    499 (nobody reads it; the access log and the metrics do)."""
    work = asyncio.ensure_future(coro)
    gone = asyncio.Event()

    async def watch():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()
        work.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone.is_set():  # the handler itself is being cancelled (shutdown): take the work with it
            work.cancel()
            raise
        raise APIError(499, "the client disconnected; its requests were cancelled", type="client_closed") from None
    finally:
        watcher.cancel()
