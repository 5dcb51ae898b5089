"""A session log as a person reads it: turns, messages, tool calls, usage and cost, end
reasons.

Bounded whatever the log holds: a tool's result shows its first `PREVIEW`
characters, and its marker when it was cut (which names the spill file
holding its whole text); any other text `SHOWN` characters of its start and
end, with a marker between saying how much more the log holds.
"""

from __future__ import annotations

import datetime
from collections.abc import Container, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Final

from greenroom.protocol.content import ImageRef, Part, ResourceRef, described, missing
from greenroom.protocol.events import (
    Aborted,
    AgentSource,
    AssistantMessage,
    Compacted,
    CompactionStart,
    CompactionTrigger,
    Completed,
    ConfigSet,
    ConfigTrigger,
    ContextMessage,
    DecisionMade,
    DecisionRequested,
    Disposed,
    Errored,
    Guarded,
    GuardTripped,
    InjectionTrigger,
    Interrupted,
    LimitReached,
    MaxTokens,
    MessageSource,
    MessageTrigger,
    PermissionRule,
    PluginSource,
    Refused,
    SandboxProtections,
    SessionEvent,
    SessionHeader,
    SteeringMessage,
    TitleTrigger,
    ToolCall,
    ToolResult,
    TurnAnswered,
    TurnEnd,
    TurnEndReason,
    TurnResumed,
    TurnStart,
    TurnUsage,
    UserMessage,
)
from greenroom.protocol.model import Usage
from greenroom.sandbox import describe
from greenroom.session.persistence import StoredSession
from greenroom.spill import cut, find_marker

PREVIEW: Final = 300  # characters of a tool result shown
SHOWN: Final = 10_000  # characters of any other text shown
_REST: Final = "the rest is in the session's log"


def describe_stored(stored: StoredSession) -> str:
    """One line of ``greenroom sessions list``: the header, the title if it has one, and
    who holds it live if the store says (a PostgreSQL lease)."""
    line = describe_header(stored.header)
    if stored.title:
        line = f"{line}  {stored.title!r}"
    holder = stored.holder
    return f"{line}  held by pid {holder.pid} on {holder.host}" if holder else line


def session_tree(stored: Sequence[StoredSession]) -> Iterator[str]:
    """The lines of ``greenroom sessions list``: each session, its children indented under it.

    A session whose parent is not in `stored` is listed at the top. Order is
    kept among siblings.
    """
    ids = {session.header.id for session in stored}
    children: dict[str | None, list[StoredSession]] = {}
    for session in stored:
        parent = session.header.parent_session
        children.setdefault(parent if parent in ids else None, []).append(session)
    pending = [(session, 0) for session in reversed(children.get(None, []))]
    while pending:
        session, depth = pending.pop()
        yield "  " * depth + ("└ " if depth else "") + describe_stored(session)
        below = children.get(session.header.id, [])
        pending.extend((child, depth + 1) for child in reversed(below))


def describe_header(header: SessionHeader) -> str:
    created = datetime.datetime.fromtimestamp(header.created_at / 1000).isoformat(
        sep=" ", timespec="seconds"
    )
    parts = [header.id, f"created {created}"]
    if header.cwd:
        parts.append(f"cwd {header.cwd}")
    if header.parent_session:
        parts.append(f"parent {header.parent_session}")
    if header.forked_from:
        parts.append(f"forked from {header.forked_from}")
    return "  ".join(parts)


def transcript(
    header: SessionHeader,
    events: Sequence[SessionEvent],
    stored: Container[str] | None = None,
    answers: Mapping[str, tuple[str, str]] | None = None,
) -> Iterator[str]:
    """Yield the lines of a readable transcript (chunks are folded into their messages).

    A prompt of blocks shows each on a line of its own; an image or blob resource as what
    it is (type, size, the start of its SHA-256). With `stored`, the blobs its store holds
    (`Persistence.read_blobs`), one it does not hold shows as missing. A turn parked on
    decisions ends the transcript with a ``parked:`` line and each open decision, with
    the answer `answers` (`Persistence.read_answers`) kept for it, if any."""
    yield f"session {describe_header(header)}"
    waiting: dict[str, DecisionRequested] = {}  # the open turn's decisions
    for event in events:
        match event:
            case TurnStart(turn=turn, trigger=InjectionTrigger(source=source)):
                yield f"turn {turn} (injected by {describe_source(source)})"
            case TurnStart(turn=turn, trigger=ConfigTrigger(source=source)):
                yield f"turn {turn} (settings changed by {describe_source(source)})"
            case TurnStart(turn=turn, trigger=CompactionTrigger(source=source)):
                yield f"turn {turn} (compaction asked by {describe_source(source)})"
            case TurnStart(turn=turn, trigger=TitleTrigger()):
                yield f"turn {turn} (the model writes the title)"
            case TurnStart(turn=turn, trigger=MessageTrigger(source=source)):
                yield f"turn {turn} (message from {describe_source(source)})"
            case UserMessage(content=content, source=source, parts=[]):
                yield f"  {describe_source(source)}: {_shown(content)}"
            case UserMessage(source=source, parts=parts):
                yield f"  {describe_source(source)}:"
                for part in parts:
                    yield f"    {_shown(_part(part, stored))}"
            case ContextMessage(content=content, source=source):
                yield f"  context from {describe_source(source)}: {_shown(content)}"
            case SteeringMessage(content=content, source=source):
                yield f"  steering from {describe_source(source)}: {_shown(content)}"
            case AssistantMessage(content=content, reasoning=reasoning):
                if reasoning:
                    yield f"  thinking: {_shown(reasoning)}"
                if content:
                    yield f"  assistant: {_shown(content)}"
            case ToolCall(call_id=call_id, name=name, arguments=arguments):
                yield f"  tool call {_shown(name)} {_shown(arguments)}  [{_shown(call_id)}]"
            case ToolResult(call_id=call_id, content=content, is_error=is_error):
                kind = "tool error" if is_error else "tool result"
                yield f"  {kind} [{_shown(call_id)}]: {_preview(content)}"
            case ConfigSet(key=key, value=value):
                yield f"  {_shown(key)} set to {_shown(value)}"
            case PermissionRule(tool=tool, allow=allow):
                yield f"  {'always allow' if allow else 'always reject'} {_shown(tool)}"
            case CompactionStart(tokens=tokens, window=window, cause=cause):
                yield f"  compacting ({cause}): about {tokens:,} tokens of {window:,}"
            case Compacted():
                yield f"  {describe_compaction(event)}"
            case SandboxProtections(protections=protections):
                yield f"  sandbox: {describe(protections)}"
            case TurnUsage(usage=usage, session=session):
                yield f"  {describe_usage(usage, session)}"
            case TurnEnd(reason=reason):
                yield f"  end: {_shown(describe_reason(reason))}"
            case GuardTripped(guard=guard, at=at, message=message):
                where = at.replace("_", " ")
                yield f"  guard {_shown(guard)} tripped at the {where}: {_shown(message)}"
            case TurnAnswered(reason=reason):
                yield f"  answered: {_shown(describe_reason(reason))}"
            case DecisionRequested(decision_id=decision_id):
                waiting[decision_id] = event
                yield f"  {describe_decision(event)}  [{_shown(decision_id)}]"
            case DecisionMade(decision_id=decision_id, answer=answer, by=by):
                waiting.pop(decision_id, None)
                said = _shown(answer) if answer else "(declined)"
                yield f"  decided by {_shown(by)}: {said}  [{_shown(decision_id)}]"
            case TurnResumed(turn=turn, waiting=asked) if asked:
                yield f"  turn {turn} carried on: {len(asked)} decision(s) asked again"
            case TurnResumed(turn=turn):
                yield f"  turn {turn} carried on after a cut"
        if type(event) is TurnEnd:
            waiting.clear()
    if waiting:
        kept = answers or {}
        yield f"parked: the open turn waits on {len(waiting)} decision(s)"
        for decision_id in waiting:
            if decision_id in kept:
                answer, by = kept[decision_id]
                yield f"  {_shown(decision_id)}: answered {_shown(answer)} by {_shown(by)},"
                yield "    logged when the session is next taken live"
            else:
                yield f"  {_shown(decision_id)}: open"


def _part(part: Part, stored: Container[str] | None) -> str:
    if isinstance(part, (ImageRef, ResourceRef)) and stored is not None:
        return described(part) if part.sha256 in stored else missing(part)
    return described(part)


def _shown(text: str) -> str:
    return cut(text, SHOWN, _REST)


def _preview(result: str) -> str:
    """A tool result's first `PREVIEW` characters, and its marker if it was cut."""
    if len(result) <= PREVIEW:
        return result
    marker = find_marker(result)
    return f"{result[:PREVIEW]} … {marker}" if marker else f"{result[:PREVIEW]} …"


def describe_decision(event: DecisionRequested) -> str:
    """A decision as asked: a tool's permission, or a question (with its choices)."""
    if event.kind == "permission":
        return f"permission asked for {_shown(event.tool)} {_shown(event.arguments)}"
    choices = f" ({', '.join(_shown(c) for c in event.choices)})" if event.choices else ""
    return f"question asked: {_shown(event.question)}{choices}"


def describe_compaction(event: Compacted) -> str:
    """A compaction's line: what the model is sent from here on in place of the log above."""
    turns = f"turns {event.first_turn}-{event.last_turn}"
    size = f"{event.tokens_before:,} -> {event.tokens_after:,} tokens"
    cuts = f", {len(event.cuts)} texts cut" if event.cuts else ""
    cuts += f", {len(event.carried)} carried" if event.carried else ""
    cuts += f", the summary cut: {_shown(event.cut)}" if event.cut else ""
    if event.degraded is not None:
        return f"compacted {turns} without a summary ({size}{cuts}): {_shown(event.degraded)}"
    return f"compacted {turns} ({size}{cuts}, by {event.model}): {_shown(event.summary)}"


def describe_usage(usage: Usage, session: Usage) -> str:
    """A ``turn/usage`` record's line: the turn's tokens, its cost and the session's."""
    tokens = f"{usage.input_tokens:,} tokens in"
    reads = [
        f"{count:,} {what}"
        for count, what in (
            (usage.cache_read_tokens, "cached"),
            (usage.cache_write_tokens, "written to the cache"),
        )
        if count
    ]
    tokens += f" ({', '.join(reads)})" if reads else ""
    tokens += f", {usage.output_tokens:,} out"
    tokens += f" ({usage.reasoning_tokens:,} thinking)" if usage.reasoning_tokens else ""
    return f"usage: {tokens}; cost {_usd(usage.cost)}, the session's {_usd(session.cost)}"


def _usd(amount: Decimal | None) -> str:
    """`amount` as a reader sees it: ``$0.0123`` (exact, no exponent), or ``unknown``."""
    return "unknown" if amount is None else f"${amount.normalize():f}"


def describe_source(source: MessageSource) -> str:
    match source:
        case PluginSource(plugin=plugin):
            return f"plugin {plugin}"
        case AgentSource(agent_id=agent_id):
            return f"agent {agent_id}"
        case _:
            return "user"


def describe_reason(reason: TurnEndReason) -> str:
    match reason:
        case Completed():
            return "completed"
        case Aborted(reason=why):
            return f"aborted ({why})"
        case Errored(step=step, message=message):
            return f"error at step {step}: {message}"
        case Disposed():
            return "disposed"
        case MaxTokens():
            return "max-tokens"
        case Refused():
            return "refused by the model (left out of its history)"
        case Interrupted():
            return "interrupted (the process stopped mid-turn)"
        case LimitReached(limit=limit, allowed=allowed, reached=None):
            return f"limit: {limit} reached (the cost is unknown, the limit {allowed})"
        case LimitReached(limit=limit, allowed=allowed, reached=reached):
            return f"limit: {limit} reached ({reached} of {allowed})"
        case Guarded(guard=guard, at=at, message=message):
            return f"guarded: {guard} at the {at.replace('_', ' ')}: {message}"
    raise AssertionError(reason)
