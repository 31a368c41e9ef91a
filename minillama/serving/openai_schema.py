"""The request bodies of OpenAI's text APIs that the server accepts, and its error objects (chapter 12).

Two endpoints of OpenAI's API are what every client library, and every other server (vLLM, SGLang,
llama.cpp's server, Ollama), speaks: `POST /v1/completions` (a prompt in, its continuation out) and
`POST /v1/chat/completions` (messages in, the assistant's reply out). The bodies are checked strictly
before anything reaches the engine: a field of the wrong type is an error, never coerced ("5" is not
5); a field this server does not know is an error naming the fields it does (OpenAI's own API rejects
unknown parameters the same way); values outside their range say the range. Every failure is answered
with OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, so clients raise their
usual exceptions (`openai.BadRequestError`, ...).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_STOP_CHARS = 256
# the values of OpenAI parameters that this server does not implement which mean "off"
NEUTRAL = {
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "logit_bias": ({},),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
}


class _Strict(BaseModel):
    # extra="forbid": an unknown field is an error, not silently ignored; strict: no "5" -> 5 coercion
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """The fields both endpoints share (OpenAI's names and defaults)."""

    model: str | None = None  # None: the one model this server serves
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    stop: (
        Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
        | Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]],
            Field(max_length=MAX_STOP_STRINGS),
        ]
        | None
    ) = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1  # one choice per request; the engine batches across requests instead
    user: str | None = None  # accepted, unused (OpenAI uses it for abuse monitoring)
    # OpenAI parameters this server does not implement: accepted at their neutral values (clients that
    # always send the defaults keep working); any other value is a 400 that says so (`unsupported`)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> None:
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name, None)
            if value is not None and value not in neutral:
                raise APIError(
                    400,
                    f"{name}={value!r} is not supported by this server (only {' or '.join(map(repr, neutral))})",
                    param=name,
                    code="unsupported_parameter",
                )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling):
    # one prompt: text (encoded after <|begin_of_text|>) or token ids as they are
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "ipython"]
    content: str | list[TextPart]
    name: str | None = None  # accepted, not part of the Llama 3.1 chat format

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    # max_tokens None: as many as the context leaves after the prompt (vLLM's default);
    # max_completion_tokens: OpenAI's newer name for it
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise APIError(
                    400,
                    "max_tokens and max_completion_tokens differ; send one of them",
                    param="max_completion_tokens",
                )
            self.max_tokens = self.max_completion_tokens


class APIError(Exception):
    """An error answered as OpenAI's error object with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse(schema: type[_Strict], body: object) -> _Strict:
    """`body` (decoded JSON) checked against `schema`; the first problem becomes a 400 naming the field."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = schema.model_validate(body)
    except ValidationError as error:
        raise _api_error(schema, error) from None
    request.unsupported()
    return request


def _api_error(schema: type[_Strict], error: ValidationError) -> APIError:
    first = error.errors(include_url=False)[0]
    # a union reports one error per branch with the branch in the location; name the field by its own parts
    loc = [str(p) for p in first["loc"] if not _is_branch(p)]
    param = ".".join(loc) or None
    if first["type"] == "extra_forbidden":
        known = ", ".join(sorted(schema.model_fields))
        return APIError(
            400,
            f"unknown field {param!r}; this server accepts: {known}",
            param=param,
            code="unknown_field",
        )
    if first["type"] == "missing":
        return APIError(400, f"missing required field {param!r}", param=param, code="missing_field")
    value = first.get("input")
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return APIError(
        400, f"invalid {param!r}: {first['msg']} (got {shown})", param=param, code="invalid_value"
    )


def _is_branch(part) -> bool:
    # pydantic names union branches like "str", "list[int]", "constrained-str", "function-after[...]"
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "list", "dict"}
        or "[" in part
        or part.startswith("constrained")
    )
