"""Where a command line writes: checked when the arguments are read, before any work, so a path
that cannot be written is one ``error:`` line rather than a traceback after a run whose figures it
then loses. Shared by every command line of the project: argparse types, and the plain check for
the commands that print their own one-line errors."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def unwritable(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` cannot be written as a file (``directory`` false) or made or filled as a
    directory, or None when it can: a file where a directory is wanted or the other way round, or a
    nearest existing ancestor that is not a directory this process may write in (the missing ones
    are made on the way)."""
    if directory and path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    if not directory and path.is_dir():
        return f"{path} is a directory; give a file to write"
    absolute = path.absolute()
    nearest = absolute if directory and path.is_dir() else next(p for p in absolute.parents if p.exists())
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        return f"{path} cannot be written: {nearest} is not a directory this process may write in"
    return None


def output_file(text: str) -> Path:
    """argparse type of a file a run writes (replaced if it exists)."""
    return _checked(text, directory=False)


def output_directory(text: str) -> Path:
    """argparse type of a directory a run makes or writes into."""
    return _checked(text, directory=True)


def _checked(text: str, *, directory: bool) -> Path:
    problem = unwritable(Path(text), directory=directory)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return Path(text)
