#!/usr/bin/env bash
# bench/sass_ops.py --load-use on a cubin of kernels_basic.cu (scripts/kernel-sizes.sh with KEEP): the
# one-row norms (rms_norm_warp_kernel<16> and <32>, the batch-1 step's q_lora and kv norms) have no
# global load whose destination is read within 3 instructions. Before dbaf9e5 the 32-value form had 32
# (its bf16 weights' predicated loads, each issued right before its conversion: docs/perf.md,
# sixty-third session), so a change that brings the fault back fails here. And the count is not
# always zero: over the whole source some loads are read at once.
set -euo pipefail
root="$1" build="$2" dir="$3"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
KEEP="$dir/basic.cubin" bash "$root/scripts/kernel-sizes.sh" src/backends/cuda/kernels_basic.cu "$build" 3 >/dev/null
tool="$root/bench/sass_ops.py"
for per in 16 32; do
  out=$(python3 "$tool" "$dir/basic.cubin" "rms_norm_warp_kernelILi${per}E" --ops LDG --load-use 3)
  echo "$out"
  line=$(echo "$out" | grep -E '^  LDG [0-9]+, read within 3 instructions: [0-9]+$') || fail "<$per>: no load-use line"
  loads=$(echo "$line" | sed -E 's/^  LDG ([0-9]+),.*/\1/')
  near=$(echo "$line" | sed -E 's/.*: ([0-9]+)$/\1/')
  [ "$loads" -ge "$per" ] || fail "rms_norm_warp_kernel<$per> has $loads global loads, fewer than its $per values a lane"
  [ "$near" = 0 ] || fail "rms_norm_warp_kernel<$per>: $near of its $loads global loads are read within 3 instructions"
done
total=$(python3 "$tool" "$dir/basic.cubin" '.' --ops LDG --load-use 3 | sed -nE 's/.*read within 3 instructions: ([0-9]+)$/\1/p' | awk '{s += $1} END {print s + 0}')
echo "kernels_basic.cu: $total global loads read within 3 instructions in all"
[ "$total" -gt 0 ] || fail "no load in kernels_basic.cu is read at once: the detector finds nothing"
if python3 "$tool" "$dir/basic.cubin" '.' --load-use x 2>/dev/null; then fail "--load-use x passed"; fi
echo "sass_load_use: all checks passed"
