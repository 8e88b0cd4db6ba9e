// Pre-tokenization: how a section of text (between added tokens) is cut into the pieces that BPE
// encodes one at a time, as tokenizer.json's `pre_tokenizer` describes it.
//
// Supported steps, applied in order, each to every piece the previous step produced (as Hugging
// Face's Sequence does):
//   Split     {pattern: {Regex|String}, behavior, invert}: behaviors Removed, Isolated,
//             MergedWithPrevious, MergedWithNext, Contiguous.
//   ByteLevel {add_prefix_space, use_regex}: optional leading space and GPT-2 split; the byte to
//             character mapping itself is folded into the BPE model (bpe.h).
//   Digits    {individual_digits}.
// Anything else is refused at load with a message naming it.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sparrow/status.h"
#include "tokenizer/regex.h"

namespace sparrow {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // kSplit (Digits becomes a Split on \p{N} too).
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel: the GPT-2 split is a kSplit step placed right after, so only the prefix remains.
  bool add_prefix_space = false;
};

// Scratch space for pre_tokenize: owns strings made by a prefix space and the match buffers, so
// that repeated calls allocate nothing once warm. One per thread.
struct PreTokenizeScratch {
  std::deque<std::string> owned;
  std::vector<std::string_view> a, b;
  std::vector<Regex::Match> matches;
  void clear() {
    owned.clear();
    a.clear();
    b.clear();
  }
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  // Pieces of `text` in order; each views `text` or a string owned by `scratch`.
  // REQUIRES: `text` is valid UTF-8. The result lives in scratch.a (or scratch.b).
  Expected<const std::vector<std::string_view>*> run(std::string_view text, PreTokenizeScratch& scratch) const;

  bool empty() const { return steps_.empty(); }

 private:
  std::vector<PreTokenizerStep> steps_;
};

// Splits `piece` around the non-empty matches `m` (sorted, non-overlapping) per `behavior`,
// appending the pieces to `out` (empty pieces are dropped, as Hugging Face does).
void split_by_matches(std::string_view piece, const std::vector<Regex::Match>& m, SplitBehavior behavior, bool invert,
                      std::vector<std::string_view>& out);

}  // namespace sparrow
