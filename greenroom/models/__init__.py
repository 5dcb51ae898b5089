"""Model adapters: the `ModelAdapter` seam, the scripted model (the embedded default), and
the price table a step's cost is reckoned by (`Prices`)."""

from greenroom.models.base import ModelAdapter, ModelError
from greenroom.models.prices import Price, PriceFileError, Prices, shipped_prices
from greenroom.models.scripted import (
    CallTool,
    End,
    Fail,
    Hang,
    Say,
    ScriptedModel,
    Think,
    Tokens,
    Wait,
)

__all__ = [
    "CallTool",
    "End",
    "Fail",
    "Hang",
    "ModelAdapter",
    "ModelError",
    "Price",
    "PriceFileError",
    "Prices",
    "Say",
    "ScriptedModel",
    "Think",
    "Tokens",
    "Wait",
    "shipped_prices",
]
