#!/usr/bin/env bash
# Set up and run the local demo: an HPO sweep on emulated idle nodes replaying the Summit trace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export PATH="$PWD/.venv/bin:$PATH"
exec malleparsl demo "$@"
