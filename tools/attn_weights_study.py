#!/usr/bin/env python3
"""The accuracy cost of bf16 attention weights (`--attn-weights bf16`), measured on the CPU backend.

For each run (the oracle fixtures on their ids, needle-tiny on needle prompts fed without the
answer) it writes the logits of three sides with `sparrow logits`: fp32, fast, and fast with the
attention's softmax weights rounded to bf16 (flash-attention's bf16 P), and prints per run the
logits' cosine distance (1 - cos over the whole [T, V], fp64) and the greedy top-1 agreement of
fast and fast+bf16 weights against fp32, and of the two against each other. Standard library only.

  python3 tools/attn_weights_study.py --sparrow build/bin/sparrow [--lengths 1k,4k] [--trials 2]
"""
import argparse
import ast
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


def read_npy(path):
    """A float32 C-order .npy as (shape, flat list)."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError(path + ": not a .npy file")
        major = f.read(2)[0]
        hlen = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = ast.literal_eval(f.read(hlen).decode("latin1"))
        if header["descr"] != "<f4" or header["fortran_order"]:
            raise ValueError(path + ": expected little-endian float32 in C order, got " + str(header))
        shape = tuple(header["shape"])
        n = 1
        for d in shape:
            n *= d
        data = struct.unpack("<%df" % n, f.read(4 * n))
    return shape, data


def compare(a, b):
    """(cosine distance over everything, top-1 agreement over rows) of two [T, V] logits."""
    (shape_a, x), (shape_b, y) = a, b
    if shape_a != shape_b:
        raise ValueError("shapes differ: %s vs %s" % (shape_a, shape_b))
    T, V = shape_a[-2], shape_a[-1]
    dot = sum(p * q for p, q in zip(x, y))
    na = math.sqrt(sum(p * p for p in x))
    nb = math.sqrt(sum(q * q for q in y))
    agree = 0
    for t in range(T):
        ra, rb = x[t * V:(t + 1) * V], y[t * V:(t + 1) * V]
        agree += max(range(V), key=ra.__getitem__) == max(range(V), key=rb.__getitem__)
    return 1.0 - dot / (na * nb), agree / T


def write_ids(path, ids):
    """ids as an int32 [T] .npy."""
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(ids)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%di" % len(ids), *ids))


def logits(sparrow, model, ids, out, extra):
    cmd = [sparrow, "logits", "--backend", "cpu", "--model", model, "--ids", ids, "--out", out] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return read_npy(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sparrow", default="build/bin/sparrow")
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--needle-model", default="models/needle-tiny")
    ap.add_argument("--lengths", default="1k,4k", help="needle prompt lengths")
    ap.add_argument("--trials", type=int, default=2, help="needle prompts a length")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="attn-weights-")
    runs = []
    for name in ("swa_hash", "csa", "hca", "mixed_hc2", "mixed_bf16"):
        d = os.path.join(args.fixtures, name)
        if os.path.isdir(d):
            runs.append((name, d, os.path.join(d, "ids.npy")))
    prompts = os.path.join(tmp, "prompts.jsonl")
    r = subprocess.run([args.sparrow, "needle", "--model", args.needle_model, "--lengths", args.lengths, "--trials",
                        str(args.trials), "--dump-prompts", prompts], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("needle --dump-prompts failed:\n" + r.stderr[-2000:])
    with open(prompts) as f:
        for line in f:
            p = json.loads(line)
            ids = os.path.join(tmp, "needle-%d-%d.npy" % (p["length"], p["trial"]))
            write_ids(ids, p["ids"][:p["prompt_len"]])
            runs.append(("needle-tiny T=%d #%d" % (p["prompt_len"], p["trial"]), args.needle_model, ids))
    rows = []
    for name, model, ids in runs:
        base = os.path.join(tmp, name.replace(" ", "_").replace("#", "").replace("=", ""))
        ref = logits(args.sparrow, model, ids, base + "-fp32.npy", ["--precision", "fp32"])
        fast = logits(args.sparrow, model, ids, base + "-fast.npy", ["--precision", "fast"])
        fast_bf16 = logits(args.sparrow, model, ids, base + "-fastw.npy", ["--precision", "fast", "--attn-weights", "bf16"])
        f_cd, f_top = compare(ref, fast)
        w_cd, w_top = compare(ref, fast_bf16)
        x_cd, x_top = compare(fast, fast_bf16)
        rows.append({"run": name, "T": ref[0][-2], "fast_cos_dist": f_cd, "fast_top1": f_top,
                     "fast_bf16w_cos_dist": w_cd, "fast_bf16w_top1": w_top, "between_cos_dist": x_cd,
                     "between_top1": x_top})
        print("%-22s T=%5d  fast %.3e / %.4f   fast+bf16 weights %.3e / %.4f   between %.3e / %.4f" %
              (name, ref[0][-2], f_cd, f_top, w_cd, w_top, x_cd, x_top), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| run | T | fast: cos-dist / top-1 | fast + bf16 weights: cos-dist / top-1 | between the two: cos-dist / top-1 |")
        print("|---|---|---|---|---|")
        for r in rows:
            print("| %s | %d | %.3e / %.4f | %.3e / %.4f | %.3e / %.4f |" %
                  (r["run"], r["T"], r["fast_cos_dist"], r["fast_top1"], r["fast_bf16w_cos_dist"], r["fast_bf16w_top1"],
                   r["between_cos_dist"], r["between_top1"]))


if __name__ == "__main__":
    main()
