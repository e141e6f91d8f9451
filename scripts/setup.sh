#!/usr/bin/env bash
# Create .venv and install malleparsl with every extra. Safe to run again (it only adds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: this machine's local CPU wheel (a bare "torch" would pull a CUDA build).
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[all]"
