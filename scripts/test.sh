#!/usr/bin/env bash
# Set up everything and run the whole test suite: lint, our tests (all markers, slurm included),
# and Parsl's own test suite against MalleableExecutor. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-system.sh
bash scripts/setup.sh
. .venv/bin/activate
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
python -m pytest tests "$@"
