"""The process the decision tests park, kill, answer from, and resume in.

Usage: ``python decisions_child.py VERB BACKEND TARGET RUNS [ARGS...]`` (for postgres,
TARGET is the DSN). Session ``s``'s agent asks permission for ``deploy`` (which
appends ``deploy`` to the file ``RUNS`` when it runs) under a `Defer` policy.

* ``park``: creates the session and prompts it; prints ``parked DECISION_ID`` once the
  turn waits, then waits for the prompt's answer (the parent kills it, or answers from
  another node) and prints ``answer STOP TEXT``.
* ``decide DECISION ANSWER BY``: answers through a runtime of its own, live or stored;
  prints ``kept`` or ``refused MESSAGE``.
* ``resume [ANSWER]``: resumes the session; with ANSWER, waits until the turn asks again
  (``asked DECISION_ID``) and answers it; prints ``answer STOP TEXT``, ``requests N`` (the
  model requests of this life) and ``made BY`` for each answer logged.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from greenroom import AgentOptions, open_runtime, tool
from greenroom.actors.decisions import DecisionRefused
from greenroom.actors.types import Defer
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import DecisionMade
from tests.durable_child import store_of

DEFER = AgentOptions(permissions=Defer())


def deploy_in(runs: Path) -> object:
    @tool(kind="execute")
    def deploy(target: str) -> str:
        """Deploy to a target.

        Args:
            target: Where to.
        """
        with runs.open("a") as file:
            file.write("deploy\n")
        return f"deployed to {target}"

    return deploy


async def main(verb: str, backend: str, target: str, runs: str, *args: str) -> None:
    store = store_of(backend, target)
    tools = [deploy_in(Path(runs))]
    if verb == "park":
        model = ScriptedModel([[CallTool("deploy", {"target": "prod"})], [Say("deployed")]])
        async with open_runtime(model=model, persistence=store, tools=tools) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", options=DEFER)
            prompt = handle.agent.send("ship it")
            while not prompt.pending:
                await trio.sleep(0.01)
            print(f"parked {prompt.pending[0].decision_id}", flush=True)
            answer = await prompt
            print(f"answer {answer.stop_reason} {answer.text}", flush=True)
            print(f"requests {len(model.requests)}", flush=True)
    elif verb == "decide":
        decision, answer, by = args
        async with open_runtime(persistence=store) as rt:
            try:
                await rt.decide("s", decision, answer, by=by)
            except DecisionRefused as refused:
                print(f"refused {refused}", flush=True)
            else:
                print("kept", flush=True)
    else:
        model = ScriptedModel([[Say("deployed")]])
        async with open_runtime(model=model, persistence=store, tools=tools) as rt:
            handle = await rt.agents.resume(agent_id="a", session_id="s", options=DEFER)
            resumed = handle.resumed
            assert resumed is not None, "no parked turn to carry on"
            if args:
                while not resumed.pending:
                    await trio.sleep(0.01)
                (asked,) = resumed.pending
                print(f"asked {asked.decision_id}", flush=True)
                handle.agent.decide(asked.decision_id, args[0], by="resumer")
            answer = await resumed
            print(f"answer {answer.stop_reason} {answer.text}", flush=True)
            print(f"requests {len(model.requests)}", flush=True)
            for event in handle.agent.session.events:
                if isinstance(event, DecisionMade):
                    print(f"made {event.by}", flush=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:])
