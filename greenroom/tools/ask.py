"""The ``ask_user`` tool: the model asks the person at the front end a question mid-turn.

The question goes to the session's `SessionClient.questions` (over ACP: an
elicitation in the client's session; a sub-agent has its parent's client, so
its question goes there too), or, for an agent whose policy is `Defer`, waits
for the embedder's answer (`Agent.decide`). It is a decision of the agent's
(`greenroom.actors.decisions`): logged before it is asked, the turn parked
until answered. A session no one can be asked in is not offered the tool at
all: the plugin takes it out of every request of such a session. A cancel
of the turn withdraws the question (the turn ends ``aborted``, the call's
result says so). The answer is the call's result, in the log like every
result.

`ask_plugin` offers the tool.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from greenroom.actors.events import AGENT_REQUEST
from greenroom.actors.types import (
    Agent,
    Defer,
    NamedAnswer,
    Question,
    Questions,
    SessionClient,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.protocol.model import ModelRequest, ToolSchema
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool

PLUGIN: Final = "tool-ask"
NAME: Final = "ask_user"
#: Tool lists whose ``ask_user``-less copy `_Unaskable` keeps, at most (then it starts over).
_KEPT: Final = 64
#: Characters of a question, and of one choice, at most; choices of one question at most.
MAX_QUESTION: Final = 2_000
MAX_CHOICE: Final = 200
MAX_CHOICES: Final = 20


class AskArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The arguments of ``ask_user``: a question, and optionally the answers to pick from
    (`free_text` lets the person write another)."""

    question: str
    choices: list[str] = []
    free_text: bool = False


def _refuse(message: str, code: str = "invalid-arguments") -> ToolOutcome:
    return ToolOutcome.failed(f"{NAME}: {message}", code, "AskError")


def _invalid(args: AskArgs) -> str | None:
    if not args.question.strip():
        return "question is empty"
    if len(args.question) > MAX_QUESTION:
        return f"question has {len(args.question)} characters; at most {MAX_QUESTION}"
    if len(args.choices) > MAX_CHOICES:
        return f"{len(args.choices)} choices; at most {MAX_CHOICES}"
    for index, choice in enumerate(args.choices):
        if not choice.strip() or len(choice) > MAX_CHOICE:
            return f"choices[{index}] must have 1 to {MAX_CHOICE} characters"
    if len(set(args.choices)) != len(args.choices):
        return "choices repeat"
    return None


async def ask_user(args: AskArgs, call: ToolInvocation) -> str | ToolOutcome:
    """Ask, and return the answer (the person's text, or one of the choices)."""
    invalid = _invalid(args)
    if invalid is not None:
        return _refuse(invalid)
    agent: Agent | None = call.agent
    questions = _asked(call.client, agent)
    if agent is None or (questions is None and not _open(agent, call.call_id)):
        return _refuse("no one can be asked in this session", "unsupported")
    question = Question(
        agent.session.id,
        call.call_id,
        args.question,
        args.choices,
        free_text=args.free_text or not args.choices,
    )
    client = call.client
    asker = None
    if questions is not None and not isinstance(questions, Defer):
        asking = questions.ask

        async def asker() -> str | NamedAnswer:
            return await asking(question) or ""

    answer, _ = await agent.decisions.ask(
        call.call_id,
        "question",
        asker,
        client.name if client is not None and client.questions is questions else "policy",
        question=args.question,
        choices=args.choices,
        free_text=question.free_text,
    )
    if not answer:
        return "The user declined to answer."
    if args.choices and not question.free_text and answer not in args.choices:
        return _refuse(f"the answer {answer[:100]!r} is none of the choices", "bad-answer")
    return f"The user answered: {answer}"


ASK: Final[Tool[Any]] = Tool(
    NAME,
    "Ask the user a question and wait for the answer. Give choices when the answer is one "
    "of a few; set free_text to also let them write their own.",
    AskArgs,
    ask_user,
    kind="other",
    view=lambda a: ToolView(title=a.question[:200]),
)


def _asked(client: SessionClient | None, agent: Agent | None) -> Questions | None:
    """Who a session's questions go to: its front end's, else the agent's `Defer` (the
    embedder answers), else no one."""
    if client is not None and client.questions is not None:
        return client.questions
    deferred = agent.options.permissions if agent is not None else None
    return deferred if isinstance(deferred, Defer) else None


def _open(agent: Agent, call_id: str) -> bool:
    """Whether the call's question is open in the log (a parked turn carried on): its
    answer may be kept already, or come by `decide`, whoever can be asked now."""
    return any(d.call_id == call_id for d in agent.session.decisions.values())


class _Unaskable:
    """What a session that cannot be asked is offered: its tools without ``ask_user``.

    The copy is made once per tool list, not per request: a session's tool list is one
    list object until its tools change (`ToolExecutor.schemas`), so the list held here,
    compared by identity, says the copy is still right. A list built afresh per request
    still gets a right copy, just not a kept one. At most `_KEPT` lists are held.
    """

    __slots__ = ("_copies",)

    def __init__(self) -> None:
        self._copies: dict[int, tuple[list[ToolSchema], list[ToolSchema]]] = {}

    async def offer(self, request: ModelRequest, agent: Agent, *_: object) -> ModelRequest:
        if _asked(agent.client, agent) is not None:
            return request
        tools = self._without(request.tools)
        return request if tools is request.tools else msgspec.structs.replace(request, tools=tools)

    def _without(self, tools: list[ToolSchema]) -> list[ToolSchema]:
        """`tools` without ``ask_user``: `tools` itself if it has none."""
        known = self._copies.get(id(tools))
        if known is not None and known[0] is tools:
            return known[1]
        kept = [tool for tool in tools if tool.name != NAME]
        if len(kept) == len(tools):
            kept = tools
        if len(self._copies) >= _KEPT:
            self._copies.clear()
        self._copies[id(tools)] = (tools, kept)
        return kept


def ask_plugin(ctx: PluginContext) -> None:
    """The ``tool-ask`` plugin: the tool, offered only to sessions whose client can be asked."""
    ctx.register_tool(ASK)
    ctx.hooks.intercept(AGENT_REQUEST, _Unaskable().offer, scope=ctx.scope)
