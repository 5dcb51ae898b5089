"""``ask_user``: the model asks the person at the front end; answered, declined, cancelled,
and not offered at all where no one can be asked. In virtual time, with a front end of
the test's own (`Questions`); over ACP in tests/acp/test_editor_e2e.py-style tests below.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import acp
import trio
from acp import schema

from greenroom import AgentOptions, open_runtime
from greenroom.actors.types import Question, SessionClient
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import Aborted, ToolResult, TurnEnd
from greenroom.tools.ask import ask_plugin
from greenroom.tools.subagents import task_plugin
from tests.actors.test_subagents import Routed
from tests.agents_helpers import new_agent

LIMIT = 30.0


class Person:
    """Answers each question with the next of `answers` (None: declines), after `delay`."""

    def __init__(self, *answers: str | None, delay: float = 1.0) -> None:
        self.answers = list(answers)
        self.asked: list[Question] = []
        self.withdrawn = 0
        self.delay = delay

    async def ask(self, question: Question) -> str | None:
        self.asked.append(question)
        try:
            await trio.sleep(self.delay)
        except trio.Cancelled:
            self.withdrawn += 1
            raise
        return self.answers.pop(0)


def ask(question: str, call_id: str = "q1", **more: object) -> CallTool:
    return CallTool("ask_user", {"question": question, **more}, call_id=call_id)


def result(agent: Any, call_id: str) -> ToolResult:
    return next(
        e for e in agent.session.events if isinstance(e, ToolResult) and e.call_id == call_id
    )


async def test_an_answer_is_the_calls_result_in_the_log() -> None:
    person = Person("blue", None)
    model = ScriptedModel(
        [
            [ask("Which color?", choices=["red", "blue"])],
            [ask("Anything else?", "q2")],
            [Say("ok")],
        ],
        delay=0,
    )
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-ask", ask_plugin)
        agent = await new_agent(rt, client=SessionClient(questions=person))
        answer = await agent.run("go")
        # Offered to the model: its client can be asked.
        assert "ask_user" in {t.name for t in model.requests[0].tools}
    assert answer.stop_reason == "completed"
    first, second = person.asked
    assert (first.question, first.choices, first.free_text) == (
        "Which color?",
        ["red", "blue"],
        False,
    )
    assert (first.session_id, first.call_id) == ("s", "q1")
    assert second.free_text  # no choices: any text
    assert result(agent, "q1").content == "The user answered: blue"
    assert result(agent, "q2").content == "The user declined to answer."


async def test_an_answer_outside_the_choices_is_an_error_result() -> None:
    person = Person("green")
    model = ScriptedModel([[ask("Which?", choices=["red", "blue"])], [Say("ok")]], delay=0)
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-ask", ask_plugin)
        agent = await new_agent(rt, client=SessionClient(questions=person))
        await agent.run("go")
    refused = result(agent, "q1")
    assert refused.is_error
    assert "none of the choices" in refused.content


async def test_bad_questions_are_refused_naming_what_is_wrong() -> None:
    person = Person()
    model = ScriptedModel(
        [
            [ask(" ", "b1")],
            [ask("x", "b2", choices=["a", "a"])],
            [ask("x", "b3", choices=[""])],
            [Say("ok")],
        ],
        delay=0,
    )
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-ask", ask_plugin)
        agent = await new_agent(rt, client=SessionClient(questions=person))
        await agent.run("go")
    assert "question is empty" in result(agent, "b1").content
    assert "choices repeat" in result(agent, "b2").content
    assert "choices[0]" in result(agent, "b3").content
    assert person.asked == []


async def test_a_cancel_withdraws_the_question_and_the_turn_ends_aborted() -> None:
    person = Person("never", delay=3600)
    model = ScriptedModel([[ask("Wait?")], [Say("unreachable")]], delay=0)
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-ask", ask_plugin)
        agent = await new_agent(rt, client=SessionClient(questions=person))
        prompt = agent.send("go")
        while not person.asked:
            await trio.sleep(0.1)
        agent.cancel("changed my mind")
        answer = await prompt
    assert person.withdrawn == 1
    assert answer.stop_reason == "aborted"
    assert result(agent, "q1").content.startswith("aborted: changed my mind")
    end = [e for e in agent.session.events if isinstance(e, TurnEnd)][-1]
    assert end.reason == Aborted("changed my mind")


async def test_with_no_one_to_ask_the_tool_is_not_offered_and_a_call_is_refused() -> None:
    model = ScriptedModel([[ask("Hello?")], [Say("ok")]], delay=0)
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-ask", ask_plugin)
        agent = await new_agent(rt)  # no client
        await agent.run("go")
    assert "ask_user" not in {t.name for t in model.requests[0].tools}
    refused = result(agent, "q1")
    assert refused.is_error
    assert "no one can be asked" in refused.content


async def test_a_sub_agents_question_goes_to_its_familys_front_end() -> None:
    person = Person("yes")
    model = Routed(
        {
            "parent": [[CallTool("task", {"prompt": "child: ask"})], [Say("done")]],
            "child:": [[ask("Proceed?", "c1")], [Say("asked")]],
        }
    )
    async with open_runtime(model=model) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        await rt.plug("tool-ask", ask_plugin)
        parent = await new_agent(rt, "p", "p", client=SessionClient(questions=person))
        await parent.run("parent: go")
    (question,) = person.asked
    assert question.question == "Proceed?"
    assert question.session_id != "p"


# -- over ACP, with the official SDK client ------------------------------------------------------


class Editor:
    """Answers elicitations with `answer` (None: declines); can hold one until cancelled."""

    def __init__(self, answer: str | None = "blue", *, hold: bool = False) -> None:
        self.answer = answer
        self.hold = hold
        self.asked: list[tuple[str, Any]] = []
        self.updates: list[Any] = []
        self.released = asyncio.Event()

    def on_connect(self, conn: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("ask_user asks no permission")

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        self.asked.append((message, mode))
        if self.hold:
            await self.released.wait()
        if self.answer is None:
            return schema.DeclineElicitationResponse(action="decline")
        return schema.AcceptElicitationResponse(action="accept", content={"answer": self.answer})

    def results(self) -> list[str]:
        return [
            c.content.text
            for u in self.updates
            if isinstance(u, schema.ToolCallProgress) and u.status in ("completed", "failed")
            for c in u.content or []
            if isinstance(c, schema.ContentToolCallContent)
        ]


async def _acp(
    tmp_path: Path, editor: Editor, body: Any, *, elicitation: bool, load: str | None = None
) -> int:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir(exist_ok=True)
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    capabilities = schema.ClientCapabilities(
        elicitation=schema.ElicitationCapabilities(form=schema.ElicitationFormCapabilities())
        if elicitation
        else None
    )
    # The SDK routes elicitation/create only with its unstable protocol on.
    async with acp.spawn_agent_process(
        editor, *command, env={"GREENROOM_HOME": str(home)}, cwd=work, use_unstable_protocol=True
    ) as (conn, process):
        await conn.initialize(protocol_version=1, client_capabilities=capabilities)
        if load is None:
            session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        else:
            session = load
            await conn.load_session(cwd=str(work), session_id=session, mcp_servers=[])
        await body(conn, session)
    return await asyncio.wait_for(process.wait(), 10)


def prompt_text(words: str) -> list[Any]:
    return [acp.text_block(words)]


ASK_PROMPT = "ask: Which color? | red | blue"  # the echo model's way to call ask_user


def test_acp_asks_through_elicitation_and_the_answer_is_the_result(tmp_path: Path) -> None:
    editor = Editor("blue")

    async def body(conn: Any, session: str) -> None:
        answer = await conn.prompt(session_id=session, prompt=prompt_text(ASK_PROMPT))
        assert answer.stop_reason == "end_turn"

    assert asyncio.run(asyncio.wait_for(_acp(tmp_path, editor, body, elicitation=True), LIMIT)) == 0
    ((message, mode),) = editor.asked
    assert message == "Which color?"
    assert isinstance(mode, schema.ElicitationFormSessionMode)
    assert mode.requested_schema.properties["answer"].enum == ["red", "blue"]
    assert editor.results() == ["The user answered: blue"]


def test_acp_cancel_withdraws_the_question_and_the_prompt_ends_cancelled(tmp_path: Path) -> None:
    editor = Editor("blue", hold=True)

    async def body(conn: Any, session: str) -> None:
        prompt = asyncio.ensure_future(
            conn.prompt(session_id=session, prompt=prompt_text(ASK_PROMPT))
        )
        while not editor.asked:
            await asyncio.sleep(0.05)
        await conn.cancel(session_id=session)
        answer = await prompt
        assert answer.stop_reason == "cancelled"
        editor.released.set()

    assert asyncio.run(asyncio.wait_for(_acp(tmp_path, editor, body, elicitation=True), LIMIT)) == 0


def test_acp_without_elicitation_does_not_offer_the_tool(tmp_path: Path) -> None:
    editor = Editor()

    async def body(conn: Any, session: str) -> None:
        # The echo model calls only tools it is offered: the prompt is echoed as text.
        answer = await conn.prompt(session_id=session, prompt=prompt_text(ASK_PROMPT))
        assert answer.stop_reason == "end_turn"

    assert (
        asyncio.run(asyncio.wait_for(_acp(tmp_path, editor, body, elicitation=False), LIMIT)) == 0
    )
    assert editor.asked == []
    assert not any(isinstance(u, schema.ToolCallStart) for u in editor.updates)


async def test_an_unaskable_session_is_offered_each_tool_list_without_the_tool() -> None:
    # The copy without ask_user is kept per tool list: each list, new or seen before, is
    # offered as itself minus ask_user, and a list without it is offered unchanged.
    from greenroom.protocol.model import ModelRequest, ToolSchema
    from greenroom.tools.ask import _Unaskable

    class Alone:
        client = None
        options = AgentOptions()  # no Defer: no one answers its questions

    unaskable = _Unaskable()
    first = [ToolSchema("bash", "", {}), ToolSchema("ask_user", "", {})]
    second = [ToolSchema("ask_user", "", {}), ToolSchema("read", "", {})]
    plain = [ToolSchema("bash", "", {})]
    for tools in [first, second, first, plain, second]:
        request = ModelRequest(messages=[], tools=tools)
        offered = await unaskable.offer(request, Alone())  # type: ignore[arg-type]
        assert offered.tools == [t for t in tools if t.name != "ask_user"]
        assert (offered is request) is (tools is plain)


def test_a_question_parked_by_a_disconnect_is_told_to_a_client_that_cannot_ask_and_answered_from_the_command_line(  # noqa: E501
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    session = _parked_by_a_disconnect(tmp_path)
    run = asyncio.run

    mute = Editor()  # no elicitation: it is told the question, not asked it

    async def look(conn: Any, session: str) -> None:
        while not any(_told(mute)):
            await asyncio.sleep(0.05)

    assert (
        run(asyncio.wait_for(_acp(tmp_path, mute, look, elicitation=False, load=session), LIMIT))
        == 0
    )
    (told,) = [t for t in _told(mute) if "The parked turn asks" in t]
    assert "Which color? (red, blue)" in told
    decision = told.split(f"greenroom sessions decide {session} ")[1].split()[0]
    assert mute.asked == []

    listed = _cli(home, "sessions", "decisions")
    assert f"{session} {decision}: question asked: Which color?" in listed.stdout
    refused = _cli(home, "sessions", "decide", session, decision, "green")
    assert refused.returncode == 1
    assert "'green' is none of the choices (red, blue)" in refused.stderr
    assert _cli(home, "sessions", "decide", session, decision, "blue").returncode == 0
    again = _cli(home, "sessions", "decide", session, decision, "red")
    assert "answered already, by greenroom sessions decide" in again.stderr
    assert _cli(home, "sessions", "decisions").stdout == ""

    last = Editor()  # the next holder logs the kept answer and carries the turn on

    async def finish(conn: Any, session: str) -> None:
        while "The user answered: blue" not in last.results():
            await asyncio.sleep(0.05)

    assert (
        run(asyncio.wait_for(_acp(tmp_path, last, finish, elicitation=False, load=session), LIMIT))
        == 0
    )
    assert last.asked == []
    shown = _cli(home, "sessions", "show", session).stdout
    assert f"decided by greenroom sessions decide: blue  [{decision}]" in shown
    assert "parked:" not in shown


def test_a_question_parked_by_a_disconnect_is_asked_again_of_the_next_client(
    tmp_path: Path,
) -> None:
    session = _parked_by_a_disconnect(tmp_path)
    second = Editor("red")

    async def answer(conn: Any, session: str) -> None:
        while "The user answered: red" not in second.results():
            await asyncio.sleep(0.05)

    ran = _acp(tmp_path, second, answer, elicitation=True, load=session)
    assert asyncio.run(asyncio.wait_for(ran, LIMIT)) == 0
    assert [message for message, _ in second.asked] == ["Which color?"]


def _parked_by_a_disconnect(tmp_path: Path) -> str:
    """A session whose turn is parked on ``ask_user``: its client, asked, left mid-question."""
    first = Editor(hold=True)
    started: list[str] = []

    async def leave(conn: Any, session: str) -> None:
        started.append(session)
        prompt = asyncio.ensure_future(
            conn.prompt(session_id=session, prompt=prompt_text(ASK_PROMPT))
        )
        while not first.asked:
            await asyncio.sleep(0.05)
        prompt.cancel()

    assert asyncio.run(asyncio.wait_for(_acp(tmp_path, first, leave, elicitation=True), LIMIT)) == 0
    (session,) = started
    return session


def _told(editor: Editor) -> list[str]:
    return [u.content.text for u in editor.updates if isinstance(u, schema.AgentMessageChunk)]


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "greenroom", *args],
        env={**os.environ, "GREENROOM_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
