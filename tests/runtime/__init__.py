"""The tests of runtime."""
