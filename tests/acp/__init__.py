"""The tests of acp."""
