"""Floor 1: pure data. msgspec Structs for session events, model streams and
requests; no Trio, no behaviour beyond what a value can say about itself.

Every Struct here but the MCP server specs (`mcp.McpStdioServer`,
`mcp.McpHttpServer`: a few per session) is ``gc=False``: they hold values,
never references back to live objects, so they cannot form cycles, and a
long session log then costs the cyclic garbage collector nothing to walk.
"""
