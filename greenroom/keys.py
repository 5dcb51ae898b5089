"""Provider keys kept for the user: the file ``greenroom acp --login`` writes.

The key of a provider is looked up in one order, for code and the command alike
(`api_key`): the key given (``api_key=``), else the environment
(``{PROVIDER}_API_KEY``), else this file. The file is ``keys.json`` in
greenroom's home (``$GREENROOM_HOME``, else ``~/.local/state/greenroom``): one
JSON object, each member a variable's name (``ANTHROPIC_API_KEY``) and its key.

It holds secrets, so it is used only while it is private to the user: a regular
file (no symbolic link), owned by the user, of mode 0600 (no bit for the group
or others). One that is not, or that does not hold such an object, is never
read, overwritten nor removed: `KeyFileError` names it, what is wrong, and the
way out. Writes make a new file beside it (mode 0600 from its creation, never
widened by the umask), synced, then renamed over it, so a reader sees the old
keys or the new ones, never a part.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

__all__ = [
    "KEYS_FILE",
    "KeyFileError",
    "api_key",
    "forget_keys",
    "greenroom_home",
    "key_file",
    "store_key",
    "stored_key",
]

#: The file's name in greenroom's home.
KEYS_FILE: Final = "keys.json"
#: The most bytes the file is read for: a few keys take a few hundred.
_MOST: Final = 64 * 1024
_keys = msgspec.json.Decoder(dict[str, str])
_encode = msgspec.json.Encoder().encode


class KeyFileError(ValueError):
    """The stored key file cannot be used: its message names the file, what is wrong, and
    what to do. Nothing was read from it, nor written to it."""


def greenroom_home() -> Path:
    """``$GREENROOM_HOME``, else ``~/.local/state/greenroom``: the state directory's default
    and the key file's directory."""
    home = os.environ.get("GREENROOM_HOME")
    return Path(home) if home else Path.home() / ".local" / "state" / "greenroom"


def key_file() -> Path:
    """Where the keys are kept (`KEYS_FILE` in `greenroom_home`)."""
    return greenroom_home() / KEYS_FILE


def api_key(
    variable: str, given: str | None = None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The key to use: `given`, else ``environ[variable]``, else the stored one; None when
    there is none. Raises `KeyFileError` only when the file is consulted (nothing given,
    nothing in the environment) and cannot be used."""
    return given or environ.get(variable) or stored_key(variable)


def stored_key(variable: str) -> str | None:
    """The key stored under `variable`, None without one (or without the file)."""
    return _read(key_file()).get(variable) or None


def store_key(variable: str, key: str) -> Path:
    """Keep `key` under `variable` (the other keys stay); returns the file. Raises
    `KeyFileError` if the file there now cannot be used (it is left as it is), `ValueError`
    for an empty key or one with a line break, and `OSError` if the home cannot be written."""
    if not key or not key.strip():
        raise ValueError("the key is empty: nothing was stored")
    if "\n" in key or "\r" in key:
        raise ValueError("a key is one line: nothing was stored")
    path = key_file()
    keys = _read(path)
    keys[variable] = key.strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = path.with_name(f".{KEYS_FILE}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        fresh.unlink()  # a write of this pid that died half-way
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_encode(keys))
            out.flush()
            os.fsync(out.fileno())
        os.replace(fresh, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fresh.unlink()
        raise
    return path


def forget_keys() -> bool:
    """Remove the stored keys (a logout); False when there were none. Raises `KeyFileError`
    for a file that is not the user's private one: it is left for the user to look at."""
    path = key_file()
    _read(path)  # the checks: only greenroom's own file is removed
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _read(path: Path) -> dict[str, str]:
    """The keys in `path` ({} without the file), checked as the module says."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a symbolic link (ELOOP), a directory we cannot open, ...
        if path.is_symlink():
            raise KeyFileError(
                f"the key file {path} is a symbolic link: greenroom reads only a file of"
                " its own; remove the link and run `greenroom acp --login`"
            ) from None
        raise KeyFileError(f"the key file {path} cannot be read: {exc.strerror}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise KeyFileError(f"the key file {path} is not a regular file")
        if status.st_uid != os.geteuid():
            raise KeyFileError(
                f"the key file {path} belongs to uid {status.st_uid}, not to you"
                f" (uid {os.geteuid()}): it is not used"
            )
        if status.st_mode & 0o077:
            raise KeyFileError(
                f"the key file {path} has mode {stat.S_IMODE(status.st_mode):04o}: others"
                " may read it, so it is not used (and the keys in it may be known);"
                f" check them, then `chmod 600 {path}`"
            )
        data = os.read(fd, _MOST + 1)
    finally:
        os.close(fd)
    if len(data) > _MOST:
        raise KeyFileError(f"the key file {path} is over {_MOST} bytes: not a key file")
    try:
        return _keys.decode(data)
    except msgspec.DecodeError as exc:
        raise KeyFileError(
            f"the key file {path} is not a JSON object of keys ({exc}); move it away and"
            " run `greenroom acp --login`"
        ) from None
