// Byte-level BPE (GPT-2 style), as Hugging Face's `BPE` model with a `ByteLevel` pre-tokenizer.
//
// A piece of text is its UTF-8 bytes; each byte b stands for the vocabulary token made of the
// single character byte_char(b) (the GPT-2 table: printable bytes map to themselves, the other 68
// to U+0100..U+0143 in order). Merges are applied by rank, lowest first; among equal ranks the
// leftmost pair goes first. Merging works on token ids, so no strings are built per piece.
//
// A byte whose character is not in the vocabulary becomes the unknown token when there is one
// (consecutive ones fused if fuse_unk), and is dropped otherwise, as Hugging Face does.
//
// Thread-safety: immutable after construction.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sparrow/status.h"

namespace sparrow {

// The GPT-2 byte <-> character table.
uint32_t byte_level_char(uint8_t byte);
// The byte a character stands for, or -1 if the character is not in the table.
int byte_level_byte(uint32_t cp);

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a piece that is itself in the vocabulary is one token
};

class BpeModel {
 public:
  BpeModel() = default;
  // vocab: (token, id) with tokens in byte-level form ("Ġthe"); merges: pairs in rank order.
  // Fails if a merge names a token (or a merged token) that is not in the vocabulary.
  static Expected<BpeModel> build(std::vector<std::pair<std::string, int32_t>> vocab,
                                  const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Appends the ids of one pre-tokenized piece (raw UTF-8 bytes) to `out`.
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  // Token string of `id` in byte-level form, or nullptr if the model has no such id.
  const std::string* token(int32_t id) const;
  std::optional<int32_t> id_of(std::string_view token) const;
  // Largest id + 1.
  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }
  size_t num_merges() const { return num_merges_; }

 private:
  struct MergeTarget {
    int32_t rank;
    int32_t id;
  };
  std::optional<MergeTarget> find_merge(int32_t left, int32_t right) const;
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_large(std::vector<int32_t>& syms) const;

  std::vector<std::string> tokens_;  // id -> token ("" for an unused id)
  std::vector<bool> has_token_;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  std::array<int32_t, 256> byte_ids_{};  // -1: byte's character not in the vocabulary
  std::optional<int32_t> unk_id_;
  BpeOptions options_;
  size_t num_merges_ = 0;

  // Open-addressing hash table (left id, right id) -> (rank, merged id); linear probing.
  struct Slot {
    uint64_t key = ~0ull;
    MergeTarget target{0, 0};
  };
  std::vector<Slot> table_;
  uint64_t mask_ = 0;
};

}  // namespace sparrow
