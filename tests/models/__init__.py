"""The tests of models."""
