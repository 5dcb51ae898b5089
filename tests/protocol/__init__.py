"""The tests of protocol."""
