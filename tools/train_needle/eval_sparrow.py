#!/usr/bin/env python3
"""Recall@1 of Sparrow on the saved needle prompts (python3 standard library only: no numpy/torch).

For every models/needle-tiny/prompts/L{len}_t{i}.npy (prompt ids, ending with the key letter) and
its .json (the answer digits), it appends the three answer digits, runs

    build/bin/sparrow logits --model MODEL --ids IDS.npy --out LOGITS.npy [extra args]

(one multi-token forward, like the transformers evaluation) and checks that the argmax at the
three answer positions gives the three digits.  Prints a table per length.

Usage: python3 tools/train_needle/eval_sparrow.py [--model models/needle-tiny]
           [--sparrow build/bin/sparrow] [--extra "--backend cpu"]
"""

import argparse
import array
import ast
import glob
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile


def read_npy(path):
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not an .npy file")
    major = data[6]
    if major == 1:
        hlen = struct.unpack("<H", data[8:10])[0]
        off = 10
    else:
        hlen = struct.unpack("<I", data[8:12])[0]
        off = 12
    header = ast.literal_eval(data[off:off + hlen].decode("latin1"))
    descr, shape = header["descr"], tuple(header["shape"])
    if header.get("fortran_order"):
        raise ValueError("fortran order not supported")
    code = {"<i8": "q", "<i4": "i", "<f4": "f"}[descr]
    arr = array.array(code)
    arr.frombytes(data[off + hlen:])
    if sys.byteorder != "little":
        arr.byteswap()
    return arr, shape


def write_npy_i64(path, values):
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }" % len(values)
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    arr = array.array("q", values)
    if sys.byteorder != "little":
        arr.byteswap()
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        fh.write(arr.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/needle-tiny")
    ap.add_argument("--sparrow", default="build/bin/sparrow")
    ap.add_argument("--extra", default="", help="extra arguments for `sparrow logits`")
    args = ap.parse_args()

    prompts = sorted(glob.glob(os.path.join(args.model, "prompts", "L*_t*.npy")),
                     key=lambda p: tuple(int(x) for x in re.findall(r"\d+", os.path.basename(p))))
    if not prompts:
        print("no prompts found", file=sys.stderr)
        return 1
    per_len = {}
    with tempfile.TemporaryDirectory() as tmp:
        for p in prompts:
            info = json.load(open(p[:-4] + ".json"))
            ids, _ = read_npy(p)
            ids = list(ids)
            answer = [ord(c) for c in info["answer"]]
            full = ids + answer
            ids_path = os.path.join(tmp, "ids.npy")
            out_path = os.path.join(tmp, "logits.npy")
            write_npy_i64(ids_path, full)
            cmd = [args.sparrow, "logits", "--model", args.model, "--ids", ids_path, "--out", out_path]
            cmd += shlex.split(args.extra)
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{p}: sparrow failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
                return 1
            logits, shape = read_npy(out_path)
            T, V = shape
            preds = []
            for d in range(3):
                pos = len(ids) - 1 + d  # logits at pos predict ids[pos+1]
                row = logits[pos * V:(pos + 1) * V]
                preds.append(max(range(V), key=row.__getitem__))
            ok = preds == answer
            L = info["length"]
            hits, n, dig = per_len.get(L, (0, 0, 0))
            per_len[L] = (hits + int(ok), n + 1, dig + sum(int(a == b) for a, b in zip(preds, answer)))
            got = "".join(chr(c) if c < 256 else f"<{c}>" for c in preds)
            print(f"{os.path.basename(p)}: key {info['key']} answer {info['answer']} sparrow {got} "
                  f"depth {info.get('depth', 0):.3f} {'OK' if ok else 'miss'}", flush=True)
    print("\n| length | Recall@1 | digit acc | trials |\n|---|---|---|---|")
    for L in sorted(per_len):
        hits, n, dig = per_len[L]
        print(f"| {L} | {hits / n:.3f} | {dig / (3 * n):.3f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
