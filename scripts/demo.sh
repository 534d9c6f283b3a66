#!/usr/bin/env bash
# The main job on embedded defaults: set up (idempotent), train the tiny ISQ model on the
# project's own synthetic corpus for 120 steps on the CPU (about two minutes on 2 cores, with a
# progress bar), export the fingerprinter into the run's directory
# (runs/smoke/version_N/fingerprinter/), and fingerprint three sentences with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
.venv/bin/python -m training.fit --config configs/smoke.yaml "$@"
fingerprinter=$(ls -td runs/smoke/version_*/fingerprinter | head -n 1)
.venv/bin/python -m isq.fingerprint "$fingerprinter" \
  "Shall we meet at the museum at 7 o'clock on Friday?" \
  "Shall we meet at the museum at 8 o'clock on Friday?" \
  "My laptop is broken again, I bought it 3 months ago."
