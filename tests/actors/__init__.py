"""The tests of actors."""
