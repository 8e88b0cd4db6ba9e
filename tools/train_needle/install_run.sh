#!/usr/bin/env bash
# Installs a training run collected by `device_train.sh collect` (a <variant>.tgz, or the run
# directory itself) as models/needle-tiny/, on the developer machine:
#
#   bash tools/train_needle/install_run.sh /work/.device/N/n12sup.tgz
#
# Copies the weights and config, writes the byte tokenizer (make_tokenizer.py, 16384 positions),
# summary.json as training_summary.json, golden_hf.json and the gzipped step log, removes the
# previous run's extra log, and prints the run's Recall@1 tables (transformers) for the card. The
# card (models/needle-tiny/README.md) is yours to rewrite; the NeedleTiny.* tests then hold Sparrow
# to the new run's own numbers (`ctest -R NeedleTiny`), and `sparrow needle` measures it.
set -euo pipefail
src=${1:?usage: install_run.sh RUN.tgz|RUN_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dst="$root/models/needle-tiny"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -d "$src" ]; then
  cp -r "$src"/. "$work"/
else
  tar xzf "$src" -C "$work"
fi
for f in needle-tiny/config.json needle-tiny/model.safetensors summary.json golden_hf.json train_log.jsonl; do
  [ -f "$work/$f" ] || { echo "install_run.sh: $src has no $f" >&2; exit 1; }
done
mkdir -p "$dst"
cp "$work/needle-tiny/config.json" "$work/needle-tiny/model.safetensors" "$dst/"
[ -f "$work/needle-tiny/generation_config.json" ] && cp "$work/needle-tiny/generation_config.json" "$dst/"
python3 "$here/make_tokenizer.py" "$dst" --model-max-length 16384
cp "$work/summary.json" "$dst/training_summary.json"
cp "$work/golden_hf.json" "$dst/golden_hf.json"
gzip -9 -c "$work/train_log.jsonl" > "$dst/train_log.jsonl.gz"
rm -f "$dst/train_log_continued.jsonl.gz"
python3 - "$dst/training_summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"steps {s['steps']}, {s['train_seconds']} s, stage switch at {s['stage_switch_s']} s; "
      f"format {s['args'].get('needle_format', 'vk')}, needles {s['args'].get('needles', '2,6')}, "
      f"head dim {s['config'].get('head_dim')}, attn-sup {s['args'].get('attn_sup', 0)}")
for name in ("recall", "recall_dense_csa"):
    rows = s[name]
    print(f"{name:17s} " + "  ".join(f"{r['length']}: {r['recall']:.3f}" for r in rows))
PY
ls -la "$dst"
