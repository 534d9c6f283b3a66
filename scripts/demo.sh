#!/usr/bin/env bash
# The main job on embedded defaults: set up (idempotent), train the tiny ISQ model on the
# project's own synthetic corpus for 120 steps on the CPU (about a minute and a half), export
# the fingerprinter to checkpoints/smoke/, and fingerprint three sentences with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
.venv/bin/python -m training.fit --config configs/smoke.yaml --trainer.enable_progress_bar false "$@"
.venv/bin/python -m isq.fingerprint checkpoints/smoke \
  "Shall we meet at the museum at 7 o'clock on Friday?" \
  "Shall we meet at the museum at 8 o'clock on Friday?" \
  "My laptop is broken again, I bought it 3 months ago."
