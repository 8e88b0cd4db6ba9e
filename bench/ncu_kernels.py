#!/usr/bin/env python3
"""Per-kernel GPU time of one or more runs side by side, from Nsight Compute's CSV output.

    ncu --clock-control none --print-units base --csv --metrics gpu__time_duration.sum \\
        sparrow bench --model M --layers 0 --batches 256 --contexts 4k --prefill 8k \\
        --model-step 0 --gemm-tokens 0 --warmup 0 --min-reps 1 --max-reps 1 > main.txt
    (the same with the other build, or with SPARROW_CUDA_ENABLE=... > branch.txt)
    python3 bench/ncu_kernels.py main.txt branch.txt [--labels main,branch] [--min-us 5] [--base-names]

Each file is ncu's console output as it is: the program's own lines are skipped, and the rows
after the CSV header ("ID", ..., "Kernel Name", ..., "Metric Value") are read. Each kernel's
gpu__time_duration.sum is added over its launches (units: ns, us/usecond, ms/msecond, s/second).
A kernel's name loses its arguments, `void ` and the anonymous namespaces; --base-names also drops
its template arguments, so that two builds whose forms differ in a template parameter line up.
Library and bench kernels (cuBLAS's nvjet / sm90 / cutlass, the benchmark's own `bench::`: the
peaks and fills around the cells) are one row, "[library and bench]", left out of the totals (a
path of the model's own that calls cuBLASLt lands there too: compare that row as well).

Prints a markdown table, the kernels by their largest time in any run: each run's time (µs) and
launch count, and every run after the first its difference from the first. Rows under --min-us in
every run are left out (their time still counts in the totals).
"""
import argparse
import collections
import csv
import re
import sys

LIBRARY = "[library and bench]"
UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def kernel_name(raw, base_names):
    name = raw.strip()
    if name.startswith("void "):
        name = name[5:]
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    # Arguments: the last top-level "(" ... ")" (template arguments may hold parentheses).
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    for prefix in ("sparrow::cuda::", "cuda::"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.startswith(("nvjet", "sm90_", "sm80_", "cutlass", "bench::")) or "cublas" in name.lower():
        return LIBRARY
    if base_names:
        name = re.sub(r"<.*>$", "", name)
    return name.strip()


def load(path, base_names):
    """{kernel: [µs, launches]} of one ncu output file."""
    with open(path, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"') and '"Kernel Name"' in l), None)
    if start is None:
        raise SystemExit(f"ncu_kernels: {path}: no ncu CSV header (\"ID\", ..., \"Kernel Name\", ...); "
                         "run ncu with --csv --metrics gpu__time_duration.sum")
    rows = list(csv.reader(l for l in lines[start:] if l.startswith('"')))
    header = rows[0]
    try:
        ki, mi, ui, vi = (header.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    except ValueError as e:
        raise SystemExit(f"ncu_kernels: {path}: the CSV header lacks a column ({e})")
    out = collections.defaultdict(lambda: [0.0, 0])
    for row in rows[1:]:
        if len(row) != len(header) or row[mi] != "gpu__time_duration.sum":
            continue
        unit = row[ui].strip()
        if unit not in UNITS:
            raise SystemExit(f"ncu_kernels: {path}: unknown time unit '{unit}'")
        entry = out[kernel_name(row[ki], base_names)]
        entry[0] += float(row[vi].replace(",", "")) * UNITS[unit]
        entry[1] += 1
    if not out:
        raise SystemExit(f"ncu_kernels: {path}: no gpu__time_duration.sum rows")
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="ncu console outputs (--csv), one a run")
    ap.add_argument("--labels", help="comma-separated names of the runs (default: the file names)")
    ap.add_argument("--min-us", type=float, default=5.0, help="leave out rows under this in every run (µs)")
    ap.add_argument("--base-names", action="store_true", help="kernels by name without template arguments")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [p.rsplit("/", 1)[-1] for p in args.files]
    if len(labels) != len(args.files):
        ap.error(f"--labels names {len(labels)} runs for {len(args.files)} files")
    runs = [load(p, args.base_names) for p in args.files]
    totals = [sum(v[0] for k, v in r.items() if k != LIBRARY) for r in runs]

    def cell(r, k):
        return r.get(k, [0.0, 0])

    head = "| kernel | " + " | ".join(f"{l} µs | n" + (f" | {l} − {labels[0]}" if i else "") for i, l in enumerate(labels)) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(runs) + len(runs) - 1))

    def line(name, vals):
        parts = []
        for i, (us, n) in enumerate(vals):
            parts.append(f"{us:,.1f} | {n}")
            if i:
                parts.append(f"{us - vals[0][0]:+,.1f}")
        print(f"| {name} | " + " | ".join(parts) + " |")

    line("**total** (without the library and bench row)", [(t, sum(v[1] for k, v in r.items() if k != LIBRARY))
                                                         for t, r in zip(totals, runs)])
    names = set().union(*runs)
    for k in sorted(names, key=lambda k: (-max(cell(r, k)[0] for r in runs), k)):
        vals = [tuple(cell(r, k)) for r in runs]
        if max(v[0] for v in vals) < args.min_us:
            continue
        line(f"`{k}`" if k != LIBRARY else k, vals)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
