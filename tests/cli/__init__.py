"""The tests of cli."""
