#!/usr/bin/env bash
# The CUDA backend's acceptance run, on a machine with a Hopper GPU: the GPU op and parity tests
# (sparrow_cuda_tests; again with each fallback forced, with every newer default off and with the
# opt-in paths on), then `sparrow logits --backend cuda` against `--backend cpu` on every
# fixture in three feeding modes (one-shot prefill, chunked prefill, token-by-token decode),
# `sparrow diff --backend-b cuda` on mixed_hc2 (every tap within the diff tolerance), and
# optionally a synthetic 2-layer V4-Flash, then the trained needle model through `sparrow needle`
# and `sparrow serve` on CUDA (tools/serve_check.py). Ends with a summary table; exit status 0 when
# all pass. Each check's row also goes to stderr and to LOGS/progress.txt as soon as it is known (a
# run cut short by a time limit still shows what it checked); a run of GPU tests that runs none
# (every one skipped: no usable GPU) is a failure, not a pass.
#
#   scripts/gpu-check.sh [--bin DIR] [--no-gtest] [--all-reruns] [--synth] [--synth-layers N] [--synth-tokens N] [--logs DIR]
#     --bin DIR   use sparrow, sparrow_cuda_tests and sparrow_npy_compare from DIR (built elsewhere;
#                 CUDA runtime linked statically; shared libraries in DIR/lib are found without
#                 LD_LIBRARY_PATH); default: configure and build build-gpu/ here
#     --no-gtest  skip section 1, the sparrow_cuda_tests rows (for a build whose GPU tests passed in an
#                 earlier call: the CLI, diff, synthetic and needle rows then fit beside a benchmark)
#     --all-reruns  when tests failed, rerun them under each switch even where they fail with every
#                 switch off too (by default such a failure skips the ~50 single-switch reruns: it
#                 is not in a switchable path alone, and the reruns cost device time: an estimated
#                 100 s, the 2026-12-05 runs with failures taking 413-446 s against ~350 without)
#     --synth     also write a synthetic V4-Flash with `sparrow synth` (real dimensions, released
#                 formats, 8 experts a layer, mHC scales spread around 1 by --hc-scale-std 0.1;
#                 2 layers are about 2.6 GB, in $TMPDIR or /tmp) and
#                 compare CUDA with CPU logits on a prompt, one-shot and token by token
#     --synth-layers N  its main layers (default 2: SWA, SWA; 4 adds a CSA and an HCA layer)
#     --synth-tokens N  prompt length (default 40; 128 or more lets the HCA layer emit an entry)
#     --logs DIR  where logs and .npy files go (default: $OUT if set, else /tmp/sparrow-gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="" gtest=1 all_reruns=0 synth=0 synth_layers=2 synth_tokens=40 logs="${OUT:-/tmp/sparrow-gpu-check}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --no-gtest) gtest=0; shift ;;
    --all-reruns) all_reruns=1; shift ;;
    --synth) synth=1; shift ;;
    --synth-layers) synth_layers="$2"; shift 2 ;;
    --synth-tokens) synth_tokens="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    *) echo "usage: $0 [--bin DIR] [--no-gtest] [--all-reruns] [--synth] [--synth-layers N] [--synth-tokens N] [--logs DIR]" >&2; exit 2 ;;
  esac
done
mkdir -p "$logs"
: >"$logs/progress.txt"
if [ -z "$bin" ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARROW_CUDA=ON >"$logs/build.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target sparrow sparrow_cuda_tests sparrow_npy_compare >>"$logs/build.log" 2>&1 ||
    { tail -30 "$logs/build.log"; echo "gpu-check: build failed"; exit 1; }
  bin=build-gpu/bin
fi
bin=$(cd "$bin" && pwd)
# The shared libraries carried beside binaries built elsewhere (scripts/prepare-gpu-carry.sh puts
# them in DIR/lib): found without the caller's LD_LIBRARY_PATH.
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SPARROW_FIXTURES_DIR="$root/tests/fixtures"

card=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$card" ] || card="(nvidia-smi found no GPU)"
rows=()   # check<TAB>result<TAB>detail
failures=0
start=$(date +%s)
# Each check's result also goes to stderr (and $logs/progress.txt) as it is known: the table comes
# only at the end, so a run stopped by a time limit still shows what it had checked.
row() {
  rows+=("$1"$'\t'"$2"$'\t'"$3")
  [ "$2" = PASS ] || failures=$((failures + 1))
  echo "[gpu-check $(( $(date +%s) - start )) s] $2: $1 ($3)" | tee -a "$logs/progress.txt" >&2
}

# A sparrow that does not start (a library missing) fails every CLI row below; this row names why.
if ! "$bin/sparrow" --help >/dev/null 2>"$logs/start.log"; then
  row "$bin/sparrow starts" FAIL "$(grep -v '^$' "$logs/start.log" | tail -1 | cut -c1-200)"
fi

if [ "$gtest" -eq 1 ]; then
# 1. Every op against the CPU op, and the gtest parity suite (fixtures, every layer kind, batching).
t0=$(date +%s)
"$bin/sparrow_cuda_tests" --gtest_color=no >"$logs/gtest.log" 2>&1
rc=$?
passed=$(grep -E '^\[  PASSED  \]' "$logs/gtest.log" | grep -oE '[0-9]+' | head -1)
skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$logs/gtest.log" | grep -oE '[0-9]+' | head -1)
failed=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$logs/gtest.log" | grep -oE '[0-9]+' | head -1)
detail="passed ${passed:-0}, skipped ${skipped:-0}, failed ${failed:-0} ($(( $(date +%s) - t0 )) s)"
if [ "$rc" -eq 0 ] && [ "${skipped:-0}" -eq 0 ] && [ "${passed:-0}" -gt 0 ]; then
  row "sparrow_cuda_tests (ops + parity)" PASS "$detail"
else
  row "sparrow_cuda_tests (ops + parity)" FAIL "$detail, exit $rc"
  grep -E '^\[  FAILED  \]|Failure|CHECK failed|CUDA' "$logs/gtest.log" | head -20
fi
# The distinct failed tests of a gtest log, named (gtest prints each twice: at its end and in the summary).
failed_names() { grep -E '^\[  FAILED  \] [A-Za-z]' "$1" | sed -E 's/^\[  FAILED  \] ([^ ,]+).*/\1/' | sort -u | paste -sd' ' -; }
# The failed tests a log names; a run that ended without naming one (it crashed or was killed) is
# said so, with its exit status (the second argument) and the log's last line.
failed_detail() {
  local n; n=$(failed_names "$1")
  if [ -n "$n" ]; then echo "$(echo "$n" | wc -w) failed: $n"; return; fi
  echo "exit status ${2:-?} without a failed test's name (crashed or killed?): $(tail -1 "$1" | tr -d '|' | cut -c1-160)"
}
# One more sparrow_cuda_tests run (the command after the name and log) as a row: a pass needs exit
# status 0 and at least one test run (on a machine without a usable GPU the GPU tests skip, and a
# filter of GPU tests then runs none); skipped tests are counted in the detail.
gtest_row() {
  local name=$1 log=$2 rc passed skipped
  shift 2
  "$@" >"$log" 2>&1
  rc=$?
  passed=$(grep -E '^\[  PASSED  \]' "$log" | grep -oE '[0-9]+' | head -1)
  skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -1)
  if [ "$rc" -ne 0 ]; then
    row "$name" FAIL "$(failed_detail "$log" "$rc")"
  elif [ "${passed:-0}" -eq 0 ]; then
    row "$name" FAIL "no test ran (skipped ${skipped:-0})"
  else
    row "$name" PASS "$passed passed$([ "${skipped:-0}" -gt 0 ] && echo ", $skipped skipped")"
  fi
}
# A log file's name for a list of switches: the list with dashes, or for long lists (file names stop
# at 255 bytes) the number of switches and the list's checksum.
log_name() { local n="${1//,/-}"; [ "${#n}" -le 80 ] || n="$(echo "$1" | tr ',' '\n' | wc -l)-switches-$(echo "$1" | cksum | cut -d' ' -f1)"; echo "$n"; }
# The fallbacks the default paths replace still have to be right: the MoE op tests with the host
# plan (grouped, then one expert at a time), with the 2026-12-02 paths that give the same bits off
# (the host argmax, w1 and w3 a launch each, plain launches instead of programmatic dependent ones,
# zero-filled scratch, the bf16 roundings as passes of their own), and with every switchable path off.
# Every switchable path off at once (docs/cuda.md's list).
all_off=vec_linear,indexer_fast,grouped_moe,attn_warp,pool,async_upload,hc_split,attn_split,w4a8,fp8_gemm,bf16_gemm,w4a8_tiled,w4a8_wgmma,indexer_tiled,compressor_parallel,attn_mma,indexer_mma,attn_bf16_kv,sim_warp,hc_staged,hc_pre4,norm_regs,moe_fused_act,graphs,fp8_stack,fp8_wgmma,fp8_tma,bf16_wgmma,bf16_tma,argmax,w4a8_pair,pdl,scratch_nofill,fused_round,copy_kernels,w4a8_early,swiglu_sim,bf16_f32_in,bf16_fp8_w,attn_narrow,router_warp,rope_spread,hc_fused,select_rank,w4a8_producer,attn_q_fold,attn_o_fold,attn_overlap,parts_in_readers,attn_dims,moe_x_lazy,act_quant_shared,attn_wgmma,act_quant_half,moe_scatter_store,w4a8_ring,w4a8_persistent,attn_wg_pair,fp8_quant_in,moe_shared_beside
for off in moe_device_plan moe_device_plan,grouped_moe argmax,w4a8_pair,pdl,scratch_nofill,fused_round,copy_kernels,w4a8_early,swiglu_sim,bf16_f32_in,bf16_fp8_w,w4a8_producer,parts_in_readers,moe_scatter_store,w4a8_ring_bulk,w4a8_persistent,attn_wg_pair,fp8_quant_in,moe_shared_beside,attn_o_fold "$all_off"; do
  gtest_row "CudaOps.* with SPARROW_CUDA_DISABLE=$off" "$logs/gtest-fallback-$(log_name "$off").log" \
    env SPARROW_CUDA_DISABLE="$off" "$bin/sparrow_cuda_tests" --gtest_color=no --gtest_filter='CudaOps.*'
done
# The model-level tests with the grouped MoE alone off (`grouped_moe`: one expert at a time; the device plan
# and graphs stay on, so steps are captured only where the MoE plans on the device: begin_step).
gtest_row "parity tests with SPARROW_CUDA_DISABLE=grouped_moe" "$logs/gtest-parity-without-grouped_moe.log" \
  env SPARROW_CUDA_DISABLE=grouped_moe "$bin/sparrow_cuda_tests" --gtest_color=no --gtest_filter='*Parity*'
# The attention tests with the flash-decoding split alone off (`attn_split`; the tensor cores, which
# compute in its splits, go off with it): attention_kernel takes every call, exact weights too, in
# passes (AttentionInPasses*).
gtest_row "attention tests with SPARROW_CUDA_DISABLE=attn_split" "$logs/gtest-attention-without-attn_split.log" \
  env SPARROW_CUDA_DISABLE=attn_split "$bin/sparrow_cuda_tests" --gtest_color=no --gtest_filter='CudaOps.Attention*'
# When tests failed: run them again with the switchable fast paths off (SPARROW_CUDA_DISABLE,
# docs/cuda.md), all together first, then one at a time to name the culprit; where they fail with
# every one off as well, the single-switch reruns are skipped unless --all-reruns asks for them.
failed_tests=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/gtest.log" | sed -E 's/^\[  FAILED  \] ([^ ,]+).*/\1/' | sort -u | paste -sd: -)
# The failed tests again with the switches $1 off, as a row; returns their exit status.
rerun_without() {
  local off=$1 rc=0 log="$logs/gtest-without-$(log_name "$1").log"
  SPARROW_CUDA_DISABLE=$off "$bin/sparrow_cuda_tests" --gtest_color=no --gtest_filter="$failed_tests" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    row "failed tests with SPARROW_CUDA_DISABLE=$off" PASS "all pass: the failure is in what $off switches off"
  else
    row "failed tests with SPARROW_CUDA_DISABLE=$off" FAIL "still $(failed_detail "$log" "$rc")"
  fi
  return "$rc"
}
if [ -n "$failed_tests" ]; then
  if rerun_without "$all_off" || [ "$all_reruns" -eq 1 ]; then
    for off in moe_device_plan $(echo "$all_off" | tr ',' ' '); do rerun_without "$off"; done
  else
    row "failed tests with each switch off alone" FAIL "not rerun: they fail with every switch off too (--all-reruns reruns them)"
  fi
fi
# The paths made the defaults since 2026-12-01 (flash-decoding attention, W4A8 experts and their tiled
# kernel, cuBLASLt FP8 linears, the bf16 GEMMs, the tiled indexer scorer, the parallel compressor,
# the tensor-core attention and indexer scores) replaced ones the whole suite must still pass with:
# every GPU test with them off.
prev=attn_split,w4a8,fp8_gemm,bf16_gemm,w4a8_tiled,w4a8_wgmma,indexer_tiled,compressor_parallel,attn_mma,indexer_mma,attn_bf16_kv,sim_warp,hc_staged,hc_pre4,norm_regs,moe_fused_act,graphs,fp8_stack,fp8_wgmma,fp8_tma,bf16_wgmma,bf16_tma,argmax,w4a8_pair,pdl,scratch_nofill,fused_round,copy_kernels,w4a8_early,swiglu_sim,bf16_f32_in,bf16_fp8_w,attn_narrow,router_warp,rope_spread,hc_fused,select_rank,w4a8_producer,attn_q_fold,attn_o_fold,attn_overlap,parts_in_readers,attn_dims,moe_x_lazy,act_quant_shared,attn_wgmma,act_quant_half,moe_scatter_store,w4a8_ring,w4a8_persistent,attn_wg_pair,fp8_quant_in,moe_shared_beside
gtest_row "sparrow_cuda_tests with SPARROW_CUDA_DISABLE=$prev" "$logs/gtest-without-new.log" \
  env SPARROW_CUDA_DISABLE="$prev" "$bin/sparrow_cuda_tests" --gtest_color=no
# The opt-in paths (SPARROW_CUDA_ENABLE, docs/cuda.md) are correct but off by default (slower, or
# not yet run in the form committed): every GPU test with all of them on, so they stay right.
opt_in=kv_record,attn_wg_ahead,w4a8_expand,fp8_pair
gtest_row "sparrow_cuda_tests with SPARROW_CUDA_ENABLE=$opt_in" "$logs/gtest-opt-in.log" \
  env SPARROW_CUDA_ENABLE="$opt_in" "$bin/sparrow_cuda_tests" --gtest_color=no
# The tensor-core attention's split size is a process-wide knob (SPARROW_CUDA_ATTN_MMA_SPLIT, default
# 640): the attention and parity tests again at 128 (a CSA token's 640 candidates in 5 splits).
gtest_row "attention and parity tests with SPARROW_CUDA_ATTN_MMA_SPLIT=128" "$logs/gtest-split-128.log" \
  env SPARROW_CUDA_ATTN_MMA_SPLIT=128 "$bin/sparrow_cuda_tests" --gtest_color=no --gtest_filter='CudaOps.Attention*:*Parity*'
worst=$(grep -E '^\[cuda-parity\]' "$logs/gtest.log" | grep -oE 'max\|d\|/max\|ref\|=[0-9.e+-]+' | cut -d= -f2 | sort -g | tail -1)
[ -n "$worst" ] && row "gtest parity, worst of $(grep -c '^\[cuda-parity\]' "$logs/gtest.log") runs" PASS "rel $worst"
else
  echo "[gpu-check] --no-gtest: the sparrow_cuda_tests rows skipped" | tee -a "$logs/progress.txt" >&2
fi

# 2. The CLI end to end: cuda vs cpu logits on every fixture, three feeding modes.
compare() {  # name got ref
  local out
  out=$("$bin/sparrow_npy_compare" "$2" "$3" 1e-4 2>&1)
  if [ $? -eq 0 ]; then
    row "$1" PASS "rel $(echo "$out" | grep -oE 'max\|d\|/max\|ref\|=[0-9.e+-]+' | cut -d= -f2)"
  else
    row "$1" FAIL "$out"
  fi
}
for dir in "$root"/tests/fixtures/*/; do
  f=$(basename "$dir")
  [ -f "$dir/ids.npy" ] || continue
  "$bin/sparrow" logits --model "$dir" --ids "$dir/ids.npy" --out "$logs/$f.cpu.npy" >>"$logs/cli.log" 2>&1 ||
    { row "logits $f (cpu reference)" FAIL "see cli.log"; continue; }
  for mode in one-shot:0 chunked-5:5 decode:1; do
    name=${mode%%:*} chunk=${mode##*:}
    if "$bin/sparrow" logits --backend cuda --precision fp32 --model "$dir" --ids "$dir/ids.npy" --chunk "$chunk" \
        --out "$logs/$f.cuda.$name.npy" >>"$logs/cli.log" 2>&1; then
      compare "logits --backend cuda $f $name" "$logs/$f.cuda.$name.npy" "$logs/$f.cpu.npy"
    else
      row "logits --backend cuda $f $name" FAIL "exit status $? (see cli.log)"
    fi
  done
done

# 3. A synthetic V4-Flash (real dimensions, released formats) on a short prompt.
if [ "$synth" -eq 1 ]; then
  model="${TMPDIR:-/tmp}/sparrow-synth-v4flash"
  ids=$(awk -v n="$synth_tokens" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), (i * 7919 + 13) % 129280 }')
  name="synth V4-Flash $synth_layers layers, $synth_tokens tokens"
  t0=$(date +%s)
  rm -rf "$model"
  # Scales other than 1, so that `mix * scale + base` rounded once (fma) or twice differ (synth --help).
  if "$bin/sparrow" synth --layers "$synth_layers" --experts 8 --hc-scale-std 0.1 --out "$model" >>"$logs/synth.log" 2>&1 &&
     "$bin/sparrow" logits --model "$model" --ids $ids --out "$logs/synth.cpu.npy" >>"$logs/synth.log" 2>&1 &&
     "$bin/sparrow" logits --backend cuda --precision fp32 --model "$model" --ids $ids --out "$logs/synth.cuda.npy" >>"$logs/synth.log" 2>&1 &&
     "$bin/sparrow" logits --backend cuda --precision fp32 --model "$model" --ids $ids --chunk 1 --out "$logs/synth.cuda.decode.npy" \
       >>"$logs/synth.log" 2>&1; then
    compare "$name one-shot ($(( $(date +%s) - t0 )) s)" "$logs/synth.cuda.npy" "$logs/synth.cpu.npy"
    compare "$name decode" "$logs/synth.cuda.decode.npy" "$logs/synth.cpu.npy"
  else
    row "$name" FAIL "see synth.log: $(tail -1 "$logs/synth.log")"
  fi
  # The fast profile on CUDA (its tensor-core attention and indexer take V4's 64 heads x 512 and
  # 64 x 128): token by token and in chunks of 37, the same bits as one-shot.
  if [ -d "$model" ] &&
     "$bin/sparrow" logits --backend cuda --precision fast --model "$model" --ids $ids --out "$logs/synth.fast.npy" >>"$logs/synth.log" 2>&1 &&
     "$bin/sparrow" logits --backend cuda --precision fast --model "$model" --ids $ids --chunk 1 --out "$logs/synth.fast.decode.npy" >>"$logs/synth.log" 2>&1 &&
     "$bin/sparrow" logits --backend cuda --precision fast --model "$model" --ids $ids --chunk 37 --out "$logs/synth.fast.chunk.npy" >>"$logs/synth.log" 2>&1; then
    for mode in decode chunk; do
      if out=$("$bin/sparrow_npy_compare" "$logs/synth.fast.$mode.npy" "$logs/synth.fast.npy" 0 2>&1); then
        row "$name fast on CUDA, $mode = one-shot" PASS "the same bits"
      else
        row "$name fast on CUDA, $mode = one-shot" FAIL "$out"
      fi
    done
  else
    row "$name fast on CUDA" FAIL "see synth.log: $(tail -1 "$logs/synth.log")"
  fi
  rm -rf "$model" "$logs"/synth*.npy
fi

# 3b. `sparrow diff` across backends (issue 8): every tap of the CUDA forward against the CPU's on
#     a fixture with every layer kind; no tap may diverge past the diff's default tolerance.
f=mixed_hc2
if [ -f "$root/tests/fixtures/$f/ids.npy" ]; then
  if "$bin/sparrow" diff --model-a "$root/tests/fixtures/$f" --backend-b cuda --precision-b fp32 --ids "$root/tests/fixtures/$f/ids.npy" \
      --json >"$logs/diff.json" 2>>"$logs/cli.log"; then
    if grep -q '"first_divergence": *null' "$logs/diff.json" || grep -q '"first_divergence":null' "$logs/diff.json"; then
      row "sparrow diff --backend-b cuda ($f)" PASS "no tap past the tolerance, $(grep -o '"name"' "$logs/diff.json" | wc -l) taps"
    else
      row "sparrow diff --backend-b cuda ($f)" FAIL "$(grep -o '"first_divergence": *{[^}]*}' "$logs/diff.json" | head -1)"
    fi
  else
    row "sparrow diff --backend-b cuda ($f)" FAIL "exit status $? (see cli.log)"
  fi
fi

# 4. The trained needle model on CUDA: sparrow needle's tokens equal the CPU's, and `sparrow serve
#    --backend cuda` returns them through /v1/completions (plain, streamed, concurrent).
#    Under fp32 (CUDA held to the CPU reference) and under fast (CUDA's default profile, against the
#    CPU's fast twin: the tokens of a model this sure of its answers must agree too).
if [ -f "$root/models/needle-tiny/model.safetensors" ] && command -v python3 >/dev/null; then
  for prec in fp32 fast; do
    t0=$(date +%s)
    if python3 "$root/tools/serve_check.py" "$bin/sparrow" "$root/models/needle-tiny" --backend cuda --precision "$prec" \
        --lengths 256,1k,4k --trials 4 >"$logs/serve_check-$prec.log" 2>&1; then
      row "needle-tiny: needle + serve --backend cuda --precision $prec" PASS "$(grep -c '^PASS' "$logs/serve_check-$prec.log") checks ($(( $(date +%s) - t0 )) s)"
    else
      row "needle-tiny: needle + serve --backend cuda --precision $prec" FAIL "$(grep -m3 -E '^FAIL|Error' "$logs/serve_check-$prec.log" | tr '\n' ' ')"
    fi
  done
fi

echo
echo "gpu-check $(date -u '+%Y-%m-%d %H:%M UTC') on $card"
echo
echo "rel = max|cuda - cpu| / max|cpu| over all positions and the whole vocabulary (bar: 1e-4)"
echo
echo "| check | result | detail |"
echo "|---|---|---|"
for r in "${rows[@]}"; do
  IFS=$'\t' read -r a b c <<<"$r"
  echo "| $a | $b | $c |"
done
echo
if [ "$failures" -eq 0 ]; then echo "gpu-check: all passed"; else echo "gpu-check: $failures FAILED"; fi
[ "$failures" -eq 0 ]
