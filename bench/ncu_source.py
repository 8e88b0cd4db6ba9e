#!/usr/bin/env python3
"""Summarises one kernel's per-instruction counters from Nsight Compute's source page.

    ncu --section SourceCounters --section WarpStateStats --import-source no -k regex:NAME -c 1 -o rep <app>
    ncu -i rep.ncu-rep --page source --csv --print-source sass > kernel.csv
    python3 bench/ncu_source.py kernel.csv [--warps N] [--top N] [--landmarks] [--part NAME:FIRST:END ...]

(scripts/gpu-probe.sh's NCU_SOURCE=1 writes such a CSV, with several listings where it profiled several
launches: NCU_COUNT=2 gave four, each launch's twice. The first is read, --kernel N reads the Nth.) Prints, from the SASS rows:
  - the instructions executed and the warp-state samples in all, and the samples' stall reasons;
  - the runs of consecutive instructions executed equally often (within 2 %): a loop's body shows as
    one run, the set-up and the stores as others; each with its share of the samples;
  - per opcode (the mnemonic without its modifiers), its share of the instructions executed and of
    the samples, over the whole kernel and over the hottest runs (executed at least half as often as
    the most executed instruction);
  - the instructions with the most samples, each with its two largest stall reasons.
--warps N (the launch's warps: blocks x warps a block) adds each run's executions a warp.
--landmarks adds every executed barrier, wait, HGMMA, exit and branch with its row and the share of
the samples before it, to choose parts by; --part NAME:FIRST:END (rows FIRST to END - 1, END -1 for
the last; repeatable) adds that part's share of the samples and its six largest stall reasons.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
LANDMARKS = ("BAR.", "DEPBAR", "EXIT", "HGMMA", "WARPSYNC", "BRA ", "BRA.")
EXECUTED = "Instructions Executed"


def number(text):
    text = text.replace(",", "").strip()
    return int(float(text)) if text not in ("", "-") else 0


def opcode(source):
    """The mnemonic of a SASS line: predicate guards (@P0, @!PT) skipped, modifiers (.E, .64) cut."""
    for word in source.split():
        if not word.startswith("@"):
            return word.split(".")[0]
    return "?"


def is_header(row):
    return "Source" in row and SAMPLES in row and EXECUTED in row


def load(path, listing=1):
    """Listing `listing` (1-based) of the file: each a "Kernel Name" row, a header row (a row with the
    columns read here) and its instructions.
    Returns its kernel's name (with "listing i of n" where the file holds more than one) and rows."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    starts = [i for i, row in enumerate(rows) if is_header(row)]
    if not starts:
        raise SystemExit(f"{path}: no header with Source, '{SAMPLES}' and '{EXECUTED}' (ncu --page source --csv)")
    if not 1 <= listing <= len(starts):
        raise SystemExit(f"{path}: listing {listing} asked for, the file holds {len(starts)}")
    at = starts[listing - 1]
    header = rows[at]
    # (The next listing's "Kernel Name" row, shorter than a header, is skipped with the other short
    # rows below.)
    body = rows[at + 1:starts[listing] if listing < len(starts) else len(rows)]
    name_row = rows[at - 1] if at > 0 else []
    kernel = name_row[1] if len(name_row) > 1 and name_row[0] == "Kernel Name" else "?"
    if len(starts) > 1:
        kernel += f" (listing {listing} of {len(starts)}; --kernel picks another)"
    col = {name: j for j, name in enumerate(header)}
    stalls = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    insts = []
    for row in body:
        if len(row) < len(header):
            continue
        insts.append({
            "source": row[col["Source"]].strip(),
            "executed": number(row[col[EXECUTED]]),
            "samples": number(row[col[SAMPLES]]),
            "stalls": {s[len("stall_"):]: number(row[col[s]]) for s in stalls},
        })
    if not insts:
        raise SystemExit(f"{path}: no instruction rows")
    return kernel, insts


def runs(insts):
    """Consecutive instructions whose executions agree within 2 % (0 only with 0)."""
    out = []
    for i, inst in enumerate(insts):
        e = inst["executed"]
        if out:
            last = out[-1]
            ref = last["executed"]
            if (e == 0) == (ref == 0) and abs(e - ref) <= 0.02 * max(e, ref):
                last["last"] = i
                last["samples"] += inst["samples"]
                last["count"] += 1
                continue
        out.append({"first": i, "last": i, "executed": e, "samples": inst["samples"], "count": 1})
    return out


def pct(part, whole):
    return 100.0 * part / whole if whole else 0.0


def opcode_table(insts, total_exec, total_samples, title):
    executed, sampled, count = collections.Counter(), collections.Counter(), collections.Counter()
    for inst in insts:
        op = opcode(inst["source"])
        executed[op] += inst["executed"]
        sampled[op] += inst["samples"]
        count[op] += 1
    lines = [title, "| opcode | instructions | executed % | samples % |", "|---|---|---|---|"]
    for op, e in executed.most_common(20):
        lines.append(f"| {op} | {count[op]} | {pct(e, total_exec):.1f} | {pct(sampled[op], total_samples):.1f} |")
    return lines


def landmark_lines(insts, total_samples):
    out, before = ["", "landmarks (row, share of the samples before it, executed, instruction):"], 0
    for i, inst in enumerate(insts):
        if inst["executed"] > 0 and any(k in inst["source"] for k in LANDMARKS):
            out.append(f"{i:6d} {pct(before, total_samples):5.1f}% {inst['executed']:>10d}  {inst['source'][:70]}")
        before += inst["samples"]
    return out


def part_lines(insts, total_samples, parts):
    out = [""]
    for name, first, end in parts:
        seg = insts[first:] if end == -1 else insts[first:end]
        samples = sum(i["samples"] for i in seg)
        reasons = collections.Counter()
        for inst in seg:
            reasons.update(inst["stalls"])
        top = ", ".join(f"{r} {pct(v, samples):.0f}%" for r, v in reasons.most_common(6))
        out.append(f"{name}: {pct(samples, total_samples):.1f}% of the samples; {top}")
    return out


def part_spec(text):
    """NAME:FIRST:END, for --part."""
    try:
        name, first, end = text.split(":")
        first, end = int(first), int(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not name:first:end") from None
    if first < 0 or (end != -1 and end <= first):
        raise argparse.ArgumentTypeError(f"'{text}': rows need 0 <= first < end (or end -1, to the last row)")
    return name, first, end


def summarise(path, warps=0, top=20, landmarks=False, parts=(), listing=1):
    kernel, insts = load(path, listing)
    total_exec = sum(i["executed"] for i in insts)
    total_samples = sum(i["samples"] for i in insts)
    out = [f"kernel: {kernel}",
           f"instructions: {len(insts)} in the SASS, {total_exec} executed (warp instructions), "
           f"{total_samples} warp-state samples"]
    reasons = collections.Counter()
    for inst in insts:
        reasons.update(inst["stalls"])
    out.append("stall reasons: " + ", ".join(f"{r} {pct(v, total_samples):.1f} %" for r, v in reasons.most_common(8) if v))
    out += ["", "runs of instructions executed equally often (those with 1 % of the samples or more):",
            "| instructions | executed each" + (" | a warp" if warps else "") + " | samples % |",
            "|---|---|" + ("---|" if warps else "") + "---|"]
    for r in runs(insts):
        if pct(r["samples"], total_samples) >= 1.0:
            per_warp = f" | {r['executed'] / warps:.2f}" if warps else ""
            out.append(f"| {r['first']}-{r['last']} ({r['count']}) | {r['executed']}{per_warp} | "
                       f"{pct(r['samples'], total_samples):.1f} |")
    out.append("")
    out += opcode_table(insts, total_exec, total_samples, "per opcode, the whole kernel:")
    peak = max(i["executed"] for i in insts)
    hot = [i for i in insts if i["executed"] >= peak / 2]
    hot_exec = sum(i["executed"] for i in hot)
    hot_samples = sum(i["samples"] for i in hot)
    out.append("")
    out += opcode_table(hot, hot_exec, hot_samples,
                        f"per opcode, the {len(hot)} instructions executed at least half as often as the most "
                        f"({pct(hot_samples, total_samples):.1f} % of the samples; shares of theirs):")
    out += ["", f"the {top} instructions with the most samples:", "| # | executed | samples | instruction | stalls |",
            "|---|---|---|---|---|"]
    order = sorted(range(len(insts)), key=lambda i: -insts[i]["samples"])[:top]
    for i in sorted(order):
        inst = insts[i]
        two = [f"{r} {v}" for r, v in sorted(inst["stalls"].items(), key=lambda kv: -kv[1])[:2] if v]
        out.append(f"| {i} | {inst['executed']} | {inst['samples']} | `{inst['source']}` | {', '.join(two)} |")
    if landmarks:
        out += landmark_lines(insts, total_samples)
    if parts:
        out += part_lines(insts, total_samples, parts)
    return "\n".join(out)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass output of one kernel")
    p.add_argument("--warps", type=int, default=0, help="the launch's warps, for executions a warp")
    p.add_argument("--top", type=int, default=20, help="instructions listed by their samples")
    p.add_argument("--landmarks", action="store_true", help="list the barriers, waits, HGMMAs, exits and branches")
    p.add_argument("--part", type=part_spec, action="append", default=[], metavar="NAME:FIRST:END",
                   help="a part's share of the samples and its stall reasons (END -1: to the last row)")
    p.add_argument("--kernel", type=int, default=1, metavar="N",
                   help="the file's Nth listing (default the first)")
    a = p.parse_args(argv)
    if a.warps < 0 or a.top < 0 or a.kernel < 1:
        p.error("--warps and --top must not be negative, --kernel at least 1")
    print(summarise(a.csv, a.warps, a.top, a.landmarks, a.part, a.kernel))


if __name__ == "__main__":
    main(sys.argv[1:])
