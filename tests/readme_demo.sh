#!/usr/bin/env bash
# The README's first command, as a user runs it after the build: the part after `&&` on its
# `bash scripts/build.sh && ...` line, with ./build/bin/sparrow replaced by the binary under test.
# Passes when it exits 0 and every length it reports has Recall@1 >= 0.95 (the demo model retrieves).
#   readme_demo.sh REPO_ROOT SPARROW_BINARY
set -euo pipefail
root=$1 bin=$2
line=$(grep -m1 '^bash scripts/build.sh && ' "$root/README.md") || { echo "README.md has no 'bash scripts/build.sh && ...' line" >&2; exit 1; }
cmd=${line#bash scripts/build.sh && }
case "$cmd" in ./build/bin/sparrow\ *) ;; *) echo "README demo does not start with ./build/bin/sparrow: $cmd" >&2; exit 1 ;; esac
cmd="$bin ${cmd#./build/bin/sparrow }"
echo "+ $cmd"
cd "$root"
out=$(bash -c "$cmd")
echo "$out"
# The table: a header line starting with "length", then one row per length: length recall@1 ...
rows=$(echo "$out" | awk 'seen && NF >= 2 {print $1, $2} /^length/ {seen = 1}')
[ -n "$rows" ] || { echo "no Recall@1 table in the output" >&2; exit 1; }
echo "$rows" | awk '{ if ($2 + 0 < 0.95) { print "Recall@1 " $2 " at length " $1 " is below 0.95" > "/dev/stderr"; bad = 1 } } END { exit bad }'
