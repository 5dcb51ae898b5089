"""An ASGI service that embeds agents, as one would be written: Starlette, served by uvicorn.

``POST /chat/{session}`` sends the body to that session's agent (started at its first
request, kept until the service stops) and streams the turn's text back. The handler watches
for the client's disconnect itself (a plain endpoint is not cancelled by one) and then
cancels the prompt: its turn stops, the model's stream is closed. The model is an
OpenAI-compatible server at ``$MODEL_URL``; sessions are stored as JSONL under ``$STORE``.
Run by `tests/hosts/test_asgi.py` as ``python -m uvicorn tests.asgi_host:app``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

import greenroom.aio
from greenroom import AgentSpec
from greenroom.models.openai import OpenAIChatModel
from greenroom.session.persistence import JsonlPersistence

SPEC = AgentSpec(name="chat", instructions="Answer in one line.")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    model = OpenAIChatModel(os.environ["MODEL_URL"] + "/v1", "sk-test", "gpt-4o-mini")
    store = JsonlPersistence(os.environ["STORE"])
    async with greenroom.aio.open_runtime(model=model, persistence=store) as rt:
        app.state.runtime = rt
        app.state.agents = {}
        yield  # leaving: every agent disposed, its turn's end stored


async def agent_of(request: Request, session: str) -> greenroom.aio.AioAgent:
    agents: dict[str, greenroom.aio.AioHandle] = request.app.state.agents
    if session not in agents:
        agents[session] = await request.app.state.runtime.start(SPEC, session)
    return agents[session].agent


async def chat(request: Request) -> StreamingResponse:
    agent = await agent_of(request, request.path_params["session"])
    prompt = agent.send((await request.body()).decode())
    texts = prompt.text()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        prompt.cancel("the client disconnected")

    async def stream() -> AsyncIterator[str]:
        watcher = asyncio.create_task(watch())
        try:
            async for text in texts:
                yield text
        except BaseException:  # cut short (Starlette may see the disconnect first): stop it
            prompt.cancel("the client disconnected")
            raise
        finally:
            watcher.cancel()

    return StreamingResponse(stream(), media_type="text/plain")


app = Starlette(routes=[Route("/chat/{session}", chat, methods=["POST"])], lifespan=lifespan)
