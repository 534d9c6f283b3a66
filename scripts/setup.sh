#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the project installed (editable)
# and its dev + bench extras. On a machine without CUDA the CPU build of torch is pinned
# first, so no multi-GB CUDA wheel is pulled in. A stamp skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
fits() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
if [ -x .venv/bin/python ]; then
  fits .venv/bin/python || { echo "error: .venv has $(.venv/bin/python --version 2>&1); the project needs" \
    "Python >= 3.11: remove .venv and run again (PYTHON=/path/to/python3.11 or newer)" >&2; exit 2; }
else
  fits "$PY" || { echo "error: $PY is not Python >= 3.11 ($("$PY" --version 2>&1 || echo not found)): set" \
    "PYTHON=/path/to/python3.11 or newer" >&2; exit 2; }
  "$PY" -m venv .venv
fi
stamp=.venv/.isq-setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "${pip[@]}" "torch==2.13.0"
fi
"${pip[@]}" -e ".[dev,bench]"
echo "$want" > "$stamp"
