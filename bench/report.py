#!/usr/bin/env python3
"""Markdown tables for docs/perf.md from a `sparrow bench` JSON (bench/results/<card>-<date>.json).

    python3 bench/report.py bench/results/nvidia-h200-2026-11-30.json

Prints the measured ceilings, then per layer the median step time in ms with the ratio to its floor
in brackets, one row per (batch, context) decode cell and one for the prefill. Standard library only.
"""
import json
import sys


def ctx(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def main(path):
    d = json.load(open(path))
    p = d["peaks"]
    print(f"{d['card']}, {d['date']}, `{d['command']}` ({d['wall_s']:.0f} s)\n")
    print("| HBM copy (GB/s) | bf16 GEMM (TFLOP/s) | FP8 GEMM, per-tensor (TFLOP/s) | FP8 GEMM, 1×128 × 128×128 blocks (TFLOP/s) |")
    print("|---|---|---|---|")
    print(f"| {p['hbm']['value'] / 1e9:.0f} | {p['bf16_gemm']['value'] / 1e12:.1f} | {p['fp8_gemm']['value'] / 1e12:.1f} "
          f"| {p['fp8_gemm_block_scaled']['value'] / 1e12:.1f} |\n")
    layers = sorted({c["layer"] for c in d["decode"]} | {c["layer"] for c in d["prefill"]})
    kinds = {c["layer"]: c["kind"] for c in d["decode"] + d["prefill"]}
    print("| cell | " + " | ".join(f"L{l} {kinds[l]}" for l in layers) + " |")
    print("|---" * (len(layers) + 1) + "|")
    cells = {}
    for c in d["decode"]:
        cells.setdefault((c["batch"], c["context"]), {})[c["layer"]] = c
    for (b, n), row in sorted(cells.items()):
        vals = []
        for l in layers:
            c = row.get(l)
            vals.append("—" if not c or c.get("status") != "ok" else f"{c['time_ms']:.2f} ({c['ratio']:.0f}×)")
        print(f"| decode {b} × {ctx(n)} | " + " | ".join(vals) + " |")
    pre = {c["layer"]: c for c in d["prefill"]}
    vals = []
    for l in layers:
        c = pre.get(l)
        vals.append("—" if not c or c.get("status") != "ok" else
                    f"{c['time_ms']:.0f} ms, {c['tokens_per_s']:.0f} tok/s ({c['ratio']:.0f}×)")
    print(f"| prefill {ctx(d['prefill'][0]['tokens'])} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
