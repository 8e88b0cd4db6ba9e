#!/usr/bin/env bash
# The size of every kernel's machine code (sm_90a SASS) in one CUDA source, largest first: a kernel
# that runs once per SM each step waits to fetch its body (docs/perf.md, "twenty-first run": a
# 155 KB kernel spent 62 % of its stall samples on instruction fetch), so this is worth a look
# after a change to a small kernel. No GPU needed: it compiles the source as the build does, to a
# cubin, and reads the cubin's .text sections (readelf, c++filt).
#
#   bash scripts/kernel-sizes.sh src/backends/cuda/kernels_basic.cu [BUILD_DIR] [N]
#
# BUILD_DIR: a configured CUDA build (default build; scripts/build.sh or prepare-gpu-carry.sh
# makes one); N: rows (default 20). KEEP=PATH keeps the cubin there (bench/sass_ops.py counts a
# kernel's opcodes in it).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: kernel-sizes.sh <file.cu> [build dir] [rows]}
build=${2:-build}
rows=${3:-20}
[ -f "$src" ] || { echo "kernel-sizes: no $src" >&2; exit 1; }
[ -f "$build/build.ninja" ] || { echo "kernel-sizes: $build is not a configured Ninja build" >&2; exit 1; }
obj=$(cd "$build" && ninja -t targets all | grep -o "^[^:]*$(basename "$src").o" | head -1)
[ -n "$obj" ] || { echo "kernel-sizes: $build does not compile $src (configure with -DSPARROW_CUDA=ON)" >&2; exit 1; }
cmd=$(cd "$build" && ninja -t commands "$obj" | tail -1)
cubin=$(mktemp --suffix=.cubin)
trap 'rm -f "$cubin"' EXIT
# The object's command, made to write one sm_90a cubin instead of an object.
cmd=$(echo "$cmd" | sed -E "s# -o [^ ]+# -o $cubin#; s# -MD -MT [^ ]+ -MF [^ ]+##; s# -c # -cubin #; s#--generate-code=[^ ]+##g; s#-gencode[= ][^ ]+##g")
(cd "$build" && eval "$cmd -arch=sm_90a") >/dev/null
[ -z "${KEEP:-}" ] || cp "$cubin" "$KEEP"
readelf -S -W "$cubin" 2>/dev/null | awk '$2 ~ /^\.text\./ {print $6, substr($2, 7)}' |
  while read -r hex name; do printf '%8d  %s\n' "$((16#$hex))" "$(echo "$name" | c++filt)"; done |
  sort -rn | head -n "$rows" | sed -E 's/sparrow::cuda::\(anonymous namespace\)::|sparrow::cuda::<unnamed>:://'
