#!/usr/bin/env bash
# npm_install.sh DIR: installs DIR/package-lock.json into DIR/node_modules with `npm ci`, unless
# the installed tree already matches the lock file. Used by the tests that need npm packages (the
# reference tokenizers, the openai client). Needs node and npm.
set -euo pipefail
dir="${1:?usage: npm_install.sh DIR}"
cd "$dir"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "npm_install.sh: '$tool' is not installed (the tests in $dir need node and npm)" >&2; exit 1; }
done
stamp=node_modules/.sparrow-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "npm_install.sh: $dir/node_modules matches package-lock.json"
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
echo "npm_install.sh: installed $(ls node_modules | tr '\n' ' ')"
