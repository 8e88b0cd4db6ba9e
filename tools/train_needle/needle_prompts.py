#!/usr/bin/env python3
"""The needle evaluation prompts, defined exactly so that C++ (`sparrow needle`) and Python agree.

Pure Python (no numpy): `sparrow needle` reimplements this file in src/tools/needle.cpp, and a test
checks that both produce the same ids.  The definition (version 2; version 1 had only the "vk"
format):

* Random numbers: splitmix64.  The state of prompt (seed, length, trial) starts at
  `seed * 0x9E3779B97F4A7C15 + length * 0xBF58476D1CE4E5B9 + trial * 0x94D049BB133111EB`
  (mod 2**64).  `next()` adds 0x9E3779B97F4A7C15 to the state and returns the usual splitmix64
  mix of it.  `below(n)` is `next() % n`.
* Layout of the full sequence, `length` ids: `<bos>` (256), a haystack of `length - 7` bytes, then
  the question `?K` and the answer `ddd` and `\\n`.  The prompt is everything up to and including
  the question's key letter (`length - 4` ids); the answer is the three digits that follow.
* Haystack: filler words of `2 + below(7)` letters `a + below(26)`, each followed by a space, cut
  at the haystack's end.
* Needles: 4.  Keys: distinct upper-case letters, drawn `A + below(26)` in order, redrawing a
  letter already taken.  Values: 3 digits `0 + below(10)` each (drawn after all the keys).
  Depths: needle 0 (the one asked about) at `(trial + 0.5) / trials`, needles 1..3 at
  `below(1000000) / 1e6`.  With `slots = hay_len - 4 * 7`, needle j's raw start is
  `floor(depth_j * (slots - 1))`; the raw starts are sorted (stable, by value then index) and the
  needle of rank r starts at `raw_sorted[r] + 7 r` in the haystack (`8 r` for "kvk").  A needle is the 6 bytes
  `[` d d d K `]` written over the filler (format "vk", the default).  Format "kvk" (version 2)
  writes the 7 bytes `[` K d d d K `]` instead and reserves `slots = hay_len - 4 * 8`; nothing
  else changes, so a "vk" prompt is the same as in version 1.

The order of draws is: all filler words, then the 4 keys, then the 4 values (3 digits each), then
the 3 random depths.
"""

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
BOS = 256
N_NEEDLES = 4
VERSION = 2
FORMATS = ("vk", "kvk")


def needle_bytes(fmt, key, val):
    """The needle as a list of byte values: "vk" = [ddd K], "kvk" = [K ddd K]."""
    if fmt == "vk":
        return [ord("[")] + val + [key, ord("]")]
    if fmt == "kvk":
        return [ord("["), key] + val + [key, ord("]")]
    raise ValueError(f"unknown needle format {fmt!r} (expected one of {FORMATS})")


class SplitMix64:
    def __init__(self, state):
        self.state = state & MASK

    def next(self):
        self.state = (self.state + GOLDEN) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def prompt_state(seed, length, trial):
    return (seed * GOLDEN + length * 0xBF58476D1CE4E5B9 + trial * 0x94D049BB133111EB) & MASK


def make_prompt(seed, length, trial, trials, fmt="vk"):
    """Returns (full_ids, prompt_len, answer_str, info).  full_ids has `length` ids."""
    needle_len = len(needle_bytes(fmt, 0, [0, 0, 0]))
    if length < 64:
        raise ValueError("needle prompts need length >= 64")
    rng = SplitMix64(prompt_state(seed, length, trial))
    hay_len = length - 7
    hay = []
    while len(hay) < hay_len:
        w = 2 + rng.below(7)
        for _ in range(w):
            if len(hay) < hay_len:
                hay.append(ord("a") + rng.below(26))
        if len(hay) < hay_len:
            hay.append(ord(" "))
    keys = []
    while len(keys) < N_NEEDLES:
        k = ord("A") + rng.below(26)
        if k not in keys:
            keys.append(k)
    vals = [[ord("0") + rng.below(10) for _ in range(3)] for _ in range(N_NEEDLES)]
    depths = [(trial + 0.5) / trials] + [rng.below(1000000) / 1e6 for _ in range(N_NEEDLES - 1)]
    slots = hay_len - N_NEEDLES * (needle_len + 1)
    raw = [int(d * (slots - 1)) for d in depths]
    order = sorted(range(N_NEEDLES), key=lambda j: (raw[j], j))
    starts = [0] * N_NEEDLES
    for r, j in enumerate(order):
        starts[j] = raw[j] + r * (needle_len + 1)
    for j in range(N_NEEDLES):
        s = starts[j]
        hay[s:s + needle_len] = needle_bytes(fmt, keys[j], vals[j])
    full = [BOS] + hay + [ord("?"), keys[0]] + vals[0] + [ord("\n")]
    assert len(full) == length
    info = dict(key=chr(keys[0]), value="".join(chr(c) for c in vals[0]), needle_pos=1 + starts[0],
                depth=depths[0])
    return full, length - 4, info["value"], info


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Print needle prompts (JSON lines) for checking the C++ twin.")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lengths", default="256,1024")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--format", default="vk", choices=FORMATS)
    a = ap.parse_args()
    for L in [int(x) for x in a.lengths.split(",")]:
        for t in range(a.trials):
            full, plen, ans, info = make_prompt(a.seed, L, t, a.trials, a.format)
            print(json.dumps(dict(length=L, trial=t, prompt_len=plen, answer=ans, ids=full, **info)))
