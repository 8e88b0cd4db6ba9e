#!/usr/bin/env python3
"""Markdown tables for docs/perf.md from a `sparrow bench` JSON (bench/results/<card>-<date>.json).

    python3 bench/report.py bench/results/nvidia-h200-2026-11-30.json

Prints the measured ceilings, then per layer the median step time in ms with the ratio to its floor
in brackets, one row per (batch, context) decode cell and one for the prefill; then the FP8 GEMM
section's fractions of the peaks, and the whole model scaled per layer to V4-Flash's 43 layers the
way docs/perf.md states the targets: each cell's time as the mean of its CSA layers' mean and its
HCA layers' mean, times 43 (SGLang's 4,550 tok/s/GPU beside batch 256 at 8K). Standard library only.
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
    whole_model(d)


V4_FLASH_LAYERS = 43
SGLANG_TOKS_PER_GPU = 4550  # V4-Flash on 4xH200, concurrency 4096, 8K in / 1K out (issue 6)


def csa_hca_mean(cells):
    """Mean over the CSA layers' times and over the HCA layers', then of the two; None if a kind is missing."""
    means = []
    for kind in ("csa", "hca"):
        t = [c["time_ms"] for c in cells if c.get("status") == "ok" and c["kind"].startswith(kind)]
        if not t:
            return None
        means.append(sum(t) / len(t))
    return sum(means) / 2


def whole_model(d):
    gemms = [g for g in d.get("fp8_gemms", []) if g.get("status") == "ok"]
    if gemms:
        print("\n| FP8 GEMM (M, N, K) | TFLOP/s | of the per-tensor peak | of the block-scaled peak |")
        print("|---|---|---|---|")
        for g in gemms:
            print(f"| {g['matrix']} ({g['M']}, {g['N']}, {g['K']}) | {g['flops_per_s'] / 1e12:.0f} "
                  f"| {g['ratio_fp8_peak']:.2f} | {g['ratio_fp8_block_peak']:.2f} |")
    print(f"\nWhole model, scaled per layer to {V4_FLASH_LAYERS} layers (the mean of a CSA and an HCA layer):")
    cells = {}
    for c in d["decode"]:
        cells.setdefault((c["batch"], c["context"]), []).append(c)
    for (b, n), row in sorted(cells.items()):
        if b not in (1, 256):
            continue
        m = csa_hca_mean(row)
        if m is None:
            continue
        step = V4_FLASH_LAYERS * m
        line = f"- decode {b} × {ctx(n)}: {m:.2f} ms a layer, {step:.1f} ms a step, {b / step * 1e3:.0f} tok/s"
        if b == 256:
            line += f" ({b / step * 1e3 / SGLANG_TOKS_PER_GPU:.2f}× SGLang's {SGLANG_TOKS_PER_GPU:,} tok/s/GPU)"
        print(line)
    m = csa_hca_mean(d["prefill"])
    if m is not None and d["prefill"]:
        tokens = d["prefill"][0]["tokens"]
        total = V4_FLASH_LAYERS * m / 1e3
        print(f"- prefill {ctx(tokens)}: {m:.1f} ms a layer, {total:.2f} s, {tokens / total:.0f} tok/s")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
