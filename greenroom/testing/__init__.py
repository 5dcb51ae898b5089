"""greenroom's test kit (the ``greenroom[testing]`` extra): models that need no network, and
an opt-in pytest plugin (`greenroom.testing.plugin`) that runs a test's runtime in virtual
time. docs/testing.md shows how to test an agent with them."""

from greenroom.testing.models import FunctionModel, Reply, TestModel
from greenroom.testing.values import SchemaError, value_for

__all__ = ["FunctionModel", "Reply", "SchemaError", "TestModel", "value_for"]
