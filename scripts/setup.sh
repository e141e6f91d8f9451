#!/usr/bin/env bash
# Create .venv and install malleparsl with every extra. One line per step; pip's output goes to
# .venv/setup.log and is shown (without the machine's pip-config noise) only when a step fails.
# A rerun with pyproject.toml unchanged finds the stamp and returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=.venv/setup.log
STAMP=.venv/.setup-stamp

step() {  # step "what" command...: one line; on failure, the log's last meaningful lines
  local what=$1
  shift
  echo "setup: $what"
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: FAILED: $what; the end of $LOG:" >&2
    grep -v -e "^WARNING: Location '.*' is ignored" "$LOG" | tail -n 30 >&2
    exit 1
  fi
}

if [ ! -x .venv/bin/python ]; then
  mkdir -p .venv
  : >"$LOG"
  step "creating .venv with $("$PY" -V 2>&1)" "$PY" -m venv .venv
fi
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) $(.venv/bin/python -V 2>&1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
  .venv/bin/python -c "import malleparsl" 2>/dev/null; then
  echo "setup: .venv is up to date (pyproject.toml unchanged since the last install)"
  exit 0
fi
rm -f "$STAMP"
: >"$LOG"
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
step "upgrading pip" "${PIP[@]}" install --upgrade pip
# torch first, pinned: this machine's local CPU wheel (a bare "torch" would pull a CUDA build).
step "installing torch==2.13.0 (CPU)" "${PIP[@]}" install "torch==2.13.0"
step "installing malleparsl[all] in editable mode" "${PIP[@]}" install -e ".[all]"
echo "$want" >"$STAMP"
echo "setup: done (.venv ready; log in $LOG)"
