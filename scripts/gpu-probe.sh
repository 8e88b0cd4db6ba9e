#!/usr/bin/env bash
# Quick measurements on a lent GPU machine between full runs (docs/device-sessions.md): a filtered
# test run, a one-layer benchmark with the per-op breakdown, ncu on chosen kernels, the W4A8 SASS.
# Each part runs when its variable is set; everything it keeps goes to $OUT (at most 8 files back).
#
#   TESTS='CudaOps.Moe*:*W4A8*'           sparrow_cuda_tests --gtest_filter (failures printed)
#   TEST_REPEAT=20 TEST_TIMEOUT=300       with TESTS: the filter run that many times over (gtest's
#                                         --gtest_repeat), under a limit of that many seconds; past it
#                                         the run is stopped and the test it was in is named (a hang)
#   SANITIZE='synccheck racecheck'        with TESTS: the filter once under each compute-sanitizer
#                                         tool (memcheck, racecheck, synccheck, initcheck), each under
#                                         TEST_TIMEOUT, its error summary printed (and the kernels
#                                         racecheck's reports name, with their lines' count)
#   BIN=.gpu-carry                        the folder of the binaries (and lib/)
#   BENCH='--batches 1,256 --prefill 8k'  sparrow bench on layer 0 of a 1-layer synthetic V4-Flash
#   BENCH_BINS='sparrow.base sparrow'     the binaries of .gpu-carry the bench runs, in turn (default
#                                         sparrow; an A/B within one call: machine starts differ)
#   LAYER=2 SYNTH_LAYERS=3 CONTEXTS=4k,128k  the layer benchmarked (0: SWA, 2: CSA, 3: HCA), the
#                                         layers of the synthetic model written for it, the contexts
#   NCU_CELLS='--batches 256 --prefill 0' ncu on the kernels matching KREGEX (default w4a8) in those
#                                         bench cells (';' separates cells; SKIP launches skipped first)
#   NCU_COUNT=2 NCU_CONTEXTS=4k            with NCU_CELLS: the launches profiled, the cells' contexts;
#   NCU_ARGS='--clock-control none'       more ncu options (that one: the boost clocks the bench runs at)
#   NCU_FULL=1 NCU_BINS='sparrow.base sparrow'  with NCU_CELLS: ncu's whole report of each cell
#                                         into $OUT/ncu-<bin>-<cell>.txt (more sections), for each binary
#   NCU_SOURCE=1                          with NCU_CELLS: also the per-instruction counters (SASS,
#                                         stall samples) as CSV into $OUT/ncu-source-<bin>-<cell>.csv,
#                                         summarised (bench/ncu_source.py); a kernel of few blocks
#                                         wants NCU_ARGS='--warp-sampling-interval 0' for enough samples
#   SASS=1 SASS_REGEX=w4a8                the SASS of the kernels whose mangled names match into
#                                         $OUT/kernels.sass
#
# Binaries: .gpu-carry (scripts/prepare-gpu-carry.sh), carried with the device tool's `carry`.
set -u
cd "$(dirname "$0")/.." || exit 1
bin_dir=${BIN:-.gpu-carry}
export LD_LIBRARY_PATH=$PWD/$bin_dir/lib
sanitizer=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
out=${OUT:-/tmp/gpu-probe-out}
mkdir -p "$out"
t0=$(date +%s)
layers=${SYNTH_LAYERS:-1}
model=${MODEL:-/tmp/sparrow-v4f$layers-256}
ensure_model() {
  [ -f "$model/config.json" ] || "$bin_dir/sparrow" synth --preset v4-flash --layers "$layers" --experts 256 --out "$model" 2>&1 | tail -1
}
# The test it was in when a run stopped: the last "[ RUN" line without its "[       OK" or "[  FAILED".
hung_test() {
  awk '/^\[ RUN      \]/ {t = $4} /^\[       OK \]|^\[  FAILED  \]/ {if ($4 == t) t = ""} END {print (t == "" ? "(between tests)" : t)}' "$1"
}
if [ -n "${TESTS:-}" ]; then
  limit=${TEST_TIMEOUT:-300}
  log=/tmp/gpu-probe-tests.txt
  timeout "$limit" "$bin_dir/sparrow_cuda_tests" --gtest_filter="$TESTS" --gtest_repeat="${TEST_REPEAT:-1}" > "$log" 2>&1
  rc=$?
  echo "tests rc=$rc"
  if [ "$rc" -eq 124 ]; then
    round=$(grep -c '^Repeating all tests' "$log")
    echo "tests stopped after ${limit} s in $(hung_test "$log") (round $((round > 0 ? round : 1)))"
  fi
  echo "rounds passed: $(grep -c '^\[  PASSED  \]' "$log")"
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$log" | head -40
  for tool in ${SANITIZE:-}; do
    case $tool in memcheck|racecheck|synccheck|initcheck) ;; *) echo "SANITIZE: no compute-sanitizer tool '$tool' (memcheck, racecheck, synccheck, initcheck)"; continue ;; esac
    slog=/tmp/gpu-probe-$tool.txt
    timeout "$limit" "$sanitizer" --tool "$tool" "$bin_dir/sparrow_cuda_tests" --gtest_filter="$TESTS" > "$slog" 2>&1
    rc=$?
    if [ "$rc" -eq 124 ]; then
      echo "$tool: stopped after ${limit} s in $(hung_test "$slog")"
    else
      echo "$tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$slog" | tail -1)"
    fi
    # The kernels its reports name, by how many of their lines do (racecheck reports a hazard in one
    # of two forms: "Race reported between ... access at K+0x..", "Potential .. hazard" with
    # "Read Thread (..) at K+0x.."). docs/cuda.md, "compute-sanitizer", says which are expected.
    grep -E 'Race reported between|^=========     (and )?(Read|Write) (access|Thread)' "$slog" | grep -oE ' at (void )?[^ ].*\+0x[0-9a-f]+' |
      sed -E 's/^ at (void )?//; s/\+0x[0-9a-f]+$//; s/sparrow::cuda::(<unnamed>::)?//g; s/\([^()]*\)$//' | sort | uniq -c | sort -rn | head -12 |
      sed "s/^/  $tool names: /"
  done
fi
if [ -n "${BENCH:-}" ]; then
  ensure_model
  for bin in ${BENCH_BINS:-sparrow}; do
    echo "== bench with $bin_dir/$bin"
    # shellcheck disable=SC2086  # BENCH is a list of arguments
    $bin_dir/$bin bench --model "$model" --layers "${LAYER:-0}" $BENCH --contexts "${CONTEXTS:-4k}" --gemm-tokens 0 --precision fast \
      --breakdown --peak-reps 3 --copy-gib 0.5 --out "$out/probe-bench-$bin.json" > /tmp/gpu-probe-bench.txt 2>&1
    echo "bench rc=$?"
    grep -vE "^\s*$" /tmp/gpu-probe-bench.txt | head -${BENCH_LINES:-100}
  done
fi
if [ -n "${NCU_CELLS:-}" ]; then
  ensure_model
  IFS=';' read -ra cells <<< "$NCU_CELLS"
  sections=(--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats)
  [ -n "${NCU_FULL:-}" ] && sections+=(--section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats)
  [ -n "${NCU_SOURCE:-}" ] && sections+=(--section SourceCounters --import-source no -f -o /tmp/gpu-probe-ncu)
  for bin in ${NCU_BINS:-sparrow}; do
    i=0
    for cell in "${cells[@]}"; do
      echo "== ncu $bin $cell"
      # shellcheck disable=SC2086
      timeout 200 /usr/local/cuda/bin/ncu ${NCU_ARGS:-} --kernel-name "regex:${KREGEX:-w4a8}" --launch-skip "${SKIP:-0}" --launch-count "${NCU_COUNT:-2}" \
        "${sections[@]}" \
        $bin_dir/$bin bench --model "$model" --layers "${LAYER:-0}" $cell --contexts "${NCU_CONTEXTS:-4k}" --gemm-tokens 0 --precision fast \
        --warmup 1 --min-reps 1 --max-reps 1 --peak-reps 1 --copy-gib 0.1 --out /tmp/gpu-probe-ncu.json > /tmp/gpu-probe-ncu.txt 2>&1
      if [ -n "${NCU_SOURCE:-}" ]; then  # the report went to a file: its details, then its source page
        /usr/local/cuda/bin/ncu -i /tmp/gpu-probe-ncu.ncu-rep >> /tmp/gpu-probe-ncu.txt 2>&1
        /usr/local/cuda/bin/ncu -i /tmp/gpu-probe-ncu.ncu-rep --page source --csv --print-source sass > "$out/ncu-source-$bin-$i.csv" 2>&1
        python3 bench/ncu_source.py "$out/ncu-source-$bin-$i.csv" --top 12 2>&1 | head -${SOURCE_LINES:-70}
      fi
      if [ -n "${NCU_FULL:-}" ]; then
        cp /tmp/gpu-probe-ncu.txt "$out/ncu-$bin-$i.txt"
      else
        grep -E "\(.*\)x\(|Duration|DRAM Throughput|Compute \(SM\)|Issued Instructions  |Registers|Achieved Occupancy|Warp Cycles Per Issued" \
          /tmp/gpu-probe-ncu.txt | head -40
      fi
      i=$((i + 1))
    done
  done
fi
if [ -n "${SASS:-}" ]; then
  /usr/local/cuda/bin/cuobjdump -sass "$bin_dir/sparrow" > /tmp/gpu-probe-all.sass 2>&1
  awk -v re="${SASS_REGEX:-w4a8}" '/Function : /{p = ($0 ~ re)} p' /tmp/gpu-probe-all.sass > "$out/kernels.sass"
fi
echo "gpu-probe done in $(( $(date +%s) - t0 )) s"
