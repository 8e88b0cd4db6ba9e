#!/usr/bin/env bash
# One kernel of two builds, alternated on a lent GPU (bench/README.md, "One kernel of two builds"):
# the branch build's GPU tests first (optional), then per round and build `ncu` of the kernels
# matching KREGEX in one layer's cells (time and instructions per launch) and `sparrow bench` of
# the same cells (the layer's own time), both builds in turn, so that the machine's drift falls on
# both. Rows go to $OUT/ncu.txt and $OUT/layer.txt as they are measured, so a cut run keeps them.
# (scripts/gpu-probe.sh NCU_CELLS/NCU_BINS runs ncu's sections once a binary, for where a kernel's
# time goes; this one repeats a few metrics and gives medians, for whether a change moved it.)
#
#   bash bench/ncu_ab_device.sh          (environment knobs, all optional:)
#     A=.gpu-carry  B=.gpu-carry/b   folders holding each build's sparrow (+ sparrow_cuda_tests in B),
#                                   or sparrow.xz / sparrow_cuda_tests.xz, unpacked here; the shared
#                                   libraries from A/lib (scripts/prepare-gpu-carry.sh)
#     KREGEX=attention_wg_kernel     the kernels ncu times (a regex over their names)
#     COUNT=4                        launches profiled a run (the attention's 8K prefill: launches 1, 2)
#     CELLS="--layers 2 --batches 1 --contexts 4k --prefill 8k --model-step 0 --gemm-tokens 0"
#     SYNTH_LAYERS=3 EXPERTS=16      the synthetic V4-Flash written for it (layer 2 is CSA)
#     MODEL=/tmp/sparrow-v4f3-e16    where it goes
#     ROUNDS=4  TESTS=1  LIMIT=480   rounds; whether B's sparrow_cuda_tests run first; wall seconds
#     OUT=/tmp/ncu-ab                where the rows go
# Rows: ncu.txt "build round launch metric value" (gpu__time_duration.sum in ns,
# smsp__inst_executed.sum, launch__grid_size); layer.txt "build round layer L kind median min max reps".
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
a_dir=${A:-.gpu-carry} b_dir=${B:-.gpu-carry/b}
kregex=${KREGEX:-attention_wg_kernel} count=${COUNT:-4}
cells=${CELLS:---layers 2 --batches 1 --contexts 4k --prefill 8k --model-step 0 --gemm-tokens 0}
synth_layers=${SYNTH_LAYERS:-3} experts=${EXPERTS:-16}
model=${MODEL:-/tmp/sparrow-v4f$synth_layers-e$experts}
rounds=${ROUNDS:-4} tests=${TESTS:-1} limit=${LIMIT:-480}
out=${OUT:-/tmp/ncu-ab}
mkdir -p "$out"
for d in "$a_dir" "$b_dir"; do
  for f in "$d"/sparrow.xz "$d"/sparrow_cuda_tests.xz; do
    [ -f "$f" ] && { xz -dkf "$f" && chmod +x "${f%.xz}" || { echo "ncu_ab_device: cannot unpack $f" >&2; exit 1; }; }
  done
  [ -x "$d/sparrow" ] || { echo "ncu_ab_device: no $d/sparrow (or sparrow.xz): build both with scripts/prepare-gpu-carry.sh" >&2; exit 1; }
done
command -v ncu >/dev/null || { echo "ncu_ab_device: ncu is not on PATH" >&2; exit 1; }
case $a_dir in /*) lib=$a_dir/lib ;; *) lib=$PWD/$a_dir/lib ;; esac
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SPARROW_FIXTURES_DIR=$PWD/tests/fixtures
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/card.txt"
if [ "$tests" = 1 ]; then
  if [ -x "$b_dir/sparrow_cuda_tests" ]; then
    timeout 200 "$b_dir/sparrow_cuda_tests" >"$out/tests_b.txt" 2>&1
    echo "[$(el)s] B's GPU tests: exit $?; $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests_b.txt" | tr '\n' ' ')"
  else
    echo "ncu_ab_device: TESTS=1 but no $b_dir/sparrow_cuda_tests" >&2
    exit 1
  fi
fi
if [ ! -f "$model/config.json" ]; then
  "$a_dir/sparrow" synth --preset v4-flash --layers "$synth_layers" --experts "$experts" --out "$model" >"$out/synth.log" 2>&1 ||
    { echo "ncu_ab_device: synth failed ($out/synth.log)" >&2; exit 1; }
fi
: >"$out/ncu.txt"
: >"$out/layer.txt"
# shellcheck disable=SC2086
for r in $(seq 1 "$rounds"); do
  for v in A B; do
    [ "$(el)" -gt $((limit - 40)) ] && { echo "[$(el)s] stopped before round $r $v: LIMIT=$limit"; break 2; }
    bin=$a_dir/sparrow
    [ $v = B ] && bin=$b_dir/sparrow
    timeout 120 ncu -k "regex:$kregex" -c "$count" --csv --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__grid_size \
      "$bin" bench --model "$model" $cells --precision fast --peak-reps 1 --copy-gib 0.25 --warmup 1 --min-reps 1 --max-reps 1 \
      >"$out/ncu-$v-$r.csv" 2>"$out/ncu-$v-$r.err"
    grep -E '"(gpu__time_duration.sum|smsp__inst_executed.sum|launch__grid_size)"' "$out/ncu-$v-$r.csv" |
      awk -F'","' -v v=$v -v r="$r" '{gsub(/"/, "", $1); gsub(/[",]/, "", $NF); print v, r, $1, $(NF - 2), $NF}' >>"$out/ncu.txt"
    timeout 90 "$bin" bench --model "$model" $cells --precision fast --peak-reps 1 --copy-gib 0.25 --out "$out/bench-$v-$r.json" \
      >"$out/bench-$v-$r.txt" 2>&1
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for c in d["prefill"]:
    print(sys.argv[2], sys.argv[3], "layer", c["layer"], "prefill", c["time_ms"], c["min_ms"], c["max_ms"], c["reps"])' \
      "$out/bench-$v-$r.json" $v "$r" >>"$out/layer.txt" 2>>"$out/layer.err"
    echo "[$(el)s] round $r $v"
  done
done
python3 - "$out/ncu.txt" "$out/layer.txt" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    v, r, i, metric, value = line.split()
    t.setdefault((v, i, metric), []).append(float(value))
print("kernel launches (ncu): build, launch, median time us (min-max, n), instructions, grid")
for (v, i, metric), xs in sorted(t.items()):
    if metric != "gpu__time_duration.sum":
        continue
    ins = t.get((v, i, "smsp__inst_executed.sum"), [0])[0]
    grid = t.get((v, i, "launch__grid_size"), [0])[0]
    print(f"  {v} launch {i}: {statistics.median(xs) / 1e3:.1f} us ({min(xs) / 1e3:.1f}-{max(xs) / 1e3:.1f}, n {len(xs)}), {ins / 1e6:.1f} M instr, grid {grid:.0f}")
lay = {}
for line in open(sys.argv[2]):
    x = line.split()
    lay.setdefault((x[0], x[3]), []).append(float(x[5]))
print("layer prefill (sparrow bench medians): build, layer, median of runs ms (min-max)")
for (v, l), xs in sorted(lay.items()):
    print(f"  {v} layer {l}: {statistics.median(xs):.3f} ms ({min(xs):.3f}-{max(xs):.3f}, n {len(xs)})")
PY
echo "[$(el)s] end"
