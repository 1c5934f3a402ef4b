#!/usr/bin/env bash
# Install gtpo and run the offline default training (SmolLM2-135M + LoRA, GTPO, ~10 min on 2 CPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh demo
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
gtpo train --demo "$@"
