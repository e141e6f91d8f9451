#!/usr/bin/env bash
# System packages the tests need: Debian's Slurm daemons for the live scavenger tests, iproute2
# (ip) and util-linux (nsenter) for the multihost tests' network namespaces.
set -euo pipefail
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
   && command -v ip >/dev/null && command -v nsenter >/dev/null; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client iproute2 \
  util-linux >/dev/null
