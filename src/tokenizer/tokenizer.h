// Tokenizer: Hugging Face `tokenizer.json` (byte-level BPE) plus `tokenizer_config.json`.
//
// encode(text):
//   1. added tokens are found in the raw text first: those with normalized=false, then (in the
//      text between them) those with normalized=true; each pass takes the leftmost match and, at
//      one position, the longest token (Hugging Face's leftmost-longest rule);
//   2. every remaining section goes through the normalizer (only the empty one is supported), the
//      pre-tokenizer (pre_tokenizer.h) and byte-level BPE (bpe.h).
// decode(ids): model tokens map back to bytes through the GPT-2 table; added tokens give their
//   text; invalid UTF-8 in the result becomes U+FFFD (one per maximal subpart).
//
// Special tokens (BOS, EOS, <｜User｜>, ...) are found by their string, never by a fixed id:
// token_to_id("<｜User｜>").
//
// Thread-safety: encode/decode are const and may run concurrently; a piece cache inside is
// guarded by a mutex.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparrow/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace sparrow {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;     // skipped by decode(skip_special_tokens=true)
  bool normalized = false;  // matched in the normalized text (second pass)
  bool lstrip = false, rstrip = false;  // the match swallows whitespace on that side
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one; tokenizer_config.json next to it
  // is read when present.
  static Expected<Tokenizer> load(const std::filesystem::path& path);
  // From file contents; `config_json` may be empty. `source` names the origin in error messages.
  static Expected<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view config_json,
                                       const std::string& source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (which must be valid UTF-8). add_special_tokens adds BOS/EOS as
  // tokenizer_config.json's add_bos_token/add_eos_token say (what transformers does); false
  // encodes the raw text only, as HF's add_special_tokens=False.
  Expected<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`; an id outside the vocabulary is an error naming it and its position.
  Expected<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes `id` decodes to (may be part of a UTF-8 character); empty for an unknown id.
  std::string_view token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  bool is_known(int32_t id) const;

  // Added tokens first, then the model's vocabulary (byte-level form, e.g. "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Largest id + 1 (ids below it may be unused).
  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::vector<AddedToken>& added_tokens() const;

  // From tokenizer_config.json (bos_token / eos_token strings, looked up by content).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool add_bos_token() const;
  bool add_eos_token() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  Status encode_section(std::string_view text, std::vector<int32_t>& out) const;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> bytes_;  // id -> decoded bytes ("" for unused ids)
};

// Incremental decoding for streaming: push ids one at a time and get back only complete UTF-8
// text (bytes of a character split across tokens wait for the rest). The concatenation of all
// push() results and finish() equals decode(ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tok_(tokenizer), skip_special_(skip_special_tokens) {}
  std::string push(int32_t id);
  // Flushes what is pending; an incomplete character becomes U+FFFD.
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace sparrow
