"""Where a command line writes: checked when the arguments are read, before any work, so a path
that cannot be written is one ``error:`` line rather than a traceback after a run whose figures it
then loses. Shared by every command line of the project: argparse types, and the plain checks for
the commands that print their own one-line errors."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


class UnwritableOutput(ValueError):
    """An output path this process cannot write (the message says why)."""


def unwritable(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` cannot be written as a file (``directory`` false) or made or filled as a
    directory, or None when it can: a file where a directory is wanted or the other way round, an
    existing file or directory this process may not write, a nearest existing ancestor that is
    not a directory this process may write in (the missing ones are made on the way), or a path the
    system refuses to look at (a name too long, say)."""
    try:
        return _unwritable(path, directory=directory)
    except OSError as err:
        return f"{path} cannot be written: {err.strerror or err}"


def _unwritable(path: Path, *, directory: bool) -> str | None:
    if directory and path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    if not directory and path.is_dir():
        return f"{path} is a directory; give a file to write"
    if path.exists():
        writable = os.access(path, os.W_OK | (os.X_OK if directory else 0))
        return None if writable else f"{path} is not writable by this process"
    absolute = Path(os.path.abspath(path))
    nearest = next(p for p in absolute.parents if p.exists())
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        return f"{path} cannot be written: {nearest} is not a directory this process may write in"
    return None


def export_unwritable(path: Path) -> str | None:
    """Why an export cannot be written to the directory ``path``, or None: :func:`unwritable`, and
    the export is staged beside it and moved into place, so its parent must take a new entry too."""
    return unwritable(path, directory=True) or unwritable(Path(os.path.abspath(path)).parent, directory=True)


def output_file(text: str) -> Path:
    """argparse type of a file a run writes (replaced if it exists)."""
    return _checked(text, unwritable(Path(text), directory=False))


def output_directory(text: str) -> Path:
    """argparse type of a directory a run makes or writes into."""
    return _checked(text, unwritable(Path(text), directory=True))


def export_directory(text: str) -> Path:
    """argparse type of a directory an export is written to (:func:`export_unwritable`)."""
    return _checked(text, export_unwritable(Path(text)))


def _checked(text: str, problem: str | None) -> Path:
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return Path(text)
