"""A throwaway PostgreSQL server for the suite: ``initdb`` into a temporary directory, then
``pg_ctl`` on a unix socket in that directory (no TCP port); stopped and removed afterwards.

As root the server runs as the unprivileged ``postgres`` user (``initdb`` and ``postgres``
refuse to run as root). `restart` stops and starts the same cluster, for tests of a server
going away under a live node.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

USER = "greenroom"


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(
            f"PostgreSQL's {name} is not installed: the suite needs a PostgreSQL server"
            " (.ci/run installs the Debian package postgresql)"
        )
    return found


class PgServer:
    """One cluster in a temporary directory; `dsn` reaches it through its socket."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="greenroom-pg-"))
        self.data = self.root / "data"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o755)
        self.dsn = f"postgresql://{USER}@/postgres?host={self.root}"

    def _run(self, *command: str) -> None:
        subprocess.run(
            [*self._as, *command], check=True, capture_output=True, timeout=120, cwd=self.root
        )

    def start(self) -> PgServer:
        if not self.data.exists():
            self._run(_binary("initdb"), "-D", str(self.data), "-A", "trust", "-U", USER)
        options = f"-k {self.root} -c listen_addresses='' -c fsync=on"
        log = str(self.root / "server.log")  # the server must not hold our pipes open
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        return self

    def stop(self) -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
