"""greenroom's test kit (the ``greenroom[testing]`` extra): models that need no network, and
an opt-in pytest plugin (`greenroom.testing.plugin`) that runs a test's runtime in virtual
time. docs/testing.md shows how to test an agent with them."""

from greenroom.protocol.model import ModelRequest, ToolTurn, UserTurn
from greenroom.testing.models import FunctionModel, Reply, TestModel
from greenroom.testing.values import SchemaError, value_for

#: `ModelRequest` and its turns are what a `FunctionModel`'s function reads.
__all__ = [
    "FunctionModel",
    "ModelRequest",
    "Reply",
    "SchemaError",
    "TestModel",
    "ToolTurn",
    "UserTurn",
    "value_for",
]
