"""`GeminiModel`: the Gemini API's ``streamGenerateContent`` wire format (server-sent events),
natively on Trio over httpx2 (see `greenroom.models.http`).

Thinking budgets by ``thought_level``; thought signatures are sent back on their parts.
"""

from __future__ import annotations

import math
import ssl
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final

import msgspec

from greenroom.backoff import Backoff
from greenroom.models.base import ModelError
from greenroom.models.http import (
    DEFAULT_BACKOFF,
    DEFAULT_RETRY_BUDGET,
    HttpModel,
    RetryableError,
    SseEvent,
    endpoint,
    output_limit,
)
from greenroom.models.parts import WirePart, answering
from greenroom.protocol.arguments import arguments_value
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    Thought,
    ToolCallChunk,
    ToolTurn,
    Usage,
    UserTurn,
)

DEFAULT_BASE_URL: Final = "https://generativelanguage.googleapis.com/v1beta"
#: `Thought.source` of a Gemini thought signature.
SOURCE: Final = "gemini"
#: The thinking budget per ``thought_level`` (low, medium, high), in tokens.
THINKING_BUDGETS: Final[Mapping[str, int]] = MappingProxyType(
    {"low": 1_024, "medium": 8_192, "high": 24_576}
)
#: The model families whose thinking can be turned off (a budget of 0), by name prefix: a
#: ``thought_level`` of off asks them for none; any other model thinks as it does by default.
THINKING_OFF: Final = ("gemini-2.5-flash",)
#: The start of a call id greenroom made up for a function call that came without one (the
#: Gemini API often sends none); such an id is never sent back to the API.
MINTED: Final = "gemini-call-"
#: The type of the error detail that says how long to wait before trying again.
RETRY_INFO: Final = "type.googleapis.com/google.rpc.RetryInfo"
#: Statuses of an error in a 200 stream worth another attempt when nothing was streamed yet.
RETRIED_STATUSES: Final = frozenset(
    {"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"}
)
_FINISH: Final[Mapping[str, FinishReason]] = MappingProxyType(
    {
        "STOP": "stop",
        "MAX_TOKENS": "max-tokens",
        "SAFETY": "refusal",
        "RECITATION": "refusal",
        "BLOCKLIST": "refusal",
        "PROHIBITED_CONTENT": "refusal",
        "SPII": "refusal",
        "IMAGE_SAFETY": "refusal",
    }
)


class GeminiModel(HttpModel):
    """Streams ``POST {base_url}/models/{model}:streamGenerateContent?alt=sse``.

    ``base_url`` and ``api_key`` default to ``GEMINI_BASE_URL`` and ``GEMINI_API_KEY`` (the
    URL then to the public API's ``v1beta``), as in the ``greenroom`` command
    (`greenroom.models.http.endpoint`); the key travels in the ``x-goog-api-key`` header,
    never in the URL. ``max_output_tokens`` is the most a reply may spend, thinking
    included (None: the model's own limit); a request's `ModelRequest.max_output_tokens`
    lowers it. ``retry_budget``, ``verify``, ``context_window`` and ``images`` as for
    `greenroom.models.openai.OpenAIChatModel`.
    """

    #: The GenAI semantic conventions' ``gen_ai.provider.name`` (`greenroom.tracing`).
    provider: ClassVar[str] = "gcp.gemini"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        max_output_tokens: int | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        context_window: int | None = None,
        verify: ssl.SSLContext | None = None,
        images: bool | None = None,
    ) -> None:
        if not model:
            raise TypeError("GeminiModel: name the model (model=...)")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {max_output_tokens!r}")
        base_url, api_key = endpoint(base_url, api_key, "gemini", DEFAULT_BASE_URL)
        model = model.removeprefix("models/")
        self._models_url = base_url + "/models/"
        super().__init__(
            self._endpoint(model),
            {"x-goog-api-key": api_key, "Content-Type": "application/json"},
            model,
            backoff=backoff,
            retry_budget=retry_budget,
            context_window=context_window,
            verify=verify,
            images=images,
        )
        self._max_output_tokens = max_output_tokens

    def _endpoint(self, model: str) -> str:
        return f"{self._models_url}{model}:streamGenerateContent?alt=sse"

    def url_of(self, request: ModelRequest) -> str:
        """The model is part of the path: a request naming another model goes to its own."""
        if request.model and request.model != self._model:
            return self._endpoint(request.model.removeprefix("models/"))
        return self._url

    def overflowed(self, kind: str | None, message: str) -> bool:
        """Gemini's over-long request: a 400 saying the input token count exceeds the
        maximum allowed."""
        return "exceeds the maximum number of tokens" in message

    def asked_wait(self, error: dict[str, Any]) -> float | None:
        """The wait a rate limit asks in its body: a ``google.rpc.RetryInfo`` detail's
        ``retryDelay`` (a duration such as ``"34s"``)."""
        details = error.get("details")
        for detail in details if isinstance(details, list) else ():
            if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
                delay = detail.get("retryDelay")
                if isinstance(delay, str) and delay.endswith("s"):
                    try:
                        seconds = float(delay[:-1])
                    except ValueError:
                        return None
                    return seconds if math.isfinite(seconds) and seconds >= 0 else None
        return None

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request`: ``generationConfig``, ``tools``,
        ``systemInstruction`` and ``contents``, in that order, so one request's bytes are a
        prefix of the next one's (Gemini caches a repeated prefix by itself).

        Consecutive same-role turns are merged into one content (a reply's calls get all
        their responses in one). A tool result is a ``functionResponse`` named after its
        call (``output``, or ``error`` for a failed call). Each earlier reply's thought
        signatures go back on the parts that carried them, as they came: a call's on its
        ``functionCall`` part, any other on the reply's text part (an empty one if the reply
        had no text), whatever the thought level (Gemini 3 refuses calls sent back
        without theirs). A ``thought_level`` of low, medium or high asks for a thinking
        budget of `THINKING_BUDGETS` tokens with the thoughts' summaries, the budget kept
        to half the output limit when there is one; off asks a model of `THINKING_OFF`
        for none.
        """
        contents: list[dict[str, Any]] = []

        def add(role: str, parts: list[dict[str, Any]]) -> None:
            if contents and contents[-1]["role"] == role:
                contents[-1]["parts"].extend(parts)
            else:
                contents.append({"role": role, "parts": parts})

        names: dict[str, str] = {}  # call id → tool name, for the responses
        current = answering(request.messages)
        for index, message in enumerate(request.messages):
            match message:
                case UserTurn(parts=parts) if parts:
                    wire = self._wire_parts(request, message, index >= current)
                    add("user", [_part(p) for p in wire])
                case UserTurn(content=content):
                    add("user", [{"text": content}])
                case AssistantTurn(content=content, tool_calls=calls, thoughts=thoughts):
                    signatures = {t.item: t.signature for t in thoughts if t.source == SOURCE}
                    reply: list[dict[str, Any]] = []
                    text_signature = signatures.get("")
                    if content or text_signature:
                        part: dict[str, Any] = {"text": content}
                        if text_signature:
                            part["thoughtSignature"] = text_signature
                        reply.append(part)
                    for call in calls:
                        names[call.call_id] = call.name
                        function: dict[str, Any] = {"name": call.name, "args": _args(call)}
                        if not call.call_id.startswith(MINTED):
                            function["id"] = call.call_id
                        part = {"functionCall": function}
                        signature = signatures.get(call.call_id)
                        if signature:
                            part["thoughtSignature"] = signature
                        reply.append(part)
                    add("model", reply)
                case ToolTurn(call_id=call_id, content=content, is_error=is_error):
                    answer: dict[str, Any] = {
                        "name": names.get(call_id, call_id),
                        "response": {"error" if is_error else "output": content},
                    }
                    if not call_id.startswith(MINTED):
                        answer["id"] = call_id
                    add("user", [{"functionResponse": answer}])
        body: dict[str, Any] = {}
        config: dict[str, Any] = {}
        limit = output_limit(request.max_output_tokens, self._max_output_tokens)
        if limit is not None:
            config["maxOutputTokens"] = limit
        budget = THINKING_BUDGETS.get(request.thought_level or "off", 0)
        if budget:
            if limit is not None:
                budget = min(budget, limit // 2)
            config["thinkingConfig"] = {"thinkingBudget": budget, "includeThoughts": True}
        elif (request.model or self._model).startswith(THINKING_OFF):
            config["thinkingConfig"] = {"thinkingBudget": 0}
        if config:
            body["generationConfig"] = config
        if request.tools:
            declarations = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "parametersJsonSchema": tool.parameters,
                }
                for tool in request.tools
            ]
            body["tools"] = [{"functionDeclarations": declarations}]
        if request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        body["contents"] = contents
        return body

    async def _chunks(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[StreamChunk, None]:
        """The reply's chunks: each chunk's parts in order (a thought's text as
        `ReasoningDelta`, text as `TextDelta`, a function call whole, with its signature
        as a `Thought` after it), then, once the body ended, the text part's signature,
        the last usage reported (each chunk repeats the counts so far) and the finish. A
        body that ends before any candidate finished is an error, and so is an ``error``
        in the stream (tried again, when it says the service is busy, if nothing was
        streamed yet)."""
        called = False
        text_signature = ""
        usage: _UsageMetadata | None = None
        finish: Finish | None = None
        async for event in events:
            chunk = self._decode(_CHUNK, event)
            if chunk.error is not None:
                raise self._failure(chunk.error)
            if chunk.usage_metadata is not None:
                usage = chunk.usage_metadata
            if chunk.prompt_feedback is not None and chunk.prompt_feedback.block_reason:
                finish = Finish(
                    "refusal", f"the prompt was blocked: {chunk.prompt_feedback.block_reason}"
                )
            for candidate in chunk.candidates:
                if candidate.content is not None:
                    for part in candidate.content.parts:
                        if part.function_call is not None:
                            called = True
                            call_id = part.function_call.id or f"{MINTED}{uuid.uuid4().hex[:16]}"
                            arguments = msgspec.json.encode(part.function_call.args or {})
                            yield ToolCallChunk(
                                call_id, part.function_call.name, arguments.decode()
                            )
                            if part.thought_signature:
                                yield Thought(
                                    signature=part.thought_signature, source=SOURCE, item=call_id
                                )
                            continue
                        if part.text:
                            yield (
                                ReasoningDelta(part.text) if part.thought else TextDelta(part.text)
                            )
                        if part.thought_signature:
                            text_signature = part.thought_signature
                if candidate.finish_reason:
                    finish = _finish(candidate.finish_reason, candidate.finish_message, called)
        if finish is None:
            raise ModelError(
                f"{self._url}: the stream ended before the response finished", "truncated"
            )
        if text_signature:
            yield Thought(signature=text_signature, source=SOURCE)
        if usage is not None:
            yield Usage(
                input_tokens=usage.prompt_token_count + usage.tool_use_prompt_token_count,
                output_tokens=usage.candidates_token_count + usage.thoughts_token_count,
                cache_read_tokens=usage.cached_content_token_count,
                reasoning_tokens=usage.thoughts_token_count,
            )
        yield finish

    def _failure(self, error: _Status) -> Exception:
        """What an ``error`` in a 200 stream raises: `RetryableError` when its status says
        the service is busy or failed (`RETRIED_STATUSES`), else `ModelError`."""
        status = error.status or f"http-{error.code}"
        text = f"{self._url}: error in the stream: {status}: {error.message or 'no message'}"
        if error.status in RETRIED_STATUSES or error.code in (429, 500, 503, 504):
            return RetryableError(text, status)
        return ModelError(text, status)


# -- the chunks read (a GenerateContentResponse each; any other field is skipped) ----------


class _FunctionCall(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    args: dict[str, Any] | None = None
    id: str | None = None


class _Part(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    text: str | None = None
    thought: bool = False
    thought_signature: str | None = None
    function_call: _FunctionCall | None = None


class _Content(msgspec.Struct, frozen=True, gc=False):
    parts: list[_Part] = []


class _Candidate(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    content: _Content | None = None
    finish_reason: str | None = None
    finish_message: str | None = None


class _UsageMetadata(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    prompt_token_count: int = 0
    candidates_token_count: int = 0
    cached_content_token_count: int = 0
    thoughts_token_count: int = 0
    tool_use_prompt_token_count: int = 0


class _Feedback(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    block_reason: str | None = None


class _Status(msgspec.Struct, frozen=True, gc=False):
    code: int = 0
    message: str = ""
    status: str = ""


class _Chunk(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    candidates: list[_Candidate] = []
    usage_metadata: _UsageMetadata | None = None
    prompt_feedback: _Feedback | None = None
    error: _Status | None = None


_CHUNK = msgspec.json.Decoder(_Chunk)


def _finish(reason: str, message: str | None, called: bool) -> Finish:
    if reason == "STOP":
        return Finish("tool-calls" if called else "stop")
    if reason in _FINISH:
        return Finish(_FINISH[reason], message)
    return Finish("error", f"the model stopped: {reason}" + (f": {message}" if message else ""))


def _args(call: ToolCallChunk) -> object:
    """A call's arguments as the object Gemini sends back (arguments that are not a JSON
    object, which the call's tool refused, go back as they were written)."""
    try:
        value = arguments_value(call.arguments)
    except msgspec.DecodeError:
        return {"_raw": call.arguments}
    return value if isinstance(value, dict) else {"_raw": call.arguments}


def _part(part: WirePart) -> dict[str, Any]:
    if isinstance(part, str):
        return {"text": part}
    return {"inlineData": {"mimeType": part.mime_type, "data": part.data}}
