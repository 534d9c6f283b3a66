#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite on the CPU, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
# Two worker processes (pytest-xdist), each taking a whole test file at a time, so that a module's
# server or database starts once: about half the time on two cores. `-n 0` runs the tests in this
# process, `-n N` in N workers (the last -n given counts).
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
