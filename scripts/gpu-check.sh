#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py, issue 29 section 3) on a GPU machine with torch, transformers, accelerate and
# peft but no internet and no trl, datasets or bitsandbytes, as this project's lent H200 (torch 2.11 + CUDA 13,
# Python 3.12, at most 64 MiB of files travel with the repository).
#
#   bash scripts/gpu-check.sh prepare   # HERE (a machine with PyPI): the wheels the GPU machine lacks, unpacked
#                                       # into .gpucheck/site (git-ignored); bitsandbytes keeps only its CUDA 13
#                                       # and CPU libraries (43 MB -> ~8 MB); prints what will travel
#   bash scripts/gpu-check.sh run       # THERE: the check with .gpucheck/site and src/ on PYTHONPATH, within its
#                                       # --budget-s (450 s); $OUT/gpu_check.json (+ gpu_check.log) hold the results
#
# With the device tool of this workplace: prepare here, then one call
#   run(command="bash scripts/gpu-check.sh run", carry=[".gpucheck"], timeout_s=520)
# and record what it printed in docs/performance.md with the date and the GPU. `run -- --only head,decode` passes
# options to bench/gpu_check.py (parts: environment, head, trl, resume, sampling_sync, decode_compile, reward_model, bf16_learning,
# throughput, qlora_grad, decode, shared_prefix, steps, long; --budget-s SECONDS).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.gpucheck
# pure-Python wheels (any Python), multiprocess for Python 3.12, bitsandbytes for manylinux x86-64
WHEELS=(trl==1.16.0 datasets==4.8.4 dill==0.4.0 multiprocess==0.70.18 bitsandbytes==0.50.2)
# DeepSpeed for the sharded part (TRL's zero2/zero3 configs): its wheel is built here from the sdist (setup.py imports
# torch: .venv's, no ops compiled, DS_BUILD_OPS=0: ZeRO with the trainer's torch optimizer needs none), and the
# dependencies the GPU machine may lack
DS_VERSION=0.19.8
DS_DEPS=(einops hjson msgpack ninja py-cpuinfo "pydantic>=2" pydantic-core annotated-types typing-inspection)

prepare() {
  rm -rf "$DIR"
  mkdir -p "$DIR/wheels" "$DIR/site"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$DIR/wheels" "${WHEELS[@]}" "${DS_DEPS[@]}"
  if [ -x .venv/bin/pip ]; then
    DS_BUILD_OPS=0 .venv/bin/pip wheel -q --no-deps --no-build-isolation -w "$DIR/wheels" "deepspeed==$DS_VERSION"
  else
    echo "gpu-check prepare: no .venv (bash scripts/install.sh test): deepspeed not carried, the sharded part's" \
         "zero2/zero3 runs will be skipped" >&2
  fi
  python3 - "$DIR" <<'EOF'
import glob, os, re, sys, zipfile
root = sys.argv[1]
keep = re.compile(r"libbitsandbytes_(cpu|cuda13\d)\.so$")  # torch cu130 loads the CUDA 13 library
for wheel in sorted(glob.glob(os.path.join(root, "wheels", "*.whl"))):
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("bitsandbytes/libbitsandbytes_") and not keep.search(name):
                continue
            zf.extract(name, os.path.join(root, "site"))
EOF
  rm -rf "$DIR/wheels"
  grep -qx "/$DIR/" .gitignore 2>/dev/null || grep -qx "/$DIR/" .git/info/exclude 2>/dev/null \
    || echo "/$DIR/" >> .git/info/exclude
  local repo site total
  repo=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  site=$(du -sb "$DIR" | cut -f1)
  total=$((repo + site))
  echo "gpu-check prepare: $DIR holds $(ls "$DIR/site" | grep -c dist-info) packages, $((site / 1048576)) MiB;" \
       "the working tree $((repo / 1048576)) MiB; together $((total / 1048576)) MiB of the 64 MiB that travel"
  if [ "$total" -gt $((64 * 1048576)) ]; then
    echo "gpu-check prepare: over 64 MiB: the check cannot travel as it is" >&2
    exit 1
  fi
  echo "next: run(command=\"bash scripts/gpu-check.sh run\", carry=[\"$DIR\"], timeout_s=520)"
}

run() {
  if [ ! -d "$DIR/site" ]; then
    echo "gpu-check run: $DIR/site is missing: run 'bash scripts/gpu-check.sh prepare' where PyPI is reachable," \
         "and carry $DIR" >&2
    exit 2
  fi
  export PYTHONPATH="$PWD/$DIR/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  local out="${OUT:-$PWD/gpu-check-out}"
  mkdir -p "$out"
  export OUT="$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  python3 -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
  set -o pipefail
  python3 bench/gpu_check.py "$@" 2>&1 | tee "$out/gpu_check.log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; [ "${1:-}" = "--" ] && shift; run "$@" ;;
  *) echo "usage: bash scripts/gpu-check.sh prepare | run [-- bench/gpu_check.py options]" >&2; exit 2 ;;
esac
