#!/usr/bin/env bash
# The issue-6 benchmark in one command on a lent H200 (bench/README.md): writes the synthetic
# 8-layer V4-Flash with all 256 experts (unless it is already there), then runs `sparrow bench` on
# it within the device's 10-minute command limit. The JSON report is rewritten after every cell
# straight into $OUT, so even a run that is cut short brings back what it measured.
#
#   bash bench/run_device.sh            (environment knobs, all optional:)
#     BIN=.gpu-carry   folder holding sparrow built on the CPU machine (+ lib/): scripts/prepare-gpu-carry.sh
#     MODEL=/tmp/sparrow-v4f8-256   where the synthetic model goes (about 31 GB for 8 layers)
#     LAYERS=8              its main layers (SWA, SWA, CSA, HCA, CSA, HCA, CSA, HCA)
#     LIMIT_S=570           wall seconds this script may use in all (the device allows 600)
#     BENCH_ARGS="..."      extra arguments for sparrow bench (e.g. --layers 0-3 --batches 1,8)
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bin=${BIN:-.gpu-carry}
model=${MODEL:-/tmp/sparrow-v4f8-256}
layers=${LAYERS:-8}
limit=${LIMIT_S:-570}
out=${OUT:-/tmp/sparrow-bench-out}
mkdir -p "$out"
log="$out/run_device.log"
say() { echo "[run_device $(( $(date +%s) - t0 ))s] $*" | tee -a "$log"; }

[ -x "$bin/sparrow" ] || { say "no $bin/sparrow: build it on the CPU machine and carry $bin (bench/README.md)"; exit 1; }
# The shared libraries sparrow links (cpp-httplib, brotli), carried in $bin/lib (docs/cuda.md).
case $bin in /*) lib=$bin/lib ;; *) lib=$PWD/$bin/lib ;; esac
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuBLASLt for the GEMM peaks (opened with dlopen): the CUDA toolkit's, or the pip wheel's.
if [ -z "${SPARROW_CUBLASLT:-}" ]; then
  lt=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libcublasLt.so.13" ] && { lt="$d/libcublasLt.so.13"; break; }
  done
  if [ -z "$lt" ]; then
    for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      lt=$(find "$sp/nvidia" -maxdepth 4 -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
      [ -n "$lt" ] && break
    done
  fi
  [ -n "$lt" ] && export SPARROW_CUBLASLT="$lt"
fi
say "cuBLASLt: ${SPARROW_CUBLASLT:-not found (GEMM peaks fall back to the datasheet)}"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  | tee -a "$log"
df -h /tmp | tail -1 | tee -a "$log"

if [ ! -f "$model/config.json" ]; then
  say "writing the synthetic V4-Flash: $layers layers, 256 experts -> $model"
  "$bin/sparrow" synth --preset v4-flash --layers "$layers" --experts 256 --out "$model" 2>&1 | tail -2 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "synth failed"; exit 1; }
fi
du -sh "$model" | tee -a "$log"

elapsed=$(( $(date +%s) - t0 ))
# Cells start until the budget is spent; the slowest cell (a prefill) takes well under 60 s.
budget=$(( limit - elapsed - 60 ))
[ "$budget" -gt 60 ] || { say "only $budget s left after synth: run again (the model is written)"; exit 1; }
say "sparrow bench, time budget $budget s"
# timeout: a hard stop 10 s before the limit, should a cell overrun (the JSON keeps every finished cell).
timeout $(( limit - elapsed - 10 )) "$bin/sparrow" bench --model "$model" --time-budget "$budget" \
  --target-s 0.5 --max-reps 10 --out "$out/" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt"
rc=${PIPESTATUS[0]}
say "sparrow bench exit status $rc; results: $(ls "$out"/*.json 2>/dev/null | tr '\n' ' ')"
exit "$rc"
