"""The tests of hosts."""
