"""greenroom's test suite: one directory per subject, the shared helpers here (tests/README.md).

The helpers are imported as ``tests.NAME``, and the children among them are run by path
(``TESTS / "NAME.py"``) or by module name from `ROOT`.
"""

from pathlib import Path

#: This directory: the helper modules and the child scripts run by path.
TESTS = Path(__file__).resolve().parent
#: The repository: the files the tests read (the docs, pyproject.toml) and the children's cwd.
ROOT = TESTS.parent
