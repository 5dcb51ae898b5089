"""Greenroom's sandbox as ``nobody``: ``python sandbox_child.py WORK OUTSIDE DAEMON [CGROUP]``.

Started as root by `tests/sandbox/test_sandbox.py`, with this interpreter runnable by
``nobody``. With CGROUP (a cgroup v2 directory delegated to ``nobody``), it
moves itself there first; then it drops to ``nobody`` (uid and gid 65534, no
groups) and, as ``nobody``, runs three commands in a sandbox of WORK
(workspace write): one that writes OUTSIDE, one that kills this process and
then this process's keeper, and one that leaves a detached daemon (``setsid``,
an empty environment, not dumpable) whose command line names DAEMON and which
creates DAEMON once it runs. It prints one JSON object: the protections, each
command's exit code and error output, whether the daemon was still running
once its command had ended, and this process's and its keeper's pids.
"""

from __future__ import annotations

import json
import os
import sys

import msgspec
import trio

from greenroom.procs import owner
from greenroom.sandbox import Sandbox
from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import BashExecRequest

NOBODY = 65534


def alive(marker: str) -> bool:
    """Whether a live process, other than this one (whose arguments name it too), has
    `marker` among its arguments."""
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as file:
                    args = file.read().split(b"\0")
                with open(f"/proc/{name}/stat") as file:
                    state = file.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in args and state != "Z":
                return True
    return False


def daemonizing(marker: str) -> str:
    """A daemon no mark finds: detached, its environment empty, not dumpable."""
    script = (
        "import ctypes, sys, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0);"
        " open(sys.argv[1], 'w').close(); time.sleep(1000)"
    )
    return (
        f"setsid -f env -i {sys.executable} -c {script!r} {marker}; "
        f"until [ -e {marker} ]; do sleep 0.01; done"
    )


async def main(work: str, outside: str, marker: str) -> dict[str, object]:
    results: dict[str, object] = {"pid": os.getpid(), "uid": os.getuid()}
    async with LocalBashExecutor(work) as executor:
        sandbox = Sandbox("workspace-write", "nobody", (work,))

        async def run(command: str) -> tuple[int | None, str]:
            spec = executor.resolve(BashExecRequest(command=command, sandbox=sandbox))
            result = await executor.run(spec)
            return result.exit_code, result.stderr.text

        results["protections"] = msgspec.to_builtins(executor.sandboxes.protections)
        results["write"] = await run(f"echo escaped > {outside}")
        await run("true")  # the keeper starts at the first spawn
        keeper = _keeper()
        results["keeper"] = keeper
        results["kill"] = await run(f"kill -9 {os.getpid()}; kill -9 {keeper}")
        results["daemon"] = await run(daemonizing(marker))
        results["daemon_alive"] = alive(marker)
        await executor.end_session("nobody")
    return results


def _keeper() -> int:
    token = owner().token.encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as file:
                    args = file.read().split(b"\0")
            except OSError:
                continue
            if token in args and any(a.endswith(b"procs.py") for a in args):
                return int(name)
    raise RuntimeError("no keeper")


if __name__ == "__main__":
    work, outside, marker, *cgroup = sys.argv[1:]
    if cgroup:
        with open(f"{cgroup[0]}/cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    print(json.dumps(trio.run(main, work, outside, marker)), flush=True)
