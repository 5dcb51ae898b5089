"""The tests of testing."""
