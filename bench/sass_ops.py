#!/usr/bin/env python3
"""A kernel's SASS opcodes counted from an sm_90a cubin, on a machine without cuobjdump or nvdisasm.

Each sm_90 instruction is 128 bits; the low 12 bits of its first 64-bit word name the opcode
(modifiers such as IMAD.MOV or .WIDE share it). bench/sm90_opcodes.json maps those bits to
mnemonics (192 of them). It was read off `cuobjdump -sass` of the cubins of the five kernel sources
(src/backends/cuda/kernels_*.cu) on the device machine (sixty-second session, CUDA 13.0), where no
two mnemonics shared 12 bits; an opcode it lacks prints as ?XYZ (its 12 bits in hex).

Static counts only: what the compiler emitted, not what runs. They answer questions such as "did
this change move the wgmma descriptors out of the uniform registers" (R2UR before each HGMMA) or
"how many instructions did this edit add to the loop" without a GPU (docs/perf.md, sixty-second
session).

  python3 bench/sass_ops.py KERNELS.cubin REGEX [--seq] [--ops R2UR,HGMMA] [--load-use N]
    REGEX   matched against each kernel's mangled name (its .text.NAME section); every match is shown
    --seq   also each instruction's offset and opcode, one a line
    --ops   only these opcodes' counts (comma-separated), in that order
    --load-use N  also how many of the kernel's global loads (LDG) have their destination register
            read within the next N instructions: a load its consumer waits for at once. Several in a
            row were the fault of the one-row norm (docs/perf.md, sixty-third session: predicated
            loads that ptxas issued one memory latency after another). A heuristic: it takes an
            instruction's destination from bits 16-23 and its sources from bits 24-31, 32-39 and
            the second word's bits 0-7 (as the norm's `LDG.E.U16 R35` and `IMAD.U32 R35, R35,
            0x10000` read in ncu's listing); an immediate there can count as a read.

A cubin of one source file: KEEP=OUT.cubin bash scripts/kernel-sizes.sh FILE.cu (it compiles the file
as the build does, to an sm_90a cubin).
"""
import argparse
import collections
import json
import os
import re
import struct
import sys


def load_table(path):
    with open(path) as f:
        return {int(k, 16): v for k, v in json.load(f).items()}


def text_sections(data):
    """(name, bytes) of each .text.* section of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file (a cubin)")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0 or shstrndx >= shnum:
        raise ValueError("the ELF file has no section table")
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = secs[shstrndx][4]
    for sh in secs:
        start = strtab_off + sh[0]
        name = data[start:data.index(b"\0", start)].decode()
        if name.startswith(".text."):
            yield name[len(".text."):], data[sh[4]:sh[4] + sh[5]]


def opcodes(code, table):
    out = []
    for off in range(0, len(code) - 15, 16):
        bits = struct.unpack_from("<Q", code, off)[0] & 0xFFF
        out.append(table.get(bits, "?%03X" % bits))
    return out


def load_uses(code, table, window):
    """(global loads, those whose destination register an instruction within `window` reads)."""
    ins = [struct.unpack_from("<QQ", code, off) for off in range(0, len(code) - 15, 16)]
    loads = near = 0
    for i, (w0, _) in enumerate(ins):
        if table.get(w0 & 0xFFF) != "LDG":
            continue
        rd = (w0 >> 16) & 0xFF
        if rd == 255:  # RZ: nothing waits for it
            continue
        loads += 1
        for a0, a1 in ins[i + 1:i + 1 + window]:
            if rd in ((a0 >> 24) & 0xFF, (a0 >> 32) & 0xFF, a1 & 0xFF):
                near += 1
                break
    return loads, near


def main(argv):
    ap = argparse.ArgumentParser(description="Count a kernel's SASS opcodes in an sm_90a cubin")
    ap.add_argument("cubin")
    ap.add_argument("regex", help="matched against the kernels' mangled names")
    ap.add_argument("--seq", action="store_true", help="each instruction's offset and opcode")
    ap.add_argument("--ops", default="", help="only these opcodes' counts, comma-separated")
    ap.add_argument("--load-use", type=int, default=0, metavar="N",
                    help="also the global loads whose destination is read within N instructions")
    ap.add_argument("--table", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm90_opcodes.json"))
    a = ap.parse_args(argv)
    try:
        table = load_table(a.table)
        with open(a.cubin, "rb") as f:
            data = f.read()
        kernels = list(text_sections(data))
    except (OSError, ValueError, struct.error) as e:
        print(f"sass_ops: {e}", file=sys.stderr)
        return 1
    pat = re.compile(a.regex)
    hits = [(n, c) for n, c in kernels if pat.search(n)]
    if not hits:
        print(f"sass_ops: no kernel of {a.cubin} matches '{a.regex}' ({len(kernels)} kernels)", file=sys.stderr)
        return 1
    wanted = [o for o in a.ops.split(",") if o]
    for name, code in hits:
        seq = opcodes(code, table)
        counts = collections.Counter(seq)
        print(f"{name}: {len(seq)} instructions")
        if wanted:
            print("  " + " ".join(f"{o}:{counts.get(o, 0)}" for o in wanted))
        else:
            print("  " + " ".join(f"{o}:{n}" for o, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))
        if a.load_use > 0:
            loads, near = load_uses(code, table, a.load_use)
            print(f"  LDG {loads}, read within {a.load_use} instructions: {near}")
        if a.seq:
            for i, o in enumerate(seq):
                print(f"  {16 * i:06x} {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
