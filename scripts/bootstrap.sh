#!/usr/bin/env bash
# Installs the build dependencies of moex from Debian packages (nothing else is downloaded).
# Called by both README commands and by .ci/run. Safe to run again: it only installs what is missing.
set -euo pipefail
PKGS=(cmake g++ make ninja-build libgtest-dev googletest nlohmann-json3-dev libcli11-dev libfmt-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
