#!/usr/bin/env bash
# Installs the reference tokenizers (package-lock.json) into tests/tokenizer/js/node_modules with
# `npm ci`, unless the installed tree already matches the lock file. Needs node and npm.
set -euo pipefail
cd "$(dirname "$0")"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "install.sh: '$tool' is not installed (the tokenizer tests need node and npm)" >&2; exit 1; }
done
stamp=node_modules/.sparrow-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install.sh: node_modules matches package-lock.json"
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
echo "install.sh: installed $(ls node_modules | tr '\n' ' ')"
