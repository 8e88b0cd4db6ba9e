#!/usr/bin/env python3
"""Writes tokenizer.json and tokenizer_config.json for a byte-vocabulary model (needle-tiny).

The vocabulary is the one train.py trains with, 260 ids:
  0..255   byte b is id b (in tokenizer.json, as GPT-2's byte -> character table spells it)
  256      <bos>   (every needle prompt starts with it)
  257      <eos>
  258      <pad>
  259      <unused>
There are no merges, no normalizer, and the ByteLevel pre-tokenizer runs without its regex split,
so any text encodes to exactly its UTF-8 bytes; the ByteLevel decoder maps them back. The four
specials are added tokens (special, matched in the raw text).

BOS: tokenizer_config.json says add_bos_token (true unless --no-bos), which is what Sparrow's
/v1/completions path follows; the TemplateProcessing post-processor says the same for Hugging
Face's `tokenizer(text)`. Encoding with add_special_tokens=False gives the bytes alone.

Pure standard library and deterministic: run it again and the files come out byte-identical.
tests/fixtures/tokenizer/bytes/ holds its output with the default options.
usage: python3 make_tokenizer.py OUT_DIR [--no-bos] [--model-max-length N]
"""
import argparse
import json
import os

SPECIALS = ["<bos>", "<eos>", "<pad>", "<unused>"]  # ids 256, 257, 258, 259


def byte_char(b):
    """GPT-2's byte -> character table: printable bytes stand for themselves, the other 68 map to
    U+0100, U+0101, ... in increasing byte order."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    others = [x for x in range(256) if x not in printable]
    return chr(0x100 + others.index(b))


def build(add_bos, model_max_length):
    vocab = {byte_char(b): b for b in range(256)}
    added_tokens = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    post_processor = None
    if add_bos:
        post_processor = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [256], "tokens": ["<bos>"]}},
        }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    config = {"add_bos_token": add_bos, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
              "pad_token": "<pad>", "model_max_length": model_max_length,
              "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    return tokenizer, config


def main():
    ap = argparse.ArgumentParser(description="Write a byte-level tokenizer.json + tokenizer_config.json (260 ids).")
    ap.add_argument("out_dir")
    ap.add_argument("--no-bos", action="store_true", help="add_bos_token false and no post-processor")
    ap.add_argument("--model-max-length", type=int, default=16384, help="tokenizer_config.json's model_max_length")
    a = ap.parse_args()
    tokenizer, config = build(not a.no_bos, a.model_max_length)
    os.makedirs(a.out_dir, exist_ok=True)
    for name, obj in (("tokenizer.json", tokenizer), ("tokenizer_config.json", config)):
        with open(os.path.join(a.out_dir, name), "w", encoding="utf-8", newline="\n") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
