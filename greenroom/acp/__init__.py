"""Floor 7: the ACP bridge. Editors drive greenroom agents over the Agent Client Protocol."""

from greenroom.acp.connection import AcpConnection, serve_connection

__all__ = ["AcpConnection", "serve_connection"]
