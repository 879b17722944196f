"""``python -m qpart``: the ``qpart`` command, importing from the same places as its console script."""

import os
import sys


def _drop_working_directory() -> None:
    # `python -m` puts the working directory first on sys.path, where the console script has its own
    # bin folder: a file there named like a model's factory module (or like torch) would be imported
    # in its place. -P (PYTHONSAFEPATH) puts nothing there, so sys.path[0] is then a real entry.
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]


_drop_working_directory()

from qpart.cli import main  # noqa: E402  (after the working directory left sys.path)

main()
