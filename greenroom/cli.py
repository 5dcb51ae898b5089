"""The ``greenroom`` command (floor 8): its options, the state directory and the stores.

``--model KIND:MODEL`` (`greenroom.models.named`), ``--prices FILE`` (a price file's rows
over the shipped table), ``--store`` URLs (`store_from_url`, read-only for the reading
commands; ``decide`` writes only beside the logs). A model whose API key is missing is
served as `Unkeyed`: each step fails naming the variable.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from greenroom.acp.frames import MAX_FRAME, MIN_FRAME
from greenroom.actors.decisions import decide_stored, stored_decisions
from greenroom.actors.types import TITLES
from greenroom.keys import KeyFileError, greenroom_home, store_key
from greenroom.models import ModelAdapter
from greenroom.models.base import ModelError
from greenroom.models.named import API_KINDS, MissingKey, key_variable, model_named
from greenroom.models.prices import PriceFileError, Prices, shipped_prices
from greenroom.protocol.content import referenced
from greenroom.protocol.events import DecisionRequested, UserMessage
from greenroom.protocol.model import ModelRequest, StreamChunk
from greenroom.session.persistence import (
    INTERRUPTIONS,
    LEASE_TTL,
    SYNC_POLICIES,
    JsonlPersistence,
    Persistence,
    PersistenceError,
)
from greenroom.session.persistence.urls import (
    StateDirError,
    StoreError,
    safe_url,
    store_from_url,
    usable_state_dir,
)
from greenroom.session.transcript import describe_decision, session_tree, transcript

#: Who answered, in the log, a decision answered by ``greenroom sessions decide``.
CLI = "greenroom sessions decide"


def default_state_dir() -> Path:
    """``$GREENROOM_HOME``, else ``~/.local/state/greenroom`` (`greenroom.keys.greenroom_home`)."""
    return greenroom_home()


class Unkeyed:
    """Stands in for a model whose key is missing: every step fails with `reason`.

    ``greenroom acp`` serves without the key, so the editor can offer its login
    (`greenroom.acp.login`: a new session on the default model is refused -32000
    until then) instead of "connection closed"; a session on another model has
    each prompt refused with the reason (the turn's error, -32603).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        await trio.lowlevel.checkpoint()
        raise ModelError(self.reason, "no-api-key")
        yield  # an async generator, as the seam streams


def sessions_root(state_dir: Path) -> Path:
    return state_dir / "sessions"


def demo_state_dir() -> Path:
    """Where ``greenroom demo`` keeps its state unless told: its own corner of the state dir."""
    return default_state_dir() / "demo"


def _add_store(
    parser: argparse.ArgumentParser, default: str, *, from_env: bool = True, nested: bool = False
) -> None:
    if nested:  # given after a subcommand too: it must not reset what the outer parser read
        start: object = argparse.SUPPRESS
    else:
        start = os.environ.get("GREENROOM_STORE") if from_env else None
    where = "$GREENROOM_STORE, else " if from_env else ""
    parser.add_argument(
        "--store",
        default=start,
        help="where sessions live: jsonl:DIR, sqlite:PATH or postgresql://..."
        f" (default: {where}{default})",
    )


def _add_state_dir(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        # Given after a subcommand too: a nested parser must not reset what the outer one read.
        default=argparse.SUPPRESS if nested else None,
        help="greenroom's state (default: $GREENROOM_HOME, else ~/.local/state/greenroom)",
    )


def _add_agent_options(acp: argparse.ArgumentParser) -> None:
    """The options `acp` and `serve` share: the models, prices, store and sync."""
    acp.add_argument(
        "--model",
        action="append",
        help="scripted (echo, 20 ms a word; the default), scripted:SECONDS, openai:MODEL"
        " (Chat Completions), openai-responses:MODEL (the Responses API), anthropic:MODEL,"
        " gemini:MODEL or deepseek:MODEL, each with its KIND_API_KEY and KIND_BASE_URL"
        " (OPENAI_ for both openai kinds); give it more than once to offer the editor a"
        " choice (the first is the default)",
    )
    acp.add_argument(
        "--context-window",
        type=int,
        metavar="TOKENS",
        help="the tokens an API model holds (default: its family's, else 128000); a local"
        " OpenAI-compatible server's model usually needs it",
    )
    acp.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="a price table (TOML, USD per million tokens) whose rows go over the shipped"
        " ones; a model no row prices has an unknown cost",
    )
    acp.add_argument(
        "--sync",
        choices=SYNC_POLICIES,
        default="turn",
        help="when sessions are fsynced: turn (once per turn, off the agent's path; the"
        " default), always (before a turn's end is reported) or os (never)",
    )
    acp.add_argument(
        "--lease-ttl",
        type=float,
        default=LEASE_TTL,
        help="PostgreSQL: seconds a paused node keeps its sessions before another may take"
        f" them over (default {LEASE_TTL:g})",
    )
    acp.add_argument(
        "--interrupted",
        choices=INTERRUPTIONS,
        default="close",
        help="what loading a session does with a turn a crash cut: close it interrupted"
        " (the default) or continue it where its log stops",
    )
    acp.add_argument(
        "--titles",
        choices=TITLES,
        default="prompt",
        help="how a session's title is written: the first line of its first prompt (the"
        " default), or, with model, by the session's model after its first turn (one short"
        " call, counted in its usage); a client that takes boolean config options may"
        " switch it per session",
    )
    acp.add_argument(
        "--keep-busy",
        action="store_true",
        help="PostgreSQL: refuse another node's request for a session that is mid-turn"
        " (by default it is let go after its turn; an idle one at once)",
    )
    _add_state_dir(acp)
    _add_store(acp, "jsonl:STATE-DIR/sessions")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="greenroom", description="An actor runtime for AI agents on Trio."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="tell the greenroom story on embedded defaults")
    demo.add_argument("--plain", action="store_true", help="plain lines instead of a live view")
    demo.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="keep the sessions here (default: $GREENROOM_HOME/demo, emptied at each run)",
    )
    # Not from $GREENROOM_STORE: the demo keeps to its own sessions unless told otherwise.
    _add_store(demo, "jsonl under the state dir", from_env=False)
    acp = commands.add_parser("acp", help="serve the Agent Client Protocol on stdin/stdout")
    acp.add_argument(
        "--login",
        action="store_true",
        help="ask in this terminal for the key of each API --model (with none, of a"
        " provider asked for), keep it in $GREENROOM_HOME/keys.json (mode 0600), and"
        " exit; a key in the environment still comes first",
    )
    _add_agent_options(acp)
    network = commands.add_parser(
        "serve", help="serve the Agent Client Protocol over WebSocket and HTTP at /acp"
    )
    network.add_argument(
        "--listen",
        required=True,
        metavar="HOST:PORT",
        help="where to listen (port 0: any free port; the address is said on stderr)",
    )
    network.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help="who may connect: one 'PRINCIPAL TOKEN' per line, 'admin' after the token for"
        " an admin (mode 0600); each sees only its own sessions. Without it, loopback only",
    )
    network.add_argument(
        "--max-connections",
        type=int,
        default=64,
        metavar="N",
        help="open connections per principal (default 64)",
    )
    network.add_argument(
        "--max-sessions",
        type=int,
        default=256,
        metavar="N",
        help="sessions a principal holds open at once (default 256)",
    )
    network.add_argument(
        "--max-rate",
        type=float,
        default=200.0,
        metavar="PER_SECOND",
        help="messages per second per connection (default 200)",
    )
    network.add_argument(
        "--max-frame",
        type=int,
        default=MAX_FRAME,
        metavar="BYTES",
        help=f"bytes of one frame, a WebSocket message or a POST body (default {MAX_FRAME:,})",
    )
    network.add_argument("--cert", type=Path, metavar="FILE", help="TLS: the certificate chain")
    network.add_argument("--key", type=Path, metavar="FILE", help="TLS: the certificate's key")
    _add_agent_options(network)
    sessions = commands.add_parser("sessions", help="list stored sessions or show one")
    _add_state_dir(sessions)
    _add_store(sessions, "jsonl:STATE-DIR/sessions")
    verbs = sessions.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="one line per stored session")
    _add_state_dir(listing, nested=True)
    _add_store(listing, "jsonl:STATE-DIR/sessions", nested=True)
    show = verbs.add_parser("show", help="the transcript of one session")
    show.add_argument("session_id")
    _add_state_dir(show, nested=True)
    _add_store(show, "jsonl:STATE-DIR/sessions", nested=True)
    decisions = verbs.add_parser(
        "decisions", help="the open decisions of every stored session, one per line"
    )
    _add_state_dir(decisions, nested=True)
    _add_store(decisions, "jsonl:STATE-DIR/sessions", nested=True)
    decide = verbs.add_parser(
        "decide",
        help="answer an open decision of a stored session: its next holder carries the"
        " parked turn on",
    )
    decide.add_argument("session_id")
    decide.add_argument("decision_id")
    decide.add_argument(
        "answer", help="a permission's option (allow_once, ...) or a question's answer"
    )
    _add_state_dir(decide, nested=True)
    _add_store(decide, "jsonl:STATE-DIR/sessions", nested=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from greenroom.demo import run_demo

            fresh = args.state_dir is None
            state = usable_state_dir(args.state_dir or demo_state_dir(), create=True)
            store = store_from_url(args.store) if args.store else None
            return run_demo(plain=args.plain, state_dir=state, fresh=fresh, store=store)
        if args.command in ("acp", "serve"):
            specs = args.model or ["scripted"]
            if args.command == "acp" and args.login:
                return _login(specs)
            models: dict[str, ModelAdapter] = {}
            waiting: dict[str, str] = {}
            stored: list[str] = []
            if args.context_window is not None and args.context_window <= 0:
                parser.error(f"--context-window must be tokens > 0, got {args.context_window}")
            for spec in specs:
                try:
                    models[spec] = model_named(spec, os.environ, args.context_window)
                except (MissingKey, KeyFileError) as exc:  # told to the editor, not an exit
                    print(f"greenroom {args.command}: {exc}", file=sys.stderr)
                    waiting[spec] = str(exc)
                    models[spec] = Unkeyed(str(exc))
                except ValueError as exc:
                    parser.error(str(exc))
                else:
                    variable = key_variable(spec)
                    if variable is not None and not os.environ.get(variable):
                        stored.append(spec)
            prices = None
            if args.prices is not None:
                try:
                    prices = shipped_prices() | Prices.read(args.prices)
                except PriceFileError as exc:
                    parser.error(str(exc))
            if args.store:
                store = store_from_url(
                    args.store, sync=args.sync, lease_ttl=args.lease_ttl, keep_busy=args.keep_busy
                )
            else:
                state = usable_state_dir(args.state_dir or default_state_dir(), create=True)
                store = JsonlPersistence(sessions_root(state), sync=args.sync)
            if args.command == "serve":
                from greenroom.acp.access import AccessTokens, TokensError
                from greenroom.acp.network import ServeLimits
                from greenroom.acp.serve import check_listen, run_serve

                if min(args.max_connections, args.max_sessions) < 1 or not args.max_rate > 0:
                    parser.error("--max-connections, --max-sessions and --max-rate must be > 0")
                if args.max_frame < MIN_FRAME:
                    parser.error(f"--max-frame must be at least {MIN_FRAME:,} bytes")

                if (args.cert is None) != (args.key is None):
                    parser.error("--cert and --key go together: TLS needs both")
                try:
                    tokens = None if args.tokens is None else AccessTokens.read(args.tokens)
                    check_listen(args.listen, tokens)
                except (TokensError, ValueError) as exc:
                    parser.error(str(exc))
                return run_serve(
                    models,
                    store,
                    args.listen,
                    tokens=tokens,
                    cert=args.cert,
                    key=args.key,
                    interrupted=args.interrupted,
                    titles=args.titles,
                    prices=prices,
                    limits=ServeLimits(
                        connections=args.max_connections,
                        sessions=args.max_sessions,
                        rate=args.max_rate,
                        frame=args.max_frame,
                    ),
                )
            from greenroom.acp.login import Login
            from greenroom.acp.stdio import run_stdio

            login = Login(specs, waiting, stored)
            return run_stdio(models, store, args.interrupted, prices, login, args.titles)
        if args.store:  # only `decide` writes, and only beside the logs
            store = store_from_url(args.store, read_only=args.verb != "decide")
            return _sessions(args.verb, args, store, None)
        if args.state_dir is None:  # the default: none yet is no sessions yet, not an error
            state = default_state_dir()
            if not state.exists():
                return _none_yet(args, state)
            state = usable_state_dir(state, create=False, named="the state directory")
        else:
            state = usable_state_dir(args.state_dir, create=False)
        return _sessions(args.verb, args, JsonlPersistence(sessions_root(state)), state)
    except (StateDirError, StoreError) as exc:
        print(f"greenroom {args.command}: {exc}", file=sys.stderr)
        return 2


def _login(specs: list[str]) -> int:
    """``greenroom acp --login``: ask for the key of each API model of `specs` (of a provider
    asked for, when none is one), without echo, and store it (`greenroom.keys.store_key`).
    Exit 0 once every key asked is kept; 1 if one could not be (said why); 2 without a
    terminal to ask in."""
    if not sys.stdin.isatty():
        print(
            "greenroom acp --login: asks for the key in a terminal: stdin is not one",
            file=sys.stderr,
        )
        return 2
    variables = list(dict.fromkeys(v for spec in specs if (v := key_variable(spec))))
    try:
        if not variables:
            providers = list(dict.fromkeys(API_KINDS.values()))
            known = ", ".join(p.lower() for p in providers)
            answer = input(f"Provider ({known}): ").strip().upper()
            if answer not in providers:
                print(
                    f"greenroom acp --login: no provider {answer.lower()!r} (known: {known})",
                    file=sys.stderr,
                )
                return 1
            variables = [f"{answer}_API_KEY"]
        for variable in variables:
            key = getpass.getpass(f"{variable} (not shown as you type): ")
            try:
                path = store_key(variable, key)
            except (ValueError, OSError) as exc:  # KeyFileError too: the file stays as it is
                print(f"greenroom acp --login: {variable}: {exc}", file=sys.stderr)
                return 1
            print(f"{variable} kept in {path}, readable by you only", file=sys.stderr)
    except (EOFError, KeyboardInterrupt):
        print("\ngreenroom acp --login: cancelled; no key was kept but those said", file=sys.stderr)
        return 1
    return 0


def _none_yet(args: argparse.Namespace, state_dir: Path) -> int:
    """``sessions`` before anything made the default state directory: there are no sessions
    yet (`list` and `decisions` say so and succeed; `show` and `decide` find none)."""
    why = f"no sessions yet ({state_dir} does not exist)"
    if args.verb in ("list", "decisions"):
        print(why, file=sys.stderr)
        return 0
    print(f"greenroom sessions: no stored session {args.session_id!r}: {why}", file=sys.stderr)
    return 1


def _sessions(
    verb: str, args: argparse.Namespace, store: Persistence, state_dir: Path | None
) -> int:
    try:
        if verb == "list":
            stored = trio.run(store.list)
            for line in session_tree(stored):
                print(line)
            if not stored:
                where = store.root if isinstance(store, JsonlPersistence) else safe_url(args.store)
                print(f"no sessions in {where}", file=sys.stderr)
                demo = sessions_root(demo_state_dir())
                if state_dir is not None and demo.is_dir() and state_dir != demo_state_dir():
                    from greenroom.demo import command

                    print(
                        f"greenroom demo keeps its sessions in {demo}:"
                        f" {command()} sessions list --state-dir {demo.parent}",
                        file=sys.stderr,
                    )
        elif verb == "decisions":
            for found in trio.run(stored_decisions, store, set()):
                print(
                    f"{found.session_id} {found.request.decision_id}: "
                    f"{describe_decision(found.request)}"
                )
        elif verb == "decide":
            trio.run(decide_stored, store, args.session_id, args.decision_id, args.answer, CLI)
            print(
                f"decision {args.decision_id} of {args.session_id}: {args.answer!r}, kept"
                " beside the log; the session's next holder carries its turn on"
            )
        else:
            header, events = trio.run(store.load, args.session_id)
            digests = [d for e in events if type(e) is UserMessage for d in referenced(e.parts)]
            held = trio.run(store.read_blobs, args.session_id, digests) if digests else {}
            parked = any(type(e) is DecisionRequested for e in events)
            kept = trio.run(store.read_answers, args.session_id) if parked else {}
            for line in transcript(header, events, held, kept):
                print(line)
    except (PersistenceError, ValueError) as exc:
        print(f"greenroom sessions: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `| head` read enough: say nothing more, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
