"""Who may reach ``greenroom serve``, and which sessions each may see.

* **Tokens** (`AccessTokens.read`, ``--tokens FILE``): one ``PRINCIPAL TOKEN`` per
  line, ``admin`` after the token for an admin; blank lines and ``#`` comments
  are skipped. The file must be its owner's alone (no group or other
  permission bits: mode 0600 or stricter) and every name and token unique,
  each token at least `MIN_TOKEN` characters of printable ASCII; anything
  else is refused at start, naming the line. A request carries its token as ``Authorization:
  Bearer TOKEN``; tokens are looked up by their SHA-256, never compared as
  text.
* **Sessions** (`Principal.sees`): a session records the principal that made
  it (`SessionHeader.principal`); a principal sees its own sessions, an admin
  every session, and no one else a session with an owner other than theirs or
  with none. Without tokens there is no principal (None): every session is
  seen, as over stdio.
* **Without tokens** the server listens on loopback only (`loopback_host`, checked at
  start) and a request is served only if its ``Host`` names a loopback host
  and its ``Origin``, if it has one, does too (`local_request`): a page in a
  browser, even one whose name was rebound to 127.0.0.1, cannot reach it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import stat
import urllib.parse
from pathlib import Path
from typing import Final, NamedTuple

__all__ = [
    "MIN_TOKEN",
    "Principal",
    "AccessTokens",
    "TokensError",
    "local_request",
    "loopback_host",
]

#: The fewest characters a token may have.
MIN_TOKEN: Final = 16


class TokensError(ValueError):
    """A tokens file that cannot be used, and why."""


class Principal(NamedTuple):
    """Who a token names."""

    name: str
    admin: bool = False

    def sees(self, owner: str | None) -> bool:
        """Whether this principal may see a session owned by `owner` (None: no owner)."""
        return self.admin or (owner is not None and owner == self.name)


class AccessTokens:
    """The principals of a tokens file, by their token's SHA-256."""

    __slots__ = ("_by_digest",)

    def __init__(self, principals: dict[bytes, Principal]) -> None:
        self._by_digest = principals

    @classmethod
    def read(cls, path: Path) -> AccessTokens:
        """Read `path` (see the module docstring); `TokensError` names what is wrong."""
        try:
            mode = os.stat(path).st_mode
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokensError(f"cannot read the tokens file {str(path)!r}: {exc}") from None
        if stat.S_IMODE(mode) & 0o077:
            raise TokensError(
                f"the tokens file {str(path)!r} has mode {stat.S_IMODE(mode):04o}: it must be"
                " readable by its owner only (chmod 600)"
            )
        principals: dict[bytes, Principal] = {}
        names: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{str(path)!r} line {number}"
            if len(words) not in (2, 3) or (len(words) == 3 and words[2] != "admin"):
                raise TokensError(f"{where}: expected 'PRINCIPAL TOKEN' or 'PRINCIPAL TOKEN admin'")
            name, token = words[0], words[1]
            if len(token) < MIN_TOKEN:
                raise TokensError(f"{where}: a token needs at least {MIN_TOKEN} characters")
            if not (token.isascii() and token.isprintable()):
                # A header is read as Latin-1, this file as UTF-8: another would never match.
                raise TokensError(f"{where}: a token is printable ASCII (as a bearer token is)")
            digest = _digest(token)
            if name in names:
                raise TokensError(f"{where}: principal {name!r} is named twice")
            if digest in principals:
                raise TokensError(f"{where}: this token is given twice")
            names.add(name)
            principals[digest] = Principal(name, admin=len(words) == 3)
        if not principals:
            raise TokensError(f"the tokens file {str(path)!r} names no principal")
        return cls(principals)

    def principal(self, authorization: str) -> Principal | None:
        """Who an ``Authorization`` header's bearer token names; None for any other header."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip(" \t")  # the spaces HTTP allows, never any other
        if scheme.lower() != "bearer" or not token:
            return None
        return self._by_digest.get(_digest(token))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def loopback_host(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine
    only: ``localhost`` or a loopback address."""
    host = host.strip().removeprefix("[").removesuffix("]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_request(host: str, origin: str) -> str | None:
    """None if a request's ``Host`` and ``Origin`` (empty: none sent) are both loopback;
    else why it is refused. Each must be only what its header holds (``HOST[:PORT]``,
    ``SCHEME://HOST[:PORT]``): a user part or a path is refused, not read past."""
    name = _hostname(f"//{host}") if host else None
    if name is None or not loopback_host(name):
        return f"Host {host[:100]!r} is not this machine's loopback name"
    if origin:
        name = _hostname(origin)
        if name is None or not loopback_host(name):
            return f"Origin {origin[:100]!r} is not this machine's loopback"
    return None


def _hostname(url: str) -> str | None:
    """The host `url` names, None if it is no URL (an unclosed or bad ``[...]``, a port that
    is no number) or holds more than a scheme, host and port."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a port that is no number raises
    except ValueError:
        return None
    if "@" in parts.netloc or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname
