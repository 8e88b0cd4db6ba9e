#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a usable GPU (CI): it must fail, say so in its last
# line, and not count a run of GPU tests that all skipped as a pass; each row's result must also
# have been written as it came (progress.txt, the table's rows in the same number), so that a run
# stopped by a time limit still shows what it checked.
#   tests/gpu_check_without_gpu.sh SCRIPT BIN_DIR LOG_DIR   (exit 77 where a GPU is present)
set -u
script=$1 bin=$2 logs=$3
if nvidia-smi -L >/dev/null 2>&1; then exit 77; fi
rm -rf "$logs" && mkdir -p "$logs"
if bash "$script" --bin "$bin" --logs "$logs/run" >"$logs/out.txt" 2>"$logs/err.txt"; then
  echo "gpu-check passed without a GPU"; exit 1
fi
tail -1 "$logs/out.txt" | grep -Eq '^gpu-check: [0-9]+ FAILED$' || { echo "no FAILED line:"; tail -3 "$logs/out.txt"; exit 1; }
[ -f "$logs/run/progress.txt" ] || { echo "no progress.txt in the log folder"; exit 1; }
if grep -E '^\[gpu-check [0-9]+ s\] PASS: CudaOps' "$logs/run/progress.txt"; then
  echo "a filter of GPU tests that ran none passed"; exit 1
fi
table=$(grep -cE '^\| .* \| (PASS|FAIL) \|' "$logs/out.txt")
progress=$(grep -cE '^\[gpu-check [0-9]+ s\] (PASS|FAIL): ' "$logs/run/progress.txt")
streamed=$(grep -cE '^\[gpu-check [0-9]+ s\] (PASS|FAIL): ' "$logs/err.txt")
echo "table rows $table, progress lines $progress, on stderr $streamed"
[ "$table" -gt 0 ] && [ "$table" -eq "$progress" ] && [ "$table" -eq "$streamed" ]
