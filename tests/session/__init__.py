"""The tests of session."""
