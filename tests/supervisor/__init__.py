"""The tests of supervisor."""
