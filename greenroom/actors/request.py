"""`Requests`: what an agent's model is asked, built from the session's log alone, and
what its replies cost (`Requests.priced`, by the runtime's price table).
"""

from __future__ import annotations

from collections.abc import Mapping

from greenroom.actors.output import OutputTools
from greenroom.actors.types import AgentOptions, ToolExecutor
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.protocol.model import ModelRequest, Usage
from greenroom.session import Session


class Requests:
    """One agent's model requests: which of its models answers, what it is sent, and
    what its reply cost (`priced`, by the runtime's price table).

    Everything a request holds is read off the session's log (its history,
    its settings: the ``instructions`` setting is the system prompt when the
    log has one) or the agent's options, so a resumed session sends the same
    request as the life before it, and a provider's prompt cache holds.
    """

    __slots__ = ("_options", "_prices", "_session", "models")

    def __init__(
        self,
        session: Session,
        options: AgentOptions,
        models: Mapping[str, ModelAdapter],
        prices: Prices,
    ) -> None:
        self._session = session
        self._options = options
        #: The agent's models by id; the first is the default.
        self.models = models
        self._prices = prices

    @property
    def model_id(self) -> str:
        """The id of the model that answers the next step: the session's ``model`` setting
        when it names one of the agent's models, else the first."""
        chosen = self._session.config.get("model")
        if chosen is not None and chosen in self.models:
            return chosen
        return next(iter(self.models))

    @property
    def model_name(self) -> str | None:
        """The model name the agent's options ask its adapter for (None: the adapter's)."""
        return self._options.model

    def build(self, tools: ToolExecutor) -> ModelRequest:
        """The request of the next step, offering `tools`."""
        session = self._session
        return ModelRequest(
            messages=session.messages(),
            model=self._options.model,
            system=session.config.get("instructions") or self._options.system_prompt,
            tools=tools.schemas(),
            output=tools.output if isinstance(tools, OutputTools) else None,
            thought_level=session.config.get("thought_level"),
            blobs=session.blobs,
            session_id=session.id,
        )

    def priced(self, usage: Usage, request: ModelRequest, model: ModelAdapter) -> Usage:
        """`usage`, what `model` reported for `request`, with its cost: at the price of
        the model the request named, else of the adapter's own (its ``model_name``);
        unknown (None) when neither is named or the table prices neither."""
        name = request.model or getattr(model, "model_name", None)
        return self._prices.priced(usage, name)
