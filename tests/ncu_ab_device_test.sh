#!/usr/bin/env bash
# bench/ncu_ab_device.sh without a GPU: fake ncu, nvidia-smi and sparrow builds (A slower than B)
# on PATH and in two folders; the rows it keeps, its summary's medians per build and launch, the
# layer's medians, and clear errors for a missing build and a missing ncu.
set -euo pipefail
root="$1" dir="$2"
rm -rf "$dir" && mkdir -p "$dir/fakebin" "$dir/A/lib" "$dir/B"
fail() { echo "FAIL: $*"; exit 1; }
cat >"$dir/fakebin/nvidia-smi" <<'SH'
#!/bin/sh
echo "Fake GPU, 1.0, 1980 MHz"
SH
# ncu: runs nothing, prints two launches' metrics; the time is the build's (ns beside its sparrow)
# plus 1 us on launch 1, plus 0, 9 and 3 us in its 1st, 2nd and 3rd call (median 3, mean 4).
cat >"$dir/fakebin/ncu" <<'SH'
#!/bin/sh
for a in "$@"; do case $a in */sparrow) bin=$a ;; esac; done
d=$(dirname "$bin")
calls=$(($(cat "$d/ncu_calls" 2>/dev/null || echo 0) + 1)); echo $calls >"$d/ncu_calls"
case $calls in 2) off=9000 ;; 3) off=3000 ;; *) off=0 ;; esac
base=$(($(cat "$d/ns") + off))
for i in 0 1; do
  t=$((base + 1000 * i))
  echo "\"$i\",\"1\",\"sparrow\",\"h\",\"k\",\"1\",\"7\",\"(256, 1, 1)\",\"(8192, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"ns\",\"$t\""
  echo "\"$i\",\"1\",\"sparrow\",\"h\",\"k\",\"1\",\"7\",\"(256, 1, 1)\",\"(8192, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"smsp__inst_executed.sum\",\"inst\",\"1,000,000\""
  echo "\"$i\",\"1\",\"sparrow\",\"h\",\"k\",\"1\",\"7\",\"(256, 1, 1)\",\"(8192, 1, 1)\",\"0\",\"9.0\",\"Launch Statistics\",\"launch__grid_size\",\"\",\"8,192\""
done
SH
for b in A B; do
  cat >"$dir/$b/sparrow" <<'SH'
#!/bin/sh
d=$(dirname "$0")
case $1 in
  synth) shift; while [ $# -gt 0 ]; do [ "$1" = --out ] && { mkdir -p "$2"; echo '{}' >"$2/config.json"; }; shift; done; exit 0 ;;
esac
# bench: the layer's time is the build's (ms beside it) plus 0, 0.3 and 0.1 ms in its 1st, 2nd and 3rd run.
calls=$(($(cat "$d/bench_calls" 2>/dev/null || echo 0) + 1)); echo $calls >"$d/bench_calls"
case $calls in 2) off=0.3 ;; 3) off=0.1 ;; *) off=0 ;; esac
ms=$(awk -v a="$(cat "$d/ms")" -v b=$off 'BEGIN {print a + b}')
while [ $# -gt 0 ]; do
  [ "$1" = --out ] && echo "{\"prefill\": [{\"layer\": 2, \"time_ms\": $ms, \"min_ms\": 1.0, \"max_ms\": 30.0, \"reps\": 20}]}" >"$2"
  shift
done
SH
  chmod +x "$dir/$b/sparrow"
done
chmod +x "$dir/fakebin/"*
echo 4500000 >"$dir/A/ns"; echo 19.5 >"$dir/A/ms"
echo 4400000 >"$dir/B/ns"; echo 19.25 >"$dir/B/ms"
run() { PATH="$dir/fakebin:$PATH" A="$dir/A" B="$dir/B" MODEL="$dir/model" OUT="$dir/out" TESTS=0 ROUNDS=3 bash "$root/bench/ncu_ab_device.sh"; }
out=$(run)
echo "$out"
[ "$(wc -l <"$dir/out/ncu.txt")" = 36 ] || fail "ncu.txt has $(wc -l <"$dir/out/ncu.txt") rows, not 2 builds x 3 rounds x 2 launches x 3 metrics"
echo "$out" | grep -Eq '^  A launch 0: 4503\.0 us \(4500\.0-4509\.0, n 3\), 1\.0 M instr, grid 8192$' || fail "A's launch 0 (median 4503, range 4500-4509)"
echo "$out" | grep -Eq '^  B launch 1: 4404\.0 us \(4401\.0-4410\.0, n 3\)' || fail "B's launch 1 (median 4404, range 4401-4410)"
echo "$out" | grep -q '^  A layer 2: 19.600 ms (19.500-19.800, n 3)' || fail "A's layer (median 19.6, range 19.5-19.8)"
echo "$out" | grep -q '^  B layer 2: 19.350 ms (19.250-19.550, n 3)' || fail "B's layer (median 19.35, range 19.25-19.55)"
if PATH="$dir/fakebin:/usr/bin:/bin" A="$dir/A" B="$dir/B" MODEL="$dir/model" OUT="$dir/out3" TESTS=0 \
  bash -c 'rm -f "$0"/ncu; bash "$1"' "$dir/fakebin" "$root/bench/ncu_ab_device.sh" 2>"$dir/err"; then
  fail "a run without ncu passed"
fi
grep -q "ncu is not on PATH" "$dir/err" || fail "the missing ncu's error: $(cat "$dir/err")"
rm "$dir/B/sparrow"
if PATH="$dir/fakebin:$PATH" A="$dir/A" B="$dir/B" MODEL="$dir/model" OUT="$dir/out2" TESTS=0 bash "$root/bench/ncu_ab_device.sh" 2>"$dir/err"; then
  fail "a missing build passed"
fi
grep -q "no $dir/B/sparrow (or sparrow.xz)" "$dir/err" || fail "the missing build's error: $(cat "$dir/err")"
echo "ncu_ab_device: all checks passed"
