#!/usr/bin/env python3
"""Checks the rule of programmatic dependent launch in the CUDA backend (device_common.cuh):

* no kernel is launched with <<<...>>> (launch() marks every launch a programmatic dependent, so a
  plain launch would be the one kernel whose predecessor may still be running without it waiting);
* every __global__ kernel's body calls wait_previous_grid(), as its first statement, except the
  kernels named in LATE_WAITERS, which copy memory no kernel writes first (their reason below).

Usage: check_kernel_launches.py FILE...   (exit 0: the rule holds; 1: what breaks it is printed)
"""
import re
import sys

# Kernels that may do work before the wait, and why it is safe.
LATE_WAITERS = {
    # The FP8 form copies its first weight groups (host uploads, never written by a kernel) first;
    # the W4A8 decode form too, and reads its plan first, when the plan is two launches back
    # (plan_early); blocks past the last row wait before they return.
    "grouped_w4a8_wgmma_kernel",
    # Its producer-warp twin: the same when the plan is early (the weights and their scales of its
    # first slots, then the wait; every warp waits before it reads a kernel's output).
    "w4a8_decode_ws_kernel",
    # Copies its first weight steps (model weights, or bf16 copies written two launches back) first.
    "bf16_linear_decode_kernel",
    # Computes the angles from the batch's uploaded positions and its table argument first.
    "rope_kernel",
    # Reads its pinned host source (a captured step's staging, which no kernel writes) first.
    "upload_pinned_kernel",
    # Loads its mix and norm weights (model weights, never written by a kernel) into registers first.
    "hc_boundary_kernel",
    # Ask L2 for their weight rows first (prefetch_l2: a hint, safe for any memory).
    "hc_mix_tile_kernel",
    "hc_mix_staged_kernel",
    "rms_norm_kernel",
    "rms_norm_warp_kernel",
}


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def body_after(src, start):
    """The text of the brace block that opens at or after `start`, and where it opens."""
    open_at = src.index("{", start)
    depth = 0
    for i in range(open_at, len(src)):
        if src[i] == "{":
            depth += 1
        elif src[i] == "}":
            depth -= 1
            if depth == 0:
                return open_at, src[open_at + 1:i]
    raise ValueError("unbalanced braces")


def check(path):
    problems = []
    src = strip_comments(open(path, encoding="utf-8").read())
    for m in re.finditer(r"<<<", src):
        line = src.count("\n", 0, m.start()) + 1
        problems.append(f"{path}:{line}: a <<<>>> launch (use launch(), device_common.cuh)")
    for m in re.finditer(r"__global__\b", src):
        semi, brace = src.find(";", m.end()), src.find("{", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration
        head = src[m.end():brace]
        name = re.findall(r"(\w+)\s*\(", head)
        name = [n for n in name if n != "__launch_bounds__"]
        name = name[0] if name else "?"
        line = src.count("\n", 0, m.start()) + 1
        _, body = body_after(src, m.end())
        first = body.strip().split(";", 1)[0].strip() + ";"
        if "wait_previous_grid()" not in body:
            problems.append(f"{path}:{line}: kernel {name} never calls wait_previous_grid()")
        elif first != "wait_previous_grid();" and name not in LATE_WAITERS:
            problems.append(f"{path}:{line}: kernel {name} does something before wait_previous_grid(): '{first}'")
    return problems


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    problems = [p for f in argv[1:] for p in check(f)]
    for p in problems:
        print(p, file=sys.stderr)
    kernels = sum(len(re.findall(r"__global__\b", strip_comments(open(f).read()))) for f in argv[1:])
    print(f"{len(argv) - 1} files, {kernels} __global__ occurrences, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
