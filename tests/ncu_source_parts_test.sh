#!/usr/bin/env bash
# bench/ncu_source.py's --landmarks and --part on a small hand-made ncu source CSV: the landmarks
# with the share of samples before each, a part's share and its largest stall reasons, a file of
# several kernels' listings (--kernel), and clear errors.
set -euo pipefail
script="$1/bench/ncu_source.py"
dir="$2"
mkdir -p "$dir"
csv="$dir/src.csv"
cat > "$csv" <<'CSV'
"Kernel Name","void k()",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_wait","stall_barrier (Not Issued)"
"0x0","      LDC R1, c[0x0][0x28]","10","10","4","0","10","0"
"0x10","      BAR.SYNC.DEFER_BLOCKING 0x0","30","30","4","30","0","30"
"0x20","      HGMMA.64x32x16.F32.BF16 R152, gdesc[UR8], RZ","40","40","8","0","40","0"
"0x30","      EXIT","20","20","4","5","15","0"
"0x40","      BRA 0x40","0","0","0","0","0","0"
CSV
fail() { echo "FAIL: $*"; exit 1; }
out=$(python3 "$script" "$csv" --landmarks)
echo "$out"
echo "$out" | grep -q "^instructions: 5 in the SASS, 20 executed (warp instructions), 100 warp-state samples$" || fail "totals"
echo "$out" | grep -Eq "^ +1 +10\.0% +4  BAR\.SYNC" || fail "the barrier's row and the 10 % before it"
echo "$out" | grep -Eq "^ +3 +80\.0% +4  EXIT" || fail "the exit's row and the 80 % before it"
echo "$out" | grep -q "^ .*  BRA 0x40" && fail "a branch never executed is not a landmark"
parts=$(python3 "$script" "$csv" --part head:0:2 --part tail:2:-1)
echo "$parts"
echo "$parts" | grep -q "^head: 40.0% of the samples; barrier 75%, wait 25%" || fail "the head part"
echo "$parts" | grep -q "^tail: 60.0% of the samples; wait 92%, barrier 8%" || fail "the tail part"
echo "$parts" | grep -q "^landmarks" && fail "landmarks listed without --landmarks"
if python3 "$script" "$csv" --part bad:0 2> "$dir/err"; then fail "a part without an end accepted"; fi
grep -q "'bad:0' is not name:first:end" "$dir/err" || fail "the part's error"
if python3 "$script" "$csv" --part back:3:1 2> "$dir/err"; then fail "a part ending before it starts accepted"; fi
grep -q "'back:3:1': rows need 0 <= first < end" "$dir/err" || fail "the backward part's error"
if python3 "$script" "$csv" --part neg:-2:-1 2> "$dir/err"; then fail "a part with a negative first row accepted"; fi
grep -q "'neg:-2:-1': rows need" "$dir/err" || fail "the negative part's error"
# A report of several listings (gpu-probe.sh with NCU_COUNT=2 wrote four), each under its own
# kernel-name and header rows. The first is read unless --kernel picks another.
two="$dir/two.csv"
{ cat "$csv"; cat <<'CSV'
"Kernel Name","void k2()",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_wait","stall_barrier (Not Issued)"
"0x0","      LDC R1, c[0x0][0x28]","6","6","2","0","6","0"
"0x10","      EXIT","2","2","2","0","2","0"
CSV
} > "$two"
first=$(python3 "$script" "$two")
echo "$first" | grep -q "^kernel: void k() (listing 1 of 2; --kernel picks another)$" || fail "the first listing's name"
echo "$first" | grep -q "^instructions: 5 in the SASS, 20 executed (warp instructions), 100 warp-state samples$" || fail "the first listing's totals"
second=$(python3 "$script" "$two" --kernel 2)
echo "$second" | grep -q "^kernel: void k2() (listing 2 of 2; --kernel picks another)$" || fail "the second listing's name"
echo "$second" | grep -q "^instructions: 2 in the SASS, 4 executed (warp instructions), 8 warp-state samples$" || fail "the second listing's totals"
one=$(python3 "$script" "$csv")
echo "$one" | grep -q "^kernel: void k()$" || fail "one listing's name, without a count"
if python3 "$script" "$two" --kernel 3 2> "$dir/err"; then fail "a third listing of two accepted"; fi
grep -q "listing 3 asked for, the file holds 2" "$dir/err" || fail "the listing count's error"
echo "not a csv" > "$dir/bad.csv"
if python3 "$script" "$dir/bad.csv" 2> "$dir/err"; then fail "a file without the header accepted"; fi
grep -q "no header with Source" "$dir/err" || fail "the header's error"
echo "ncu_source.py landmarks and parts: all passed"
