#!/usr/bin/env bash
# The verl plug-in's tests (tests/verl/) in a venv of their own: verl pins its own transformers (<5.11), so it does
# not share gtpo's main .venv.
#
#   bash scripts/test-verl.sh                  # creates .venv-verl (CPU; about 2 GB), then runs the tests
#   VERL_VENV=/path/to/venv bash scripts/test-verl.sh   # an existing venv with verl: gtpo from src/, nothing installed
#   bash scripts/test-verl.sh -k equivalence   # extra arguments go to pytest
#
# CPU torch 2.13.0 first (from the local wheel; a bare torch would pull CUDA), then verl 0.9.1 with the v1 trainer's
# imports that its base install lacks (TransferQueue and the verl-core extra's light packages), then gtpo in
# editable mode (its verl.plugins entry point) without moving verl's torch and transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
install_only=0
if [ "${1:-}" = --install-only ]; then install_only=1; shift; fi   # scripts/test.sh: build the venv in the background
. scripts/lib.sh
# pip installs without compiling bytecode (--no-compile: ~46 CPU-s per venv, measured, most of it for modules no
# test imports); Python writes the .pyc of what the tests import, once, so a machine that sets
# PYTHONDONTWRITEBYTECODE must not stop it here (each process would compile torch again)
unset PYTHONDONTWRITEBYTECODE
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
if [ -n "${VERL_VENV:-}" ]; then
  py="$VERL_VENV/bin/python"
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
  venv=.venv-verl
  py="$venv/bin/python"
  if ! "$py" -c "import verl, transfer_queue, gtpo.integrations.verl" 2>/dev/null; then
    python3 -m venv "$venv"
    "$py" -m pip install -q --upgrade pip
    "$py" -m pip install -q --no-compile torch==2.13.0
    "$py" -m pip install -q --no-compile "${VERL_PACKAGE:-verl==0.9.1}" "TransferQueue>=0.1.10" cachetools fastapi uvicorn pyzmq msgspec
    torch_pin="torch==$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
    tf_pin="transformers==$("$py" -c 'import transformers; print(transformers.__version__)')"
    pip_locked "$py" -m pip install -q --no-compile -e . pytest "$torch_pin" "$tf_pin"
  fi
fi
[ "$install_only" = 1 ] && exit 0
"$py" -m pytest -q -p no:cacheprovider tests/verl "$@"
