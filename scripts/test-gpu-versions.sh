#!/usr/bin/env bash
# The GPU machine's library versions on CPU (issue 42, item 2): a venv of its own with the versions this project's
# lent H200 has (transformers 5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, tokenizers 0.23.2, safetensors
# 0.8.0, as its pip list read: the device notes' KINDS.md) and the trl, datasets and bitsandbytes wheels
# that scripts/gpu-check.sh carries there, with this machine's CPU torch; it runs `bench/gpu_check.py --cpu
# --quick` and a fast subset of the suite (trainer step, precision, checkpoint/resume, TRL engine). The main
# .venv tests the newest versions; this one tests what a GPU run will import.
#
#   bash scripts/test-gpu-versions.sh                  # creates .venv-gpuversions (1 min, 1.7 GB), then runs (2-5 min)
#   bash scripts/test-gpu-versions.sh --install-only   # scripts/test.sh: build the venv in the background
#   bash scripts/test-gpu-versions.sh -k resume        # extra arguments go to pytest
#
# Not the GPU machine's: torch (2.11 + CUDA 13 there; the CPU build 2.13.0 here), Python (3.12 there) and numpy (2.5.2
# there needs Python 3.12; pip picks the newest for this Python). Its peft is 0.21.0 (recorded by the GPU check on
# 2026-12-04, which ran with it there); GPU_PEFT picks the one tested here, 0.18.0 by default: pyproject.toml's
# minimum, proven here (0.21.0 ran on the GPU, 0.21.2 runs in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
install_only=0
if [ "${1:-}" = --install-only ]; then install_only=1; shift; fi
. scripts/lib.sh
# pip installs without compiling bytecode (--no-compile: ~46 CPU-s per venv, measured, most of it for modules no
# test imports); Python writes the .pyc of what the tests import, once, so a machine that sets
# PYTHONDONTWRITEBYTECODE must not stop it here (each process would compile torch again)
unset PYTHONDONTWRITEBYTECODE
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
venv=.venv-gpuversions
py="$venv/bin/python"
# The GPU machine's versions (its pip list) and the wheels scripts/gpu-check.sh carries there (WHEELS in it).
PINS=(transformers==5.17.0 accelerate==1.15.0 huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0
      "peft==${GPU_PEFT:-0.18.0}" trl==1.16.0 datasets==4.8.4 dill==0.4.0 multiprocess==0.70.18
      bitsandbytes==0.50.2)
DS_VERSION=0.19.8  # as scripts/gpu-check.sh
want="$(printf '%s\n' "${PINS[@]}" "deepspeed==$DS_VERSION" | sort | tr '\n' ' ')"
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$want" ] || ! "$py" -c "import gtpo, trl, peft, pytest, deepspeed" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q --no-compile torch==2.13.0   # the CPU build first, as scripts/install.sh (a bare torch would pull CUDA)
  torch_pin="torch==$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
  # gtpo (editable: the tests import src/) and the test tools, resolved together with the pins
  pip_locked "$py" -m pip install -q --no-compile -e . pytest hypothesis psutil "$torch_pin" "${PINS[@]}"
  # DeepSpeed as gpu-check.sh carries it (built without ops: its setup.py imports torch): gpu_check's sharded part
  # runs ZeRO-2/3 on DeepSpeed's CPU accelerator here
  DS_BUILD_OPS=0 "$py" -m pip install -q --no-compile --no-build-isolation "deepspeed==$DS_VERSION" "$torch_pin"
  echo "$want" > "$venv/.pins"
fi
[ "$install_only" = 1 ] && exit 0
"$py" -c "import torch, transformers, accelerate, huggingface_hub, peft, trl, datasets
print('gpu-versions venv: torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate',
      accelerate.__version__, 'huggingface_hub', huggingface_hub.__version__, 'peft', peft.__version__, 'trl',
      trl.__version__, 'datasets', datasets.__version__)"
# bench/gpu_check.py --cpu --quick, every part's result asserted (the test prints its table and statuses when it fails)
"$py" -m pytest -q -p no:cacheprovider -m gpuversions tests/test_dtype_device.py
# trainer step and method, precision (bf16, 4-bit, the launcher's, the saved dtype, devices), checkpoint/resume,
# TRL's engine, and the decoding loop's use of transformers internals (attention interface, masks, host syncs);
# the multi-process (slow) tests and the sampling-settings grid of the decoding loop stay in the main suite
"$py" -m pytest -q -p no:cacheprovider -m "not slow" -k "not test_decode_loop_samples_the_tokens_of_generate" \
  tests/test_trainer_step.py tests/test_trainer_method.py tests/test_low_precision.py tests/test_launcher_precision.py \
  tests/test_saved_dtype.py tests/test_dtype_device.py tests/test_reward_model_device.py tests/test_checkpoint.py \
  tests/test_trl_engine.py tests/test_decode_syncs.py tests/test_bf16_merge.py tests/test_fast_paths.py "$@"
