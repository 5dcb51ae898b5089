"""`value_for`: a JSON value valid for a JSON Schema, made by a seeded generator.

What tools and structured outputs declare (msgspec's schemas, and the common hand-written
ones): ``$ref`` into ``$defs``, ``const`` and ``enum`` (a falsy constant too), ``anyOf`` /
``oneOf`` (one branch, by the seed), ``allOf`` (objects merged), a list of types, objects
(every required property, and each optional one by a coin flip; ``additionalProperties``,
``minProperties``), arrays (``prefixItems``, ``minItems``/``maxItems``, ``uniqueItems``),
strings (``minLength``/``maxLength``, the formats msgspec decodes: ``date``, ``date-time``,
``time``, ``duration``, ``uuid``; and ``email``, ``uri``, ``ipv4``), integers and numbers
(``minimum``/``maximum``, exclusive ones, ``multipleOf``), booleans and null. A ``pattern``
is met by a ``default`` or an ``examples`` value that matches it, else `SchemaError`: no
regular expression is generated. A value is valid for what the schema says, no more: a
type whose schema says less than its decoder checks (msgspec gives a ``datetime`` a plain
``string``) may be sent one it refuses. The same schema and seed give the same value.
"""

from __future__ import annotations

import math
import random
import re
import string
import uuid
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

#: How deep a schema's references may nest before a value gives up (a recursive type).
MAX_DEPTH: Final = 32
_WORDS: Final = ("alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "tango")


class SchemaError(ValueError):
    """No value can be made for this schema (an unknown type, a pattern, a cycle)."""


def value_for(schema: Mapping[str, Any], seed: int | str = 0) -> Any:
    """A JSON value valid for `schema`, the same for the same `seed`."""
    return _Values(schema, random.Random(seed)).make(schema, 0)


class _Values:
    __slots__ = ("_defs", "_random")

    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self._defs: Mapping[str, Any] = root.get("$defs", {})
        self._random = rng

    def make(self, schema: Mapping[str, Any], depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SchemaError(f"references nest deeper than {MAX_DEPTH}: a recursive type?")
        rng = self._random
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        if "$ref" in schema:
            name = str(schema["$ref"]).removeprefix("#/$defs/")
            if name not in self._defs:
                raise SchemaError(f"reference {schema['$ref']!r} names no definition")
            return self.make(self._defs[name], depth + 1)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = [b for b in schema[key] if b.get("type") != "null"] or schema[key]
                return self.make(rng.choice(branches), depth + 1)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self.make(part, depth + 1))
            return merged
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice([k for k in kind if k != "null"] or kind)
        if "pattern" in schema:
            return self._matching(schema)
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        if kind is None:  # any value at all
            return rng.choice(_WORDS)
        raise SchemaError(f"no value for type {kind!r}")

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        rng = self._random
        required = set(schema.get("required", ()))
        value = {
            name: self.make(sub, depth + 1)
            for name, sub in schema.get("properties", {}).items()
            if name in required or rng.random() < 0.5
        }
        extra = schema.get("additionalProperties")
        if extra is None or extra is False:
            return value
        wanted = max(schema.get("minProperties", 0) - len(value), 0 if value else 1)
        index = 0
        while wanted > 0:
            key = f"{rng.choice(_WORDS)}_{index}"
            index += 1
            if key not in value:
                value[key] = self.make({} if extra is True else extra, depth + 1)
                wanted -= 1
        return value

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = [self.make(sub, depth + 1) for sub in schema.get("prefixItems", ())]
        items = schema.get("items")
        if "prefixItems" in schema and not items:  # a tuple
            return prefix
        unique = schema.get("uniqueItems", False)
        low = max(schema.get("minItems", 0) - len(prefix), 0)
        high = schema["maxItems"] - len(prefix) if "maxItems" in schema else low + 3
        count = self._random.randint(low, max(low, high))
        values = list(prefix)
        for _ in range(8 * count + 8):
            if len(values) - len(prefix) >= count:
                break
            item = self.make(items or {}, depth + 1)
            if not unique or item not in values:
                values.append(item)
        if len(values) - len(prefix) < low:
            raise SchemaError(f"cannot make {low} distinct items")
        return values

    def _string(self, schema: Mapping[str, Any]) -> str:
        rng = self._random
        made = _FORMATS.get(schema.get("format", ""))
        if made is not None:
            return made(rng)
        low = schema.get("minLength", 0)
        word = rng.choice(_WORDS)
        length = min(max(len(word), low), schema.get("maxLength", len(word) + low))
        while len(word) < length:
            word += rng.choice(string.ascii_lowercase)
        return word[:length]

    def _integer(self, schema: Mapping[str, Any]) -> int:
        low, high = self._bounds(schema, nudge=1)
        step = schema.get("multipleOf", 1)
        first, last = math.ceil(low / step), math.floor(high / step)
        if first > last:
            raise SchemaError(f"no multiple of {step} lies in [{low}, {high}]")
        return int(self._random.randint(first, last) * step)

    def _number(self, schema: Mapping[str, Any]) -> float:
        if "multipleOf" in schema:
            return float(self._integer(schema))
        low, high = self._bounds(schema, nudge=1e-3)
        return min(max(round(self._random.uniform(low, high), 3), low), high)

    def _bounds(self, schema: Mapping[str, Any], *, nudge: float) -> tuple[float, float]:
        """The inclusive range a number may take (an exclusive bound moved in by `nudge`);
        an open side lies 100 past the other, or at 0."""
        low = schema.get("minimum")
        if low is None and "exclusiveMinimum" in schema:
            low = schema["exclusiveMinimum"] + nudge
        high = schema.get("maximum")
        if high is None and "exclusiveMaximum" in schema:
            high = schema["exclusiveMaximum"] - nudge
        if low is None:
            low = 0 if high is None else min(0, high)
        if high is None:
            high = max(low, 0) + 100
        if low > high:
            raise SchemaError(f"no value lies in [{low}, {high}]")
        return low, high

    def _matching(self, schema: Mapping[str, Any]) -> Any:
        pattern = re.compile(schema["pattern"])
        candidates = [schema["default"]] if "default" in schema else []
        candidates += list(schema.get("examples", ()))
        for candidate in candidates:
            if isinstance(candidate, str) and pattern.search(candidate):
                return candidate
        raise SchemaError(
            f"cannot make a string matching pattern {schema['pattern']!r}: give the schema a"
            " default or examples that match it"
        )


def _when(rng: random.Random) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(86_400 * 365))


_FORMATS: Final = {
    "date": lambda rng: (date(2026, 1, 1) + timedelta(days=rng.randrange(365))).isoformat(),
    "date-time": lambda rng: _when(rng).isoformat(),
    "time": lambda rng: _when(rng).time().isoformat(),
    "duration": lambda rng: f"PT{rng.randint(1, 3600)}S",
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    "email": lambda rng: f"{rng.choice(_WORDS)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.choice(_WORDS)}",
    "ipv4": lambda rng: ".".join(str(rng.randint(1, 254)) for _ in range(4)),
}
