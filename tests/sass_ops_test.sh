#!/usr/bin/env bash
# bench/sass_ops.py on a cubin of kernels_moe.cu (scripts/kernel-sizes.sh with KEEP): router_kernel<0>'s
# opcodes counted, their counts summing to its instruction count, one at least an EXIT and one a
# global load; --ops in the order asked; clear errors for a kernel the cubin lacks and a file that
# is not a cubin.
set -euo pipefail
root="$1" build="$2" dir="$3"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
KEEP="$dir/moe.cubin" bash "$root/scripts/kernel-sizes.sh" src/backends/cuda/kernels_moe.cu "$build" 3 >/dev/null
tool="$root/bench/sass_ops.py"
out=$(python3 "$tool" "$dir/moe.cubin" 'router_kernelILi0E')
echo "$out"
total=$(echo "$out" | sed -n 's/^.*router_kernel.*: \([0-9]*\) instructions$/\1/p' | head -1)
[ -n "$total" ] && [ "$total" -gt 0 ] || fail "router_kernel<0>'s instruction count"
sum=$(echo "$out" | sed -n 2p | tr ' ' '\n' | awk -F: 'NF == 2 {s += $2} END {print s}')
[ "$sum" = "$total" ] || fail "the opcodes' counts sum to $sum, not $total"
echo "$out" | sed -n 2p | grep -Eq '(^| )EXIT:[1-9]' || fail "no EXIT counted"
echo "$out" | sed -n 2p | grep -Eq '(^| )LDG:[1-9]' || fail "no global load counted"
ops=$(python3 "$tool" "$dir/moe.cubin" 'router_kernelILi0E' --ops EXIT,NOSUCHOP | sed -n 2p)
echo "$ops" | grep -Eq '^  EXIT:[1-9][0-9]* NOSUCHOP:0$' || fail "--ops: '$ops'"
seq=$(python3 "$tool" "$dir/moe.cubin" 'router_kernelILi0E' --seq | grep -c '^  [0-9a-f]\{6\} ')
[ "$seq" = "$total" ] || fail "--seq lists $seq instructions, not $total"
if python3 "$tool" "$dir/moe.cubin" 'no_such_kernel' 2>"$dir/err.txt"; then fail "a missing kernel passed"; fi
grep -q "no kernel of .* matches 'no_such_kernel'" "$dir/err.txt" || fail "the missing kernel's error: $(cat "$dir/err.txt")"
echo "not a cubin" > "$dir/bad.cubin"
if python3 "$tool" "$dir/bad.cubin" 'x' 2>"$dir/err.txt"; then fail "a text file passed"; fi
grep -q "not a 64-bit little-endian ELF file" "$dir/err.txt" || fail "the bad file's error: $(cat "$dir/err.txt")"
echo "sass_ops: all checks passed"
