#!/usr/bin/env python3
"""Markdown tables for docs/perf.md from a `sparrow bench` JSON (bench/results/<card>-<date>.json).

    python3 bench/report.py bench/results/nvidia-h200-2026-11-30.json

Prints the measured ceilings, then per layer the median step time in ms with the ratio to its floor
in brackets, one row per (batch, context) decode cell and one for the prefill; then the FP8 GEMM
section's fractions of the peaks, and the whole model scaled per layer to V4-Flash's 43 layers the
way docs/perf.md states the targets: each cell's time as the mean of its CSA layers' mean and its
HCA layers' mean, times 43 (SGLang's 4,550 tok/s/GPU beside batch 256 at 8K; at batch 1, where the
record has them, the same means of the GPU's own step time and of the host's enqueue time); last, from the
per-op breakdown (`--breakdown`), the figures the issue-6 targets name: the indexer scan, the
sparse prefill attention and the routed experts. Standard library only.

    python3 bench/report.py --compare BEFORE.json AFTER.json

Compares two records cell by cell (the cells both hold, matched by layer, batch and context or
prefill length): the timed median and the GPU's own time (queued ahead) before -> after with the
change in percent, and the model-step cells (their GPU's own time: the graph segments' summed GPU
time, where both records measured it with --model-step-segments); a line per cell, then the median
change of each kind, and the model step's kernels and graph nodes.
"""
import json
import sys


def ctx(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def switches(d):
    """The record's switched-off and opted-in paths (older records name neither or only the first)."""
    off, on = d.get("cuda_disable"), d.get("cuda_enable")
    return (f", SPARROW_CUDA_DISABLE={off}" if off else "") + (f", SPARROW_CUDA_ENABLE={on}" if on else "")


def main(path):
    d = json.load(open(path))
    p = d["peaks"]
    print(f"{d['card']}, {d['date']}, `{d['command']}` ({d['wall_s']:.0f} s)" + switches(d) + "\n")
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
    if d["prefill"]:  # a run with --prefill 0 has none
        print(f"| prefill {ctx(d['prefill'][0]['tokens'])} | " + " | ".join(vals) + " |")
    whole_model(d)
    targets(d)


V4_FLASH_LAYERS = 43
SGLANG_TOKS_PER_GPU = 4550  # V4-Flash on 4xH200, concurrency 4096, 8K in / 1K out (issue 6)


def csa_hca_mean(cells, key="time_ms"):
    """Mean over the CSA layers' `key` and over the HCA layers', then of the two; None if a kind is missing."""
    means = []
    for kind in ("csa", "hca"):
        t = [c[key] for c in cells if c.get("status") == "ok" and c["kind"].startswith(kind) and c.get(key, -1) >= 0]
        if not t:
            return None
        means.append(sum(t) / len(t))
    return sum(means) / 2


def ok_gemms(d):
    """The FP8 GEMM section's measured rows."""
    return [g for g in d.get("fp8_gemms", []) if g.get("status") == "ok"]


def fp8_gemm_name(g):
    """What ran a measured FP8 GEMM row, as its record's path says: cuBLASLt until the thirteenth
    run, the project's kernels since."""
    return "cuBLASLt FP8" if "cuBLASLt" in g.get("path", "") else "the project's FP8 linear"


def whole_model(d):
    gemms = ok_gemms(d)
    if gemms:
        # (Records from the fortieth session on also time the GEMM alone, its input quantised once.)
        alone = all("gemm_flops_per_s" in g for g in gemms)
        print("\n| FP8 GEMM (M, N, K) | TFLOP/s | of the per-tensor peak | of the block-scaled peak |"
              + (" GEMM alone, TFLOP/s | of the per-tensor peak |" if alone else ""))
        print("|---|---|---|---|" + ("---|---|" if alone else ""))
        for g in gemms:
            print(f"| {g['matrix']} ({g['M']}, {g['N']}, {g['K']}) | {g['flops_per_s'] / 1e12:.0f} "
                  f"| {g['ratio_fp8_peak']:.2f} | {g['ratio_fp8_block_peak']:.2f} |"
                  + (f" {g['gemm_flops_per_s'] / 1e12:.0f} | {g['gemm_ratio_fp8_peak']:.2f} |" if alone else ""))
        if alone:  # the issue-6 target's figures: the range of each ratio over the matrices
            lo, hi = (f(gemms, key=lambda g: g["ratio_fp8_peak"]) for f in (min, max))
            alo, ahi = (f(gemms, key=lambda g: g["gemm_ratio_fp8_peak"]) for f in (min, max))
            print(f"\nFP8 GEMMs at M = {gemms[0]['M']}: with their activation quantisation "
                  f"{lo['ratio_fp8_peak']:.2f} ({lo['matrix']}) – {hi['ratio_fp8_peak']:.2f} ({hi['matrix']}) of the "
                  f"per-tensor peak, the GEMM alone {alo['gemm_ratio_fp8_peak']:.2f} ({alo['matrix']}) – "
                  f"{ahi['gemm_ratio_fp8_peak']:.2f} ({ahi['matrix']})")
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
            # (SGLang's figure is from H200s: on another card the ratio is not like for like.)
            other = "" if "H200" in d["card"] else f", measured on H200s, not on an {d['card']}"
            line += f" ({b / step * 1e3 / SGLANG_TOKS_PER_GPU:.2f}× SGLang's {SGLANG_TOKS_PER_GPU:,} tok/s/GPU{other})"
        ok = [c for c in row if c.get("status") == "ok"]
        timed = all(c.get("queued_ms", -1) >= 0 and c.get("host_ms", -1) >= 0 for c in ok)
        queued, host = csa_hca_mean(row, "queued_ms"), csa_hca_mean(row, "host_ms")
        if b == 1 and timed and queued is not None and host is not None:  # (records from 2026-12-02 on)
            line += (f"; the GPU's own time (work queued ahead) {queued:.2f} ms a layer, "
                     f"{V4_FLASH_LAYERS * queued:.1f} ms a step; the host's enqueue {host:.2f} ms a layer")
        print(line)
    m = csa_hca_mean(d["prefill"])
    if m is not None and d["prefill"]:
        tokens = d["prefill"][0]["tokens"]
        total = V4_FLASH_LAYERS * m / 1e3
        print(f"- prefill {ctx(tokens)}: {m:.1f} ms a layer, {total:.2f} s, {tokens / total:.0f} tok/s")
    # The engine's own whole-model step (records since 2026-12-02's thirteenth session).
    steps = [c for c in d.get("model_step", []) if c.get("status") == "ok"]
    if steps:
        print(f"\nThe model's decode step as the engine runs it (all {steps[0]['layers']} loaded layers and the head, "
              "one sequence):")
        for c in steps:
            print(f"- after {ctx(c['context'])}: {c['time_ms']:.2f} ms (median of {c['reps']}), {c['ratio']:.1f}× its floor "
                  f"({c['floor_layers_ms']:.3f} ms for the layers + {c['floor_head_ms']:.3f} for the head), "
                  f"{c['tokens_per_s']:.0f} tok/s")


def op_ms(cell, name):
    """The breakdown's GPU time of op `name` in a cell (ms), or None. For the W4A8 experts' ops
    ("... (w4a8)", "... (w4a8 tiled)") also their wgmma kernels' ("... (w4a8 wgmma ...)")."""
    names = [name]
    if "(w4a8" in name:
        names.append(name.replace("(w4a8", "(w4a8 wgmma"))
    for n in names:
        for o in cell.get("breakdown", {}).get("ops", []):
            if o["op"] == n:
                return o["gpu_ms"]
    return None


def first(cells, kind, **want):
    """The first ok cell of a layer kind (csa, hca, swa) with the given batch/context, by layer."""
    for c in sorted(cells, key=lambda c: c["layer"]):
        if c.get("status") == "ok" and c["kind"].startswith(kind) and all(c.get(k) == v for k, v in want.items()):
            return c
    return None


def targets(d):
    hbm = d["peaks"]["hbm"]["value"]
    lines = []
    decode = d["decode"]
    if decode:
        b, n = max(c["batch"] for c in decode), max(c["context"] for c in decode)
        c = first(decode, "csa", batch=b, context=n)
        t = op_ms(c, "indexer_topk") if c else None
        if t:
            fa = d["floor_assumptions"]
            key_bytes = c["floor"]["bytes_items"]["index_keys"]
            line = (f"- indexer scan, L{c['layer']} {b} × {ctx(n)}: {t:.2f} ms, {key_bytes / t / 1e9:.2f} TB/s of "
                    f"{fa['index_key_format']} key bytes ({key_bytes / t * 1e3 / hbm:.0%} of the copy bandwidth)")
            if fa["index_key_format"] == "fp8":  # di + 4 bytes a key: bf16 keys are 2 di
                bf16 = key_bytes / fa["index_key_bytes"] * 2 * (fa["index_key_bytes"] - 4)
                line += f", {bf16 / t / 1e9:.2f} TB/s of bf16 key bytes ({bf16 / t * 1e3 / hbm:.0%})"
            lines.append(line)
        c = first(decode, "swa", batch=b, context=min(x["context"] for x in decode))
        w13 = op_ms(c, "moe/experts w1, w3 (w4a8)") if c else None
        w2 = op_ms(c, "moe/experts w2, scatter (w4a8)") if c else None
        if w13 and w2:
            byts = c["floor"]["bytes_items"]["routed_experts"]
            lines.append(f"- routed experts, L{c['layer']} {b} × {ctx(c['context'])}: {byts / 1e9:.2f} GB of MXFP4 in "
                         f"{w13 + w2:.2f} ms (w1, w3 and w2), {byts / (w13 + w2) / 1e9:.2f} TB/s "
                         f"({byts / (w13 + w2) * 1e3 / hbm:.0%} of the copy bandwidth)")
    c = first(d["prefill"], "csa")
    t = op_ms(c, "attention") if c else None
    if t:
        f = c["floor"]["flops_items"]["attention"]
        lines.append(f"- sparse prefill attention, L{c['layer']} {ctx(c['tokens'])}: {f / 1e12:.3f} TFLOP (4 H Dh an "
                     f"attended key) in {t:.2f} ms, {f / t / 1e9:.0f} TFLOP/s")
    c = first(d["prefill"], "swa") or first(d["prefill"], "csa")
    t = op_ms(c, "moe/experts w1, w3 (w4a8 tiled)") if c else None
    shared = [g for g in ok_gemms(d) if g["matrix"] == "shared.w1"]
    if t and shared:
        g = shared[0]  # the shared expert's w1 has a routed expert's shape (N = moe_intermediate, K = hidden)
        m = d["model"]
        flops = 2 * c["tokens"] * m["experts_per_token"] * 2 * g["N"] * g["K"]
        rate = flops / t / 1e9
        lines.append(f"- routed experts w1, w3, L{c['layer']} prefill {ctx(c['tokens'])}: {flops / 1e12:.2f} TFLOP in "
                     f"{t:.1f} ms, {rate:.0f} TFLOP/s, {rate / (g['flops_per_s'] / 1e12):.2f}× {fp8_gemm_name(g)} at "
                     f"the shared expert's w1 shape and M = {g['M']} ({g['flops_per_s'] / 1e12:.0f} TFLOP/s)")
    if lines:
        print("\nThe issue-6 target figures (from the per-op breakdown):")
        print("\n".join(lines))


def pct(a, b):
    return f"{100.0 * (b - a) / a:+.1f} %"


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def compare(before_path, after_path):
    a, b = json.load(open(before_path)), json.load(open(after_path))
    def side(d):  # the date, and the switched paths where the record names them
        return d["date"] + switches(d)
    print(f"{before_path} ({side(a)}) -> {after_path} ({side(b)})\n")
    print("| cell | timed ms | change | GPU's own ms | change |")
    print("|---|---|---|---|---|")
    timed, queued = {}, {}

    def key(c):
        return (c["layer"], c.get("batch", 0), c.get("context", c.get("tokens", 0)))

    for part in ("decode", "prefill"):
        old = {key(c): c for c in a.get(part, []) if c.get("status") == "ok"}
        for c in b.get(part, []):
            o = old.get(key(c))
            if c.get("status") != "ok" or o is None:
                continue
            name = (f"L{c['layer']} {c['kind']} decode {c['batch']} × {ctx(c['context'])}" if part == "decode"
                    else f"L{c['layer']} {c['kind']} prefill {ctx(c['tokens'])}")
            kind = (1, 0) if part == "prefill" else (0, c["batch"])  # decode by batch, then prefill
            timed.setdefault(kind, []).append((c["time_ms"] - o["time_ms"]) / o["time_ms"])
            q = "—", "—"
            if o.get("queued_ms", -1) > 0 and c.get("queued_ms", -1) > 0:
                q = f"{o['queued_ms']:.3f} → {c['queued_ms']:.3f}", pct(o["queued_ms"], c["queued_ms"])
                queued.setdefault(kind, []).append((c["queued_ms"] - o["queued_ms"]) / o["queued_ms"])
            print(f"| {name} | {o['time_ms']:.3f} → {c['time_ms']:.3f} | {pct(o['time_ms'], c['time_ms'])} | {q[0]} | {q[1]} |")
    old_steps = {c["context"]: c for c in a.get("model_step", []) if c.get("status") == "ok"}
    step_lines = []
    for c in b.get("model_step", []):
        o = old_steps.get(c["context"])
        if c.get("status") == "ok" and o is not None:
            own = "—", "—"
            if o.get("segments_sum_ms") and c.get("segments_sum_ms"):
                own = (f"{o['segments_sum_ms']:.3f} → {c['segments_sum_ms']:.3f}",
                       pct(o["segments_sum_ms"], c["segments_sum_ms"]))
            print(f"| model step after {ctx(c['context'])} | {o['time_ms']:.3f} → {c['time_ms']:.3f} | "
                  f"{pct(o['time_ms'], c['time_ms'])} | {own[0]} | {own[1]} |")
            if o.get("segments") and c.get("segments"):
                count = lambda step, what: sum(s[what] for s in step["segments"])
                step_lines.append(f"- model step after {ctx(c['context'])}: {count(o, 'kernels')} → "
                                  f"{count(c, 'kernels')} kernels in {count(o, 'nodes')} → {count(c, 'nodes')} "
                                  f"graph nodes, {len(o['segments'])} → {len(c['segments'])} segments")
    print()
    for kind in sorted(timed):
        label = "prefill" if kind[0] else f"decode batch {kind[1]}"
        line = f"- {label}: median change timed {100 * median(timed[kind]):+.1f} % over {len(timed[kind])} cells"
        if kind in queued:
            line += f", GPU's own {100 * median(queued[kind]):+.1f} % over {len(queued[kind])}"
        print(line)
    for line in step_lines:
        print(line)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
