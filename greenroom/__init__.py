"""greenroom: an actor runtime for AI agents on Trio."""

__version__ = "0.1.0"
