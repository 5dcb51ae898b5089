"""The tests of sandbox."""
