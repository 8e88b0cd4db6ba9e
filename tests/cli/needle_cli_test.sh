#!/usr/bin/env bash
# `sparrow needle` end to end on a random byte-vocabulary model: the table, --json's structure,
# --dump-prompts against tools/train_needle/needle_prompts.py, and the errors that need a model
# with the byte vocabulary (the others are plain add_test cases in tests/CMakeLists.txt).
# usage: needle_cli_test.sh SPARROW WRITE_BYTE_MODEL WORKDIR
set -euo pipefail
sparrow=$1 writer=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
rm -rf "$work"
mkdir -p "$work"
"$writer" "$work/model"
fail() { echo "needle_cli_test: $*" >&2; exit 1; }

# Table: a header and one row per length, hits <= trials.
"$sparrow" needle --model "$work/model" --lengths 64,100 --trials 3 --seed 9 > "$work/table.txt" 2> "$work/table.err"
cat "$work/table.txt"
grep -q 'recall@1' "$work/table.txt" || fail "no table header"
[ "$(grep -c '/3 ' "$work/table.txt")" -eq 2 ] || fail "expected two rows of 3 trials"
grep -q 'needle length 100: 3/3 trials' "$work/table.err" || fail "no progress on stderr"

# --json: {"results": [{"length", "recall", "trials", ...}]}, and --dump-prompts.
"$sparrow" needle --model "$work/model" --lengths 64,1k --trials 2 --seed 7 --json --batch-tokens 300 \
  --dump-prompts "$work/prompts.jsonl" > "$work/out.json" 2> /dev/null
python3 - "$work/out.json" "$work/prompts.jsonl" "$root/tools/train_needle" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
assert set(out) == {"results"}, out
rows = out["results"]
assert [r["length"] for r in rows] == [64, 1024], rows
for r in rows:
    assert {"length", "recall", "trials", "hits", "digit_acc", "seconds"} <= set(r), r
    assert r["trials"] == 2 and 0 <= r["hits"] <= r["trials"], r
    assert r["recall"] == r["hits"] / r["trials"], r
    assert 0.0 <= r["digit_acc"] <= 1.0, r
sys.path.insert(0, sys.argv[3])
from needle_prompts import make_prompt
lines = [json.loads(l) for l in open(sys.argv[2])]
assert [(p["length"], p["trial"]) for p in lines] == [(64, 0), (64, 1), (1024, 0), (1024, 1)], lines
for p in lines:
    full, plen, ans, info = make_prompt(7, p["length"], p["trial"], 2)
    assert p["ids"] == full and p["prompt_len"] == plen and p["answer"] == ans, p["trial"]
    assert p["key"] == info["key"] and p["needle_pos"] == info["needle_pos"] and p["depth"] == info["depth"]
print("needle_cli_test: json and dumped prompts ok")
PY

# A length above the model's max_position_embeddings (4096).
"$here/expect_error.sh" "--lengths: 8192 is above the model's max_position_embeddings 4096" \
  "$sparrow" needle --model "$work/model" --lengths 1k,8k --trials 1
echo "needle_cli_test: ok"
