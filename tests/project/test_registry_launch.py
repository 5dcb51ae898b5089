"""The ACP registry's entry (registry/greenroom/agent.json) and the launch the registry makes
of it: ``uvx --from dist/greenroom-*.whl greenroom ARGS``, from a wheel built here.

The entry is checked against the registry's documented rules (its ``agent.schema.json``: the
fields it requires, the id and version forms, a ``uvx`` distribution of a package and its
arguments); the launch answers ``initialize`` with a terminal login whose arguments stand in
for the entry's, as the registry's own check of an agent asks, each answer read by the
official ACP SDK's schema types.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from acp import schema

from tests import ROOT
from tests.acp_process import acp_process

pytestmark = pytest.mark.real_clock

ENTRY = ROOT / "registry" / "greenroom" / "agent.json"
UV = Path(sys.executable).with_name("uv")
UVX = Path(sys.executable).with_name("uvx")
LIMIT = 60  # seconds: a first launch installs greenroom's dependencies into uv's cache

#: The registry's rules for an entry, as its agent.schema.json states them (the members
#: greenroom's entry uses; a misspelt one fails).
RULES: dict[str, Any] = {
    "type": "object",
    "required": ["id", "name", "version", "description", "distribution"],
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"},
        "name": {"type": "string", "minLength": 1},
        "version": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+"},
        "description": {"type": "string", "minLength": 1},
        "license": {"type": "string"},
        "distribution": {
            "type": "object",
            "properties": {
                "uvx": {
                    "type": "object",
                    "required": ["package"],
                    "properties": {
                        "package": {"type": "string", "minLength": 1},
                        "args": {"type": "array", "items": {"type": "string"}},
                        "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    "additionalProperties": False,
                }
            },
            "required": ["uvx"],
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}


def _entry() -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(ENTRY.read_text())
    return entry


def test_the_entry_follows_the_registry_rules_and_the_package() -> None:
    entry = _entry()
    jsonschema.validate(entry, RULES)
    assert ENTRY.parent.name == entry["id"]  # the registry's directory is the id
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert entry["version"] == project["version"]
    assert entry["distribution"]["uvx"]["package"] == f"{project['name']}=={project['version']}"
    assert project["scripts"]["greenroom"] == "greenroom.cli:main"
    assert entry["distribution"]["uvx"]["args"][0] == "acp"


async def test_the_registry_launch_of_a_built_wheel(tmp_path: Path) -> None:
    entry = _entry()
    dist = tmp_path / "dist"
    with trio.fail_after(LIMIT):
        built = await trio.run_process(
            [str(UV), "build", "--wheel", "--out-dir", str(dist), str(ROOT)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert built.returncode == 0, built.stderr.decode(errors="replace")[-2000:]
        [wheel] = dist.glob("greenroom-*.whl")
        launch = (str(UVX), "--from", str(wheel), "greenroom")
        args = entry["distribution"]["uvx"]["args"]
        env = {k: "" for k in os.environ if k.endswith("_API_KEY")}
        async with acp_process(
            tmp_path / "home", *args[1:], env=env, cwd=tmp_path, greenroom=launch
        ) as peer:
            [init] = [f for f in peer.frames if f.get("id") == 1]
            answer = schema.InitializeResponse.model_validate(init["result"])
            assert answer.agent_info is not None
            assert answer.agent_info.name == "greenroom"
            [method] = answer.auth_methods
            assert isinstance(method, schema.TerminalAuthMethod)
            # The registry runs the method's args in place of the entry's.
            assert method.args == ["acp", "--login", *args[1:]]
            assert answer.agent_capabilities.auth.logout is not None
            # No key yet: a new session asks for the login.
            refused = await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            assert refused["error"]["code"] == -32000
            assert "ANTHROPIC_API_KEY" in refused["error"]["message"]
            assert await peer.close() == 0
