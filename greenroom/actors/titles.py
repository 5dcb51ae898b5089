"""Titles a model writes: the ``titles`` setting ``model``.

A session's title is the first line of its first prompt
(`greenroom.session.session.title_of`). When its ``titles`` setting (else the agent's
`AgentOptions.titles`) is ``model``, the agent also has its model write one, once: as
soon as a turn of a prompt has completed and nothing is queued, it runs a turn of its
own (`TitleTurn`, trigger ``title``) of one step: one call of the session's model, asked
`TITLE_SYSTEM` over the first prompt and its answer (each cut to `SHOWN_CHARS`), at most
`TITLE_TOKENS` output tokens, within `TITLE_DEADLINE` seconds. What it writes, made a
title (`written_title`), is logged as the ``title`` setting (``config/set``), and the
call's tokens and cost as the turn's ``turn/usage``, so they count in the session's
usage, cost and limits as any step's do.

A title turn in the log, however it ended, is the session's one try (`titled`): a
resumed session never calls the model for its title again. A call that fails, runs
past its deadline, answers nothing a title can be made of, or would pass a limit ends
the turn ``error`` with the code `TITLE_FAILED` and the reason; the title stays the
first prompt's. A cancel of the agent's turn (``session/cancel``) or its disposal cuts
it like any turn. The title turn runs in the agent's own task, after the turn whose
prompts it follows has settled them: an answer never waits for it, and a prompt sent
meanwhile waits at most `TITLE_DEADLINE` for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import trio

from greenroom.actors.side import read_side_text
from greenroom.actors.turn import TurnDriver
from greenroom.models.usage import usage_record
from greenroom.protocol.events import (
    COMPLETED,
    AssistantMessage,
    Completed,
    ConfigSet,
    Errored,
    MessageTrigger,
    SessionEvent,
    StepStart,
    TitleTrigger,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import ModelRequest, UserTurn
from greenroom.session import Session
from greenroom.session.session import TITLE_KEY, title_of
from greenroom.spill import cut

#: What the model is asked for a title.
TITLE_SYSTEM: Final = (
    "You name conversations. The user's first message comes first, the answer to it after"
    " the line '---'. Reply with a title for the conversation: at most six words, in"
    " the language of the user's message, no quotes, nothing else."
)
#: The most output tokens the title's call may spend.
TITLE_TOKENS: Final = 30
#: Seconds the title's call may take before the title stays the first prompt's.
TITLE_DEADLINE: Final = 30.0
#: The characters of the first prompt, and of its answer, the title's call is sent at most.
SHOWN_CHARS: Final = 2_000
#: The error code of a title turn whose title was not written (its message says why).
TITLE_FAILED: Final = "title"
#: The characters of the answer read at most: a title is one short line.
_READ_CHARS: Final = 1_000
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f]")
#: What a title is stripped of at its ends: blanks, quotes, markup.
_DRESSING: Final = " \t\"'`*#_\u201c\u201d\u2018\u2019\u00ab\u00bb"


def titled(events: Sequence[SessionEvent]) -> bool:
    """Whether the log holds a title turn (its one try, however it ended)."""
    return any(type(e) is TurnStart and type(e.trigger) is TitleTrigger for e in events)


def completed_prompt(session: Session) -> bool:
    """Whether the session's last turn of a prompt ended ``completed`` (and no turn is
    open): there is a first prompt, and an answer to name it by."""
    if session.title_seq < 0 or session.open_turn is not None:
        return False
    events = session.events
    end: TurnEnd | None = None
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if type(event) is TurnEnd:
            end = event
        elif type(event) is TurnStart and type(event.trigger) is MessageTrigger:
            return end is not None and type(end.reason) is Completed
    return False


def written_title(text: str) -> str | None:
    """The title in a model's answer: its first line that holds a letter or a digit, its
    control characters, quotes and markup dropped, a ``Title:`` label taken off,
    shortened as `title_of` shortens; None when no line holds one."""
    for line in text.splitlines():
        shown = " ".join(_CONTROL.sub(" ", line).split()).strip(_DRESSING)
        if shown[:6].lower() == "title:":
            shown = shown[6:].strip(_DRESSING)
        if any(character.isalnum() for character in shown):
            return title_of(shown)
    return None


def title_text(session: Session) -> str:
    """What the title's call is sent: the first prompt, then a line ``---`` and the text
    of its turn's answer, each cut to `SHOWN_CHARS` (the prompt first: a model that echoes
    its prompt, as the scripted one does, names the session as its prompt did)."""
    events = session.events
    first = events[session.title_seq]
    assert type(first) is UserMessage  # `title_seq` is the first prompt's
    answer: list[str] = []
    for index in range(first.seq + 1, len(events)):
        event = events[index]
        if type(event) is AssistantMessage and event.content:
            answer.append(event.content)
        elif type(event) is TurnEnd:
            break
    whole = "the rest was left out"
    prompt = cut(first.content, SHOWN_CHARS, whole)
    reply = cut("\n\n".join(answer), SHOWN_CHARS, whole)
    return f"{prompt}\n---\n{reply}"


class TitleTurn:
    """The body of a title turn (`TurnDriver.run(..., body=...)`; see the module)."""

    __slots__ = ("_driver", "_session")

    def __init__(self, session: Session, driver: TurnDriver) -> None:
        self._session = session
        self._driver = driver

    async def __call__(self, turn: int, start: int) -> TurnEndReason:
        session, driver = self._session, self._driver
        session.append(TurnStart(turn=turn, trigger=TitleTrigger()))
        budget = driver.budget
        if budget is not None and (reached := budget.request()) is not None:
            why = f"its call would pass the {reached.limit} limit ({reached.allowed})"
            return _failed(why, step=0)
        requests = driver.requests
        model_id = requests.model_id
        model = requests.models[model_id]
        request = ModelRequest(
            messages=[UserTurn(title_text(session))],
            model=requests.model_name,
            system=TITLE_SYSTEM,
            max_output_tokens=TITLE_TOKENS,
            session_id=session.id,
        )
        driver.open_step = 1
        session.append(StepStart(turn=turn, step=1))
        text, usage, failure = "", None, None
        with trio.move_on_after(TITLE_DEADLINE) as deadline:
            try:
                text, usage, _ = await read_side_text(model, request, session, turn, 1, _READ_CHARS)
            except trio.Cancelled:
                raise
            except Exception as exc:  # the model's failure: the title stays the prompt's
                failure = f"the model failed: {str(exc) or type(exc).__name__}"[:500]
        driver.close_step(turn)
        if deadline.cancelled_caught:
            failure = f"the model did not answer within {TITLE_DEADLINE:g} s"
        title = None if failure is not None else written_title(text)
        if title is not None:
            session.append(ConfigSet(key=TITLE_KEY, value=title))
        if usage is not None:
            usage = requests.priced(usage, request, model)
            if budget is not None:
                budget.spend(usage)
            session.append(usage_record(session.events, turn, usage))
        if failure is not None:
            return _failed(failure)
        if title is None:
            return _failed(f"the model's answer held no title: {text[:200]!r}")
        return COMPLETED


def _failed(why: str, step: int = 1) -> Errored:
    return Errored(step=step, message=f"the title was not written: {why}", code=TITLE_FAILED)
