#!/usr/bin/env bash
# Packaging check (CI runs it): build the wheel, install it into a fresh venv without extras and,
# from an empty folder (no checkout, no shared/ data in reach), run the simulator and the
# allocator benchmark; then add the [torch] extra (torch pinned to the local CPU build first) and
# run the quick demo. One line per step with the seconds so far; a failing step prints the end of
# its log and the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d -t malleparsl-pkg.XXXXXX)
KEEP=${KEEP_PACKAGE_CHECK:-0}  # 1: leave $WORK for a look
trap '[ "$KEEP" = 1 ] || rm -rf "$WORK"' EXIT
T0=$SECONDS
LOG=$WORK/step.log

step() {  # step "what" command...: one line; on failure the log's end, then exit 1
  local what=$1
  shift
  echo "check-package: $what  [$((SECONDS - T0)) s]"
  if ! "$@" >"$LOG" 2>&1; then
    echo "check-package: FAILED: $what; the end of its output:" >&2
    grep -v -e "^WARNING: Location '.*' is ignored" "$LOG" | tail -n 40 >&2
    exit 1
  fi
}

in_empty() {  # in_empty DIR command...: run from an empty folder with a clean environment
  local dir=$1
  shift
  mkdir -p "$dir"
  (cd "$dir" && env -u MALLEPARSL_DATA -u PYTHONPATH -u VIRTUAL_ENV \
    PATH="$WORK/venv/bin:/usr/local/bin:/usr/bin:/bin" "$@")
}

json_lines() {  # json_lines FILE MIN_LINES: every line a JSON object; at least MIN_LINES of them
  "$WORK/venv/bin/python" - "$1" "$2" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert len(rows) >= int(sys.argv[2]), f"{len(rows)} JSON lines, expected >= {sys.argv[2]}"
bad = [r for r in rows if r.get("status", "ok") != "ok"]
assert not bad, f"rows not ok: {bad}"
print(len(rows))
EOF
}

PIP=(-m pip -q --disable-pip-version-check)
copy_sources() {  # what a clone holds (tracked and new files, not ignored ones such as build/)
  mkdir -p "$WORK/src"
  { git -C "$ROOT" ls-files -z --cached --others --exclude-standard; } |
    (cd "$ROOT" && tar --null --ignore-failed-read -T - -cf -) | tar -xf - -C "$WORK/src"
}
step "copying the sources (git ls-files)" copy_sources
step "building the wheel" "$PY" "${PIP[@]}" wheel --no-deps "$WORK/src" -w "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/malleparsl-*.whl)
step "creating a fresh venv" "$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
step "installing $(basename "$WHEEL") without extras" "$VPY" "${PIP[@]}" install "$WHEEL"
step "the installed package is the one imported, torch and scikit-learn absent" \
  in_empty "$WORK/base" python -c "
import importlib.util, malleparsl, sys
assert malleparsl.__file__.startswith('$WORK/venv/'), malleparsl.__file__
missing = [m for m in ('torch', 'sklearn') if importlib.util.find_spec(m) is None]
assert missing == ['torch', 'sklearn'], f'a base install should not have {missing}'
"
step "malleparsl --version and python -m malleparsl --version" \
  in_empty "$WORK/base" sh -c 'malleparsl --version && python -m malleparsl --version'
step "malleparsl simulate --nodes 0:64 --hours 6 --policy milp,equal-share --json" \
  in_empty "$WORK/base" sh -c 'malleparsl simulate --nodes 0:64 --hours 6 \
    --policy milp,equal-share --json >"$0"' "$WORK/simulate.jsonl"
step "  its output: one JSON object per policy" json_lines "$WORK/simulate.jsonl" 2
step "malleparsl bench allocator --json (quick: 3x16,10x64, 3 repeats)" \
  in_empty "$WORK/base" sh -c 'malleparsl bench allocator --json --sizes 3x16,10x64 \
    --repeats 3 --cells milp:highs,milp:cbc,equal-share >"$0"' "$WORK/bench.jsonl"
step "  its output: every cell ok" json_lines "$WORK/bench.jsonl" 6
step "without the extra, the demo says which to install" \
  in_empty "$WORK/base" sh -c '! malleparsl demo --quick 2>"$0" && grep -q "malleparsl\[torch\]" "$0"' \
  "$WORK/no-torch.txt"
step "installing torch==2.13.0 (the local CPU build) into the venv" \
  "$VPY" "${PIP[@]}" install "torch==2.13.0"
step "installing the [torch] extra" "$VPY" "${PIP[@]}" install "$WHEEL[torch]"
step "  torch is still 2.13.0, a CPU build" in_empty "$WORK/base" python -c "
import torch
assert torch.__version__.startswith('2.13.0') and torch.version.cuda is None, torch.__version__
"
step "malleparsl demo --quick (from an empty folder)" \
  in_empty "$WORK/demo" malleparsl demo --quick
step "  the demo wrote its report" test -s "$WORK/demo/report/report.html"
echo "check-package: passed in $((SECONDS - T0)) s"
