#!/usr/bin/env bash
# System packages the tests need: Debian's Slurm daemons (live scavenger tests) and Chromium
# (the report is checked in a real browser). One line per step; quick when all are there.
set -euo pipefail
missing=()
for cmd in slurmctld slurmd sinfo; do
  command -v "$cmd" >/dev/null || { missing+=(slurmctld slurmd slurm-client); break; }
done
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-system: Slurm and Chromium already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
LOG=$(mktemp -t setup-system.XXXXXX.log)
echo "setup-system: apt-get install ${missing[*]}"
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"; } >"$LOG" 2>&1; then
  echo "setup-system: FAILED: apt-get install ${missing[*]}; the end of $LOG:" >&2
  tail -n 30 "$LOG" >&2
  exit 1
fi
rm -f "$LOG"
