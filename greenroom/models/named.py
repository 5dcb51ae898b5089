"""Models by name: the model strings ``--model`` and `AgentSpec.model` take.

``KIND:MODEL`` names an API model of one of the wire formats greenroom speaks,
its key from the environment, else the stored keys (`greenroom.keys`), its base URL from
the environment; ``scripted`` the echo.

`model_named` makes the adapter; the kinds are `API_KINDS` (openai, openai-responses,
anthropic, gemini, deepseek); a key neither in the environment nor stored is `MissingKey`.
"""

from __future__ import annotations

from collections.abc import Mapping

from greenroom import keys
from greenroom.models.base import ModelAdapter
from greenroom.models.scripted import ScriptedModel


class MissingKey(ValueError):
    """The model's API key is neither in the environment nor stored (`greenroom.keys`)."""


#: The API model kinds a model string ``KIND:MODEL`` names, with the prefix of the environment
#: variables each reads its key and base URL from.
API_KINDS = {
    "openai": "OPENAI",
    "openai-responses": "OPENAI",
    "anthropic": "ANTHROPIC",
    "gemini": "GEMINI",
    "deepseek": "DEEPSEEK",
}


def key_variable(spec: str) -> str | None:
    """The variable the key of the model `spec` names is read from (``ANTHROPIC_API_KEY``),
    and stored under; None for a model that takes no key, or an unknown kind."""
    prefix = API_KINDS.get(spec.partition(":")[0])
    return None if prefix is None else f"{prefix}_API_KEY"


def model_named(
    spec: str,
    environ: Mapping[str, str],
    context_window: int | None = None,
    *,
    what: str = "--model",
) -> ModelAdapter:
    """The adapter `spec` names (a model string, as ``--model`` and `AgentSpec.model` take
    it); raises `ValueError` naming `what` gave it and what is wrong or missing
    (`MissingKey` for a key neither in `environ` nor stored, `greenroom.keys.KeyFileError`
    for a stored key file that cannot be used).

    ``scripted`` / ``scripted:SECONDS`` (echo), ``openai:MODEL`` (Chat Completions) and
    ``openai-responses:MODEL`` (the Responses API), both with ``OPENAI_API_KEY`` and
    ``OPENAI_BASE_URL``, ``anthropic:MODEL`` (``ANTHROPIC_...``), ``gemini:MODEL``
    (``GEMINI_...``), ``deepseek:MODEL`` (``DEEPSEEK_...``). `context_window`
    (``--context-window``) is the tokens an API model holds, in place of its family's
    default.
    """
    kind, _, detail = spec.partition(":")
    if kind == "scripted":
        if not detail:
            return ScriptedModel()
        try:
            return ScriptedModel(delay=float(detail))
        except ValueError:
            raise ValueError(f"{what} {spec!r}: the delay must be seconds >= 0") from None
    prefix = API_KINDS.get(kind)
    if prefix is None:
        known = ", ".join(["scripted", *API_KINDS])
        raise ValueError(f"{what} {spec!r}: unknown model kind {kind!r} (known: {known})")
    if not detail:
        raise ValueError(f"{what} {spec!r}: name the model, as in {kind}:MODEL")
    key = keys.api_key(f"{prefix}_API_KEY", None, environ)
    if not key:
        raise MissingKey(
            f"{what} {spec!r} needs {prefix}_API_KEY in the environment or a key stored by"
            " `greenroom acp --login`"
        )
    # The adapters' own rule (`greenroom.models.http.endpoint`) picks the default URL.
    base = environ.get(f"{prefix}_BASE_URL")
    if kind == "openai":
        from greenroom.models.openai import OpenAIChatModel

        return OpenAIChatModel(base, key, detail, context_window=context_window)
    if kind == "openai-responses":
        from greenroom.models.responses import OpenAIResponsesModel

        return OpenAIResponsesModel(base, key, detail, context_window=context_window)
    if kind == "gemini":
        from greenroom.models.gemini import GeminiModel

        return GeminiModel(base, key, detail, context_window=context_window)
    if kind == "deepseek":
        from greenroom.models.deepseek import DeepSeekModel

        return DeepSeekModel(base, key, detail, context_window=context_window)
    from greenroom.models.anthropic import AnthropicModel

    return AnthropicModel(base, key, detail, context_window=context_window)
