"""Floor 4: tools. `ToolRegistry` runs tool calls for the loop."""

from greenroom.tools.registry import TOOLS_EXECUTE, Tool, ToolRegistry

__all__ = ["TOOLS_EXECUTE", "Tool", "ToolRegistry"]
