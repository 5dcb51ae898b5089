"""The tests of project."""
