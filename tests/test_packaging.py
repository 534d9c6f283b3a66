"""What an install needs: the files the installed packages read are package data, and
``scripts/setup.sh`` refuses a Python older than the project's with one line, before it makes or
reuses a virtual environment (pip's own error would not name the version, and a ``.venv`` made
with the old Python would be reused by every later run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_trainer_defaults_are_package_data_of_training():
    """``training.fit`` reads them beside itself, so an installed (not editable) package has them."""
    import training
    from training.fit import DEFAULTS

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert DEFAULTS.is_file() and DEFAULTS.parent == Path(training.__file__).resolve().parent
    assert DEFAULTS.name in data["training"]


def test_the_script_and_the_package_ask_for_the_same_python():
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert wanted == ">=3.11" and "sys.version_info < (3, 11)" in (ROOT / "scripts/setup.sh").read_text()


@pytest.mark.parametrize("where", ["PYTHON", ".venv"])
def test_an_old_python_is_one_error_line_and_no_venv(tmp_path, where):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts/setup.sh", tmp_path / "scripts/setup.sh")
    old = tmp_path / "old-python"
    old.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Python 3.9.18'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(old) if where == "PYTHON" else sys.executable}
    if where == ".venv":
        (tmp_path / ".venv/bin").mkdir(parents=True)
        shutil.copy(old, tmp_path / ".venv/bin/python")
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and "Python 3.9.18" in line and "Python >= 3.11" in line
    assert (tmp_path / ".venv").exists() == (where == ".venv")
