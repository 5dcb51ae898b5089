"""What a model call costs: a price table, in USD per million tokens, by model name.

A `Price` row holds five figures (input, cached input, cache write, output, reasoning),
the date they were read (``as_of``) and where (``source``). A `Prices` table finds the
row of a model by its name or its family's (`Prices.find`) and prices a call's `Usage`
exactly, in `Decimal` (`Prices.priced`). A model no row prices has an unknown cost
(None), never a zero one.

greenroom ships a table of the known families (`shipped_prices`: ``prices.toml`` beside
this module, read once); figures change, so each row says when and where it was read. An
embedder gives `greenroom.open_runtime` its own (``prices=``): a table of its own, or its
rows over the shipped ones (``shipped_prices() | Prices.read(path)``); the command line
reads a file over the shipped table (``--prices FILE``). A file is TOML, one table per
row, named by the model or family it prices::

    ["gpt-4o"]
    input = 2.50
    cached_input = 1.25
    cache_write = 2.50
    output = 10.00
    reasoning = 10.00
    as_of = 2025-08-07
    source = "https://openai.com/api/pricing/"

Its figures are read as decimals (``2.50`` is exactly 2.50); a file that is not TOML, or
a row with a missing, unknown, negative or non-numeric figure, is refused whole
(`PriceFileError`, naming the file and the row).
"""

from __future__ import annotations

import datetime
import functools
import importlib.resources
import os
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Final

import msgspec

from greenroom.protocol.model import Usage

#: The figures are USD per this many tokens.
PER_TOKENS: Final = Decimal(1_000_000)

#: A row's figures, in the order a file lists them.
FIGURES: Final = ("input", "cached_input", "cache_write", "output", "reasoning")


class PriceFileError(ValueError):
    """A price file that cannot be used: unreadable, not TOML, or a bad row (named)."""


class Price(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One model's (or family's) prices, in USD per million tokens: ``input`` for the
    prompt's tokens read neither from nor into the provider's cache, ``cached_input`` for
    those read from it, ``cache_write`` for those written to it, ``output`` for the reply's
    tokens other than its thinking, ``reasoning`` for its thinking (most providers bill it
    as output: the same figure). ``as_of`` is the date the figures were read from
    ``source`` (a URL, or whoever agreed them).

    Each figure is a finite `Decimal` >= 0 (0: free, a known price); ``source`` is not
    empty. Anything else is a `ValueError` naming the field."""

    input: Decimal
    cached_input: Decimal
    cache_write: Decimal
    output: Decimal
    reasoning: Decimal
    as_of: datetime.date
    source: str

    def __post_init__(self) -> None:
        for name in FIGURES:
            value = getattr(self, name)
            if type(value) is not Decimal or not value.is_finite() or value < 0:
                raise ValueError(
                    f"{name} must be a finite Decimal >= 0 (USD per million tokens), got {value!r}"
                )
        if type(self.as_of) is not datetime.date:
            raise ValueError(f"as_of must be a date, got {self.as_of!r}")
        if type(self.source) is not str or not self.source.strip():
            raise ValueError("source must say where the figures were read")

    def cost(self, usage: Usage) -> Decimal:
        """What `usage` costs at these prices, in USD, exact. The input's cache reads and
        writes and the output's reasoning are priced as such, the rest of each at
        ``input`` and ``output`` (a count a provider reports past its whole is taken as
        all of it, never as a negative rest)."""
        read, written, thought = (
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            usage.reasoning_tokens,
        )
        return (
            max(usage.input_tokens - read - written, 0) * self.input
            + read * self.cached_input
            + written * self.cache_write
            + max(usage.output_tokens - thought, 0) * self.output
            + thought * self.reasoning
        ) / PER_TOKENS


def _continues(model: str, at: int) -> bool:
    """Whether `model` ends at `at`, or goes on there past a separator (not a letter, a
    digit or a dot): ``gpt-4o`` prices ``gpt-4o-2024-08-06``, ``gpt-5`` not ``gpt-5.4``."""
    if at == len(model):
        return True
    following = model[at]
    return not (following.isalnum() or following == ".")


class Prices:
    """A price table: a `Price` per model name or family name (its ``rows``).

    A row prices the models its name names: the model of that name, and those whose name
    goes on from it past a separator (`find`). Immutable once made: ``a | b`` is a new
    table of both's rows, ``b``'s where both name one.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: Mapping[str, Price]) -> None:
        for name, price in rows.items():
            if type(name) is not str or not name.strip():
                raise ValueError(f"a price row must be named by a model, got {name!r}")
            if type(price) is not Price:
                raise TypeError(f"price row {name!r} must be a Price, got {type(price).__name__}")
        #: The rows by the model or family each prices.
        self.rows: Mapping[str, Price] = MappingProxyType(dict(rows))

    def __repr__(self) -> str:
        return f"Prices({len(self.rows)} rows)"

    def __or__(self, other: Prices) -> Prices:
        return Prices({**self.rows, **other.rows})

    def find(self, model: str) -> Price | None:
        """The row that prices `model`: of the rows whose name `model` begins with, and
        then ends or goes on past a separator (``-``, ``:``, ``@``, ...: anything but a
        letter, a digit or a dot), the longest. ``gpt-4o`` prices ``gpt-4o`` and
        ``gpt-4o-2024-08-06``, and ``gpt-4o-mini`` when no ``gpt-4o-mini`` row does;
        ``gpt-5`` does not price ``gpt-5.4``, nor ``o1`` ``o1x``. None when no row does."""
        best = ""
        for name in self.rows:
            if len(name) > len(best) and model.startswith(name) and _continues(model, len(name)):
                best = name
        return self.rows[best] if best else None

    def priced(self, usage: Usage, model: str | None) -> Usage:
        """`usage` with its ``cost``: at the price of `model` (`find`), None (unknown)
        when no row prices it or no model is named."""
        price = None if model is None else self.find(model)
        if price is None:
            return usage if usage.cost is None else msgspec.structs.replace(usage, cost=None)
        return msgspec.structs.replace(usage, cost=price.cost(usage))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Prices:
        """The table a price file holds (see the module docstring); `PriceFileError`
        naming the file, and the row when one is at fault, if it cannot be used."""
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as exc:
            raise PriceFileError(f"price file {os.fspath(path)!r}: {exc.strerror}") from None
        return cls.parse(data, os.fspath(path))

    @classmethod
    def parse(cls, data: bytes, where: str) -> Prices:
        """The table of a price file's bytes, read from `where` (named by its errors)."""
        try:
            document = tomllib.loads(data.decode(), parse_float=Decimal)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise PriceFileError(f"price file {where!r} is not TOML: {exc}") from None
        rows: dict[str, Price] = {}
        for name, row in document.items():
            if not name.strip():
                raise PriceFileError(f"price file {where!r}: a row must be named by a model")
            if not isinstance(row, dict):
                raise PriceFileError(
                    f"price file {where!r}: row {name!r} must be a table of prices,"
                    f" got {type(row).__name__}"
                )
            try:
                rows[name] = msgspec.convert(row, Price)
            except msgspec.ValidationError as exc:
                raise PriceFileError(f"price file {where!r}: row {name!r}: {exc}") from None
        return cls(rows)


#: The shipped table's file, beside this module.
SHIPPED_FILE: Final = "prices.toml"


@functools.cache
def shipped_prices() -> Prices:
    """The table greenroom ships (``greenroom/models/prices.toml``), read at the first
    call and kept: each row's ``as_of`` and ``source`` say when and where its figures
    were read. What `greenroom.open_runtime` prices by unless given a table."""
    data = importlib.resources.files("greenroom.models").joinpath(SHIPPED_FILE).read_bytes()
    return Prices.parse(data, f"greenroom/models/{SHIPPED_FILE}")
