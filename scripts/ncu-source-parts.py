#!/usr/bin/env python3
"""Split an `ncu --page source --csv` SASS listing (scripts/gpu-probe.sh's ncu-source-*.csv) into parts.

  python3 scripts/ncu-source-parts.py FILE.csv                    # the landmarks
  python3 scripts/ncu-source-parts.py FILE.csv pro:0:3408 loop:3408:5034 end:5034:-1

Without parts: every executed barrier, wait, HGMMA, EXIT and branch with its row and the share of
the stall samples before it, to choose the parts' boundaries by. With parts (name:first:end rows,
end -1 for the last): each part's share of the samples and its six largest stall reasons.
"""
import csv
import sys

LANDMARKS = ("BAR.", "DEPBAR", "EXIT", "HGMMA", "WARPSYNC", "BRA ", "BRA.")


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1], newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if header is None:
        print(f"ncu-source-parts: {argv[1]} has no 'Address' header row (not an ncu source CSV)", file=sys.stderr)
        return 1
    hdr, data = rows[header], rows[header + 1:]
    try:
        samples = hdr.index("Warp Stall Sampling (All Samples)")
        executed = hdr.index("Instructions Executed")
        source = hdr.index("Source")
    except ValueError as e:
        print(f"ncu-source-parts: {argv[1]}: missing column ({e})", file=sys.stderr)
        return 1
    stalls = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda v: int(v.replace(",", "")) if v not in ("", "-") else 0
    total = sum(num(r[samples]) for r in data) or 1
    print(f"{len(data)} SASS rows, {total} samples")
    if len(argv) == 2:
        before = 0
        for i, r in enumerate(data):
            if num(r[executed]) > 0 and any(k in r[source] for k in LANDMARKS):
                print(f"{i:6d} {100 * before / total:5.1f}% {num(r[executed]):>10d}  {r[source].strip()[:70]}")
            before += num(r[samples])
        return 0
    for part in argv[2:]:
        try:
            name, first, end = part.split(":")
            first, end = int(first), int(end)
        except ValueError:
            print(f"ncu-source-parts: '{part}' is not name:first:end", file=sys.stderr)
            return 2
        seg = data[first:] if end == -1 else data[first:end]
        s = sum(num(r[samples]) for r in seg)
        per = sorted(((hdr[i][len("stall_"):], sum(num(r[i]) for r in seg)) for i in stalls), key=lambda x: -x[1])[:6]
        print(f"{name}: {100 * s / total:.1f}% of the samples; " + ", ".join(f"{k} {100 * v / max(s, 1):.0f}%" for k, v in per))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
