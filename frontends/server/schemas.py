"""The HTTP request bodies (pydantic models) and the OpenAI-style error object.

Types are strict (a number is never taken for a string, nor "1" for a number), so a malformed request is a 400
naming its field. Every string must be valid Unicode (a lone UTF-16 surrogate such as "\\ud800" is refused naming
its field); integers are range-checked (a seed is below 2**53, max_tokens 32 bits); a call holds at most
MAX_PER_CALL prompts, items or pairs. Checks that need the model (token ids inside the vocabulary, lengths under the
model's maximum, the model's name) are made by the handlers before any work is queued."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from .limits import MAX_LOGPROBS, MAX_N, MAX_PER_CALL, MAX_SEED, MAX_STOP, MAX_TOKENS


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode text (a lone UTF-16 surrogate escape, \\ud800-\\udfff)") from None
    return text


UStr = Annotated[StrictStr, AfterValidator(_unicode)]  # every text field: a string of valid Unicode
TokenIds = list[StrictInt]
Text = Union[UStr, TokenIds]  # a prompt, a context or a continuation: text or token ids
Number = StrictFloat  # strict floats take integers too, never strings
Seed = Optional[Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]]


class APIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers
        self.type = type or {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            500: "internal_error",
            503: "overloaded_error",
        }.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(param: str | None, message: str) -> APIError:
    return APIError(400, f"{param}: {message}" if param else message, param=param)


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # fields of the OpenAI API this server does not read are ignored

    model: Optional[UStr] = None


class SamplingFields(Body):
    temperature: Number = Field(1.0, ge=0, le=2)
    top_p: Number = Field(1.0, gt=0, le=1)
    seed: Seed = None
    stop: Union[UStr, Annotated[list[UStr], Field(max_length=MAX_STOP)], None] = None
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionBody(SamplingFields):
    """POST /v1/completions."""

    prompt: Union[
        UStr,
        Annotated[list[UStr], Field(max_length=MAX_PER_CALL)],
        TokenIds,
        Annotated[list[TokenIds], Field(max_length=MAX_PER_CALL)],
    ]
    max_tokens: Optional[StrictInt] = Field(16, ge=0, le=MAX_TOKENS)
    echo: StrictBool = False
    logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_LOGPROBS)

    def prompts(self) -> list:
        """The prompts, each a string or a token-id list."""
        p = self.prompt
        if not p:
            raise bad_request("prompt", "empty prompt")
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class ContentPart(BaseModel):
    type: Literal["text"]
    text: UStr


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[UStr, list[ContentPart], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionBody(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_PER_CALL)
    max_tokens: Optional[StrictInt] = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: StrictBool = True


class ScoreBody(Body):
    """POST /v1/score: one `query` with many `items`, or a list of [context, continuation] `pairs`.

    Without `label_token_ids` each item is a continuation of the query and is scored token by token; with them,
    each item is appended to the query and the next-token log-probs of the labels are returned."""

    query: Optional[Text] = None
    items: Optional[list[Text]] = Field(None, min_length=1, max_length=MAX_PER_CALL)
    pairs: Optional[list[tuple[Text, Text]]] = Field(None, min_length=1, max_length=MAX_PER_CALL)
    label_token_ids: Optional[list[StrictInt]] = Field(None, min_length=1, max_length=MAX_PER_CALL)
    apply_softmax: StrictBool = False
    top_logprobs: StrictInt = Field(0, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _one_shape(self):
        if self.pairs is not None:
            if self.query is not None or self.items is not None:
                raise ValueError("give either `pairs` or `query` with `items`, not both")
            if self.label_token_ids is not None:
                raise ValueError("`label_token_ids` goes with `query` and `items`, not `pairs`")
        elif self.query is None or self.items is None:
            raise ValueError("give `query` with `items`, or `pairs`")
        return self


class GenerateBody(Body):
    """POST /v1/generate: the engine's own `generate` (token ids and the engine's finish reasons)."""

    prompts: list[Text] = Field(min_length=1, max_length=MAX_PER_CALL)
    max_tokens: StrictInt = Field(128, ge=1, le=MAX_TOKENS)
    temperature: Number = Field(0.0, ge=0, le=2)
    top_p: Number = Field(1.0, gt=0, le=1)
    seed: Seed = None
    stop: Optional[list[UStr]] = Field(None, max_length=MAX_STOP)


class TokenizeBody(Body):
    prompt: UStr
    add_special_tokens: StrictBool = True


class DetokenizeBody(Body):
    tokens: TokenIds
