"""Code and the ``greenroom`` command find a model's endpoint by one rule: the argument, else
``{PROVIDER}_BASE_URL`` / ``{PROVIDER}_API_KEY``, else (the URL) the public API."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import ModelAdapter
from greenroom.models.named import model_named
from greenroom.models.openai import OpenAIChatModel
from greenroom.protocol.model import TextDelta
from tests.models.test_adapters import KEY, LIMIT, REQUEST, STREAMS
from tests.sse_server import Served, sse_server

ADAPTERS = {"openai": (OpenAIChatModel, "/v1"), "anthropic": (AnthropicModel, "")}


async def hello(model: ModelAdapter) -> str:
    return "".join([c.text async for c in model.stream(REQUEST) if isinstance(c, TextDelta)])


@pytest.mark.real_clock  # a loopback server
@pytest.mark.parametrize("kind", ADAPTERS)
async def test_an_adapter_made_in_code_follows_the_environment(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, suffix = ADAPTERS[kind]
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS[kind]["text"])]) as server:
            monkeypatch.setenv(f"{kind.upper()}_BASE_URL", server.url + suffix)
            monkeypatch.setenv(f"{kind.upper()}_API_KEY", KEY)
            assert await hello(cls(model="m")) == "Hello world"
    (seen,) = server.requests
    assert KEY in (seen.headers.get("authorization", "") + seen.headers.get("x-api-key", ""))


@pytest.mark.real_clock  # a loopback server
@pytest.mark.parametrize("kind", ADAPTERS)
async def test_the_argument_wins_over_the_environment(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, suffix = ADAPTERS[kind]
    monkeypatch.setenv(f"{kind.upper()}_BASE_URL", "http://127.0.0.1:9/nowhere")
    monkeypatch.setenv(f"{kind.upper()}_API_KEY", "sk-from-the-environment")
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS[kind]["text"])]) as server:
            assert await hello(cls(server.url + suffix, KEY, "m")) == "Hello world"
    (seen,) = server.requests
    assert KEY in (seen.headers.get("authorization", "") + seen.headers.get("x-api-key", ""))


@pytest.mark.real_clock  # a loopback server
@pytest.mark.parametrize("kind", ADAPTERS)
async def test_the_command_follows_the_same_rule(kind: str) -> None:
    _, suffix = ADAPTERS[kind]
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS[kind]["text"])]) as server:
            environ = {
                f"{kind.upper()}_BASE_URL": server.url + suffix,
                f"{kind.upper()}_API_KEY": KEY,
            }
            assert await hello(model_named(f"{kind}:m", environ)) == "Hello world"
    assert len(server.requests) == 1


@pytest.mark.parametrize("kind", ADAPTERS)
def test_no_key_names_the_variable(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(f"{kind.upper()}_API_KEY", raising=False)
    with pytest.raises(ValueError, match=f"{kind.upper()}_API_KEY"):
        ADAPTERS[kind][0](model="m")


@pytest.mark.parametrize("kind", ADAPTERS)
def test_no_model_is_a_type_error(kind: str) -> None:
    with pytest.raises(TypeError, match="name the model"):
        ADAPTERS[kind][0](api_key=KEY)


def test_a_base_url_with_credentials_is_refused() -> None:
    from greenroom.models.openai import OpenAIChatModel

    with pytest.raises(ValueError, match="must not carry credentials"):
        OpenAIChatModel("http://user:s3cret@proxy.example/v1", "sk", "m")
