#!/usr/bin/env bash
# System packages the tests need: Debian's Slurm daemons (live scavenger tests), Chromium
# (the report is checked in a real browser), iproute2 and util-linux (ip, nsenter: the multihost
# tests' network namespaces). One line per step; quick when all are there.
set -euo pipefail
missing=()
for cmd in slurmctld slurmd sinfo; do
  command -v "$cmd" >/dev/null || { missing+=(slurmctld slurmd slurm-client); break; }
done
command -v chromium >/dev/null || missing+=(chromium)
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-system: Slurm, Chromium, ip and nsenter already installed"
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
