#!/usr/bin/env python3
"""Where does a checkpoint's first answer digit come from?  Runs Sparrow's forward (`sparrow logits`,
CPU by default) on needle_prompts.py's prompts in three variants and counts, for the greedy first
digit, whether it is the asked needle's, another needle's, or no needle's:

  normal   the prompt as `sparrow needle` builds it (4 needles, one asked);
  single   the three distractor needles overwritten by filler ('x'): can it retrieve at all?
  absent   the asked key replaced by a letter in no needle: does it answer from the key at all?

A model that answers "normal" at about 1/4 + 3/4 * 1/10 and "single" perfectly, and still answers
"absent" with some needle's digit, retrieves needles but does not choose them by key.

    /usr/bin/python3 tools/train_needle/probe.py --model models/needle-tiny --length 512 --trials 48

Needs numpy and a built `sparrow` (--sparrow, default build/bin/sparrow).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle_prompts as NP  # noqa: E402


def needles_in(ids, fmt):
    """(start, key, first digit) of each needle in the haystack."""
    n = len(NP.needle_bytes(fmt, 0, [0, 0, 0]))
    out = []
    for i in range(1, len(ids) - n):
        if ids[i] != ord("[") or ids[i + n - 1] != ord("]"):
            continue
        key = ids[i + n - 2]
        first = ids[i + 1] if fmt == "vk" else ids[i + 2]
        if 65 <= key <= 90 and 48 <= first <= 57:
            out.append((i, key, first))
    return out


def model_format(model_dir):
    """The layout the model was trained on, as `sparrow needle --needle-format auto` reads it."""
    path = os.path.join(model_dir, "training_summary.json")
    if not os.path.exists(path):
        return "vk"
    with open(path) as f:
        return json.load(f).get("args", {}).get("needle_format", "vk")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--format", default="auto", choices=("auto",) + tuple(NP.FORMATS),
                    help="needle layout; auto: args.needle_format of the model's training_summary.json, else vk")
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--trials", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--sparrow", default="build/bin/sparrow")
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    if a.format == "auto":
        a.format = model_format(a.model)
    tmp = tempfile.mkdtemp(prefix="probe-")
    width = len(NP.needle_bytes(a.format, 0, [0, 0, 0]))
    for mode in ("normal", "single", "absent"):
        asked_n = other = none = 0
        for t in range(a.trials):
            full, plen, _ans, _info = NP.make_prompt(a.seed, a.length, t, a.trials, a.format)
            ids = list(full[:plen])
            found = needles_in(ids, a.format)
            asked = ids[-1]
            if mode == "single":
                for (i, k, _f) in found:
                    if k != asked:
                        ids[i:i + width] = [ord("x")] * width
                found = [x for x in found if x[1] == asked]
            if mode == "absent":
                present = {k for (_i, k, _f) in found}
                asked = next(c for c in range(65, 91) if c not in present)
                ids[-1] = asked
            np.save(os.path.join(tmp, "ids.npy"), np.array(ids, dtype=np.int32))
            r = subprocess.run([a.sparrow, "logits", "--model", a.model, "--backend", a.backend,
                                "--ids", os.path.join(tmp, "ids.npy"), "--out", os.path.join(tmp, "lg.npy")],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"sparrow logits failed: {r.stderr.strip()}")
            d1 = int(np.load(os.path.join(tmp, "lg.npy"))[-1].argmax())
            if any(k == asked and f == d1 for (_i, k, f) in found):
                asked_n += 1
            elif any(f == d1 for (_i, _k, f) in found):
                other += 1
            else:
                none += 1
        print(f"{mode:7s} L={a.length} trials={a.trials}: first digit is the asked needle's {asked_n}, "
              f"another needle's {other}, no needle's {none}")


if __name__ == "__main__":
    main()
