"""The keys ``greenroom acp`` runs on, as the editor sees them: ``authMethods``,
``authenticate``, ``logout``, and a new session refused until its model has a key.

The one method is a terminal login (ACP's ``AuthMethodTerminal``): the editor runs
``greenroom acp --login`` with this process's ``--model``s in a terminal, which asks for
their keys and stores them (`greenroom.keys`), then starts greenroom again. Keys are
read when greenroom starts, so this process never takes up a key stored after it:
``authenticate`` only says whether it has what it needs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from greenroom.acp.params import RpcError
from greenroom.keys import KeyFileError, forget_keys
from greenroom.protocol.acp import (
    AUTH_REQUIRED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    TerminalAuthMethod,
)

__all__ = ["METHOD_ID", "Login"]

#: The id of the one method, the terminal login.
METHOD_ID = "login"


class Login:
    """Which models have no key, and why; which have the stored one.

    `models` are the ``--model``s served, the first the one a new session starts on;
    `waiting` maps each without a key to the reason (`greenroom.models.named.MissingKey`'s
    message, or the stored key file's fault); `stored` are those whose key came from the
    stored file. `method` is the terminal login: its ``args`` stand in for the registry
    entry's (``acp --model ...``), as the ACP registry runs them.
    """

    def __init__(
        self, models: Sequence[str], waiting: Mapping[str, str], stored: Collection[str]
    ) -> None:
        self._default = models[0]
        self._waiting = dict(waiting)
        self._stored = set(stored)
        self.method = TerminalAuthMethod(
            id=METHOD_ID,
            name="Provider key",
            description="Asks in a terminal for the model provider's API key and keeps it"
            " in a file only you can read",
            args=["acp", "--login", *(word for spec in models for word in ("--model", spec))],
        )

    def required(self) -> str | None:
        """Why a new session needs a login first (its model has no key); None if it does not."""
        return self._waiting.get(self._default)

    def refuse_unless_keyed(self) -> None:
        """Raise -32000 (auth required) when a new session needs a login first."""
        reason = self.required()
        if reason is not None:
            raise RpcError(
                AUTH_REQUIRED,
                f"authentication required: {reason}; log in with the {METHOD_ID!r} method"
                " (`greenroom acp --login` in a terminal), then start greenroom again",
            )

    def authenticate(self, method_id: str) -> None:
        """``authenticate``: returns when the default model has its key; raises -32602 for
        a method not advertised, -32000 when a login is still needed."""
        if method_id != METHOD_ID:
            raise RpcError(
                INVALID_PARAMS,
                f"invalid params: methodId {method_id!r} is not an advertised auth method"
                f" (the one method is {METHOD_ID!r})",
            )
        self.refuse_unless_keyed()

    def logout(self) -> None:
        """``logout``: the stored keys are forgotten (the file removed); the models keyed
        from it wait for a key again, so a new session on one is refused until a login.
        Sessions open now keep their model. A key from the environment stays: greenroom
        cannot unset it. Raises -32603 naming the file when it is not the user's own
        (`greenroom.keys.KeyFileError`): then nothing is removed."""
        try:
            forget_keys()
        except KeyFileError as exc:
            raise RpcError(INTERNAL_ERROR, f"logout failed: {exc}") from None
        for spec in self._stored:
            self._waiting[spec] = f"--model {spec!r}: logged out, its stored key forgotten"
        self._stored.clear()
