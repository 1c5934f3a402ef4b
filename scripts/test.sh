#!/usr/bin/env bash
# Install everything the tests need into .venv and run the whole suite (CPU, offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q tests experiments/test_experiments.py "$@"
