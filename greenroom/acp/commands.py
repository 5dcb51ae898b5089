"""Slash commands: what a session offers (``available_commands_update``) and what a prompt
that begins with one runs.

The set: ``/compact [instructions]``, ``/mode MODE``, ``/model MODEL``, and
each prompt of each of the session's MCP servers as ``/<server>:<prompt>``,
its arguments as the input hint. A prompt whose first word is one of them
runs it (`parse`); any other ``/word`` is text for the model, as before.

`SessionCommands` holds a session's set (its servers' prompts as ``mcp/prompts`` tells
them).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final, NamedTuple

from greenroom.actors.types import MODES
from greenroom.protocol.acp import AvailableCommand, AvailableCommandsUpdate, CommandInput
from greenroom.tools.mcp.servers import McpPrompt, McpPrompts

COMPACT: Final = "compact"
MODE: Final = "mode"
MODEL: Final = "model"
#: Characters of a command's description or hint sent, at most (a server writes them).
MAX_TEXT: Final = 500


class Command(NamedTuple):
    """A prompt that runs a command: its name (``server:prompt`` for a server's) and the
    rest of the prompt's text."""

    name: str
    rest: str


class SessionCommands:
    """The commands of one session: the built-in ones, then its servers' prompts."""

    __slots__ = ("_models", "_servers")

    def __init__(self, models: Sequence[str]) -> None:
        self._models = list(models)
        self._servers: dict[str, McpPrompts] = {}

    def offer(self, prompts: McpPrompts) -> bool:
        """A server's prompts now; True if the set changed."""
        before = self._servers.get(prompts.server)
        if prompts.prompts:
            self._servers[prompts.server] = prompts
        else:
            self._servers.pop(prompts.server, None)
        return (before.prompts if before else []) != prompts.prompts

    def update(self) -> AvailableCommandsUpdate:
        modes = " | ".join(MODES)
        commands = [
            AvailableCommand(
                COMPACT, "Compact the conversation now", CommandInput("optional instructions")
            ),
            AvailableCommand(MODE, "Switch the session's mode", CommandInput(modes)),
            AvailableCommand(
                MODEL,
                "Switch the session's model",
                CommandInput(_bounded(" | ".join(self._models))),
            ),
        ]
        for server, offered in self._servers.items():
            for prompt in offered.prompts:
                commands.append(
                    AvailableCommand(
                        f"{server}:{prompt.name}",
                        _bounded(prompt.description or f"The {prompt.name} prompt of {server}"),
                        CommandInput(_bounded(hint(prompt))) if prompt.arguments else None,
                    )
                )
        return AvailableCommandsUpdate(commands)

    def parse(self, text: str) -> Command | None:
        """The command `text` runs, if its first word is a known one."""
        if not text.startswith("/"):
            return None
        word, _, rest = text[1:].partition(" ")
        word = word.strip()
        if word in (COMPACT, MODE, MODEL):
            return Command(word, rest.strip())
        server, colon, name = word.partition(":")
        offered = self._servers.get(server)
        if colon and offered is not None and any(p.name == name for p in offered.prompts):
            return Command(word, rest.strip())
        return None

    def prompt(self, name: str) -> tuple[McpPrompts, McpPrompt]:
        """The server and prompt of a ``server:prompt`` command `parse` gave."""
        server, _, prompt = name.partition(":")
        offered = self._servers[server]
        return offered, next(p for p in offered.prompts if p.name == prompt)


def hint(prompt: McpPrompt) -> str:
    """A prompt's arguments as the input hint: ``name=...`` each, optional ones bracketed."""
    return " ".join(f"{a.name}=..." if a.required else f"[{a.name}=...]" for a in prompt.arguments)


def arguments(prompt: McpPrompt, rest: str) -> dict[str, str]:
    """The arguments a command's text gives its prompt: ``name=value`` words (quoted as a
    shell would), or, with none, the whole text as its first argument. Raises `ValueError`
    naming an unknown or missing argument."""
    known = {a.name for a in prompt.arguments}
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise ValueError(f"cannot read the arguments: {exc}") from None
    given: dict[str, str] = {}
    if words and all("=" in w for w in words):
        for word in words:
            key, _, value = word.partition("=")
            if key not in known:
                raise ValueError(f"unknown argument {key!r} (known: {', '.join(known) or 'none'})")
            given[key] = value
    elif rest.strip() and prompt.arguments:
        given[prompt.arguments[0].name] = rest.strip()
    missing = [a.name for a in prompt.arguments if a.required and a.name not in given]
    if missing:
        raise ValueError(f"missing argument(s): {', '.join(missing)}")
    return given


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
