#!/usr/bin/env bash
# A/B of one switchable CUDA path on a lent GPU (bench/README.md, "A/B of a switch"): `sparrow bench`
# on the same synthetic model with SPARROW_CUDA_DISABLE=$SWITCH ("off") and without ("on"),
# alternated ROUNDS times in one call (the lent machines differ more between calls than most
# changes), then `bench/report.py --compare` of each off record against the on record of its round.
# The sides swap places every round (off first in odd rounds, on first in even ones), so that a
# place in the round cannot favour one side (in the sixty-seventh session the builds after a
# round's first came out about 0.7 % faster; in the sixty-eighth every build moved between two bands
# about 1.5 % apart from run to run: docs/perf.md): read an even number of rounds, by their means.
#
#   SWITCH=fp8_stack bash bench/ab_device.sh        (environment knobs, all optional but one of SWITCH, ENABLE, KNOB:)
#     SWITCH=name          the SPARROW_CUDA_DISABLE name compared (docs/cuda.md lists them)
#     ENABLE=name          instead, an opt-in path: "on" runs with SPARROW_CUDA_ENABLE=name, "off" without
#     KNOB=VAR OFF=a ON=b  instead, a tuning variable (docs/cuda.md): "off" runs with VAR=a, "on" with VAR=b
#                          (KNOB=SPARROW_CUDA_W4A8_WARPGROUPS OFF=2 ON=4)
#     BIN=.gpu-carry       folder holding sparrow built on the CPU machine (+ lib/)
#     MODEL=/tmp/sparrow-v4f1   where the synthetic model goes; written when missing
#     LAYERS=1             its layers (1: layer 0, SWA; 4: SWA, SWA, CSA, HCA)
#     ROUNDS=2             off/on pairs
#     BENCH_ARGS="..."     the cells (default: every layer, batch 1, 8 and 256 at 4K, prefill 8K,
#                          no GEMM section, the model step after 4K)
#     OUT=/tmp/ab          where the records and compare tables go
set -uo pipefail
cd "$(dirname "$0")/.."
enable=${ENABLE:-}
knob=${KNOB:-}
modes=0
for m in "${SWITCH:-}" "$enable" "$knob"; do [ -n "$m" ] && modes=$((modes + 1)); done
[ "$modes" -gt 0 ] ||
  { echo "ab_device: SWITCH=<name> (a SPARROW_CUDA_DISABLE name), ENABLE=<name> (a SPARROW_CUDA_ENABLE one) or KNOB=<variable> with OFF= and ON= is required" >&2; exit 2; }
[ "$modes" -eq 1 ] || { echo "ab_device: SWITCH, ENABLE and KNOB: one of them" >&2; exit 2; }
if [ -n "$knob" ]; then
  case $knob in SPARROW_*) ;; *) echo "ab_device: KNOB must name a SPARROW_ variable, not '$knob'" >&2; exit 2 ;; esac
  [ -n "${OFF:-}" ] && [ -n "${ON:-}" ] || { echo "ab_device: KNOB=$knob needs OFF=<value> and ON=<value>" >&2; exit 2; }
fi
label=${SWITCH:-${enable:-$knob $OFF -> $ON}}
bin=${BIN:-.gpu-carry}
layers=${LAYERS:-1}
model=${MODEL:-/tmp/sparrow-v4f$layers}
rounds=${ROUNDS:-2}
out=${OUT:-/tmp/ab}
args=${BENCH_ARGS:---batches 1,8,256 --contexts 4k --prefill 8k --gemm-tokens 0 --model-step 4k}
mkdir -p "$out"
[ -x "$bin/sparrow" ] || { echo "ab_device: no $bin/sparrow (scripts/prepare-gpu-carry.sh)" >&2; exit 1; }
case $bin in /*) lib=$bin/lib ;; *) lib=$PWD/$bin/lib ;; esac
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -f "$model/config.json" ]; then
  "$bin/sparrow" synth --preset v4-flash --layers "$layers" --experts 256 --out "$model" >"$out/synth.log" 2>&1 ||
    { echo "ab_device: synth failed ($out/synth.log)" >&2; exit 1; }
fi
status=0
for r in $(seq 1 "$rounds"); do
  sides="off on"
  [ $((r % 2)) -eq 0 ] && sides="on off"
  for side in $sides; do
    disable="" enabled="" knob_env=()
    [ "$side" = off ] && [ -n "${SWITCH:-}" ] && disable=$SWITCH
    [ "$side" = on ] && enabled=$enable
    if [ -n "$knob" ]; then
      if [ "$side" = off ]; then knob_env=("$knob=$OFF"); else knob_env=("$knob=$ON"); fi
    fi
    # shellcheck disable=SC2086
    env "${knob_env[@]}" SPARROW_CUDA_DISABLE=$disable SPARROW_CUDA_ENABLE=$enabled "$bin/sparrow" bench --model "$model" --precision fast --peak-reps 3 \
      --copy-gib 0.5 --out "$out/ab-$side-$r.json" $args >"$out/ab-$side-$r.txt" 2>&1 ||
      { echo "ab_device: round $r $side failed ($out/ab-$side-$r.txt)" >&2; status=1; }
  done
  if [ -f "$out/ab-off-$r.json" ] && [ -f "$out/ab-on-$r.json" ]; then
    echo "== round $r: $label off -> on (run order: $sides)"
    python3 bench/report.py --compare "$out/ab-off-$r.json" "$out/ab-on-$r.json" | tee "$out/ab-compare-$r.md"
  fi
done
exit "$status"
