#!/usr/bin/env bash
# Installs the Debian 12 packages Sparrow builds and tests with. Idempotent; needs root (or sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libcpp-httplib-dev python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
