// Needle-in-a-haystack recall (issue 9): the evaluation prompts of
// tools/train_needle/needle_prompts.py (version 1) rebuilt bit for bit, and the greedy Recall@1
// measurement of `sparrow needle`.
//
// A prompt of length L is `<bos>` (256), L - 7 haystack bytes holding 4 needles `[ddd K]`, then
// `?K`; the model must continue with the three digits of the needle whose key is K. The full
// sequence (L ids) also holds the answer and `\n`; only its first L - 4 ids are fed. The byte
// layout, the random stream (splitmix64) and the order of draws are defined in needle_prompts.py's
// docstring; tests/fixtures/needle/ holds its output for a check of this twin.
//
// Recall: each prompt is prefilled, then 2 decode steps give 3 greedy tokens (argmax ties to the
// lower id, as Session::generate); a trial is a hit when all three equal the answer's digits.
// Trials run several sequences per forward (each with its own SequenceState, as the engine batches
// requests); a sequence's logits do not depend on its batch-mates or on the prefill chunking.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

inline constexpr int32_t kNeedleBos = 256;        // the byte vocabulary's <bos>
inline constexpr int64_t kNeedleMinLength = 64;   // needle_prompts.py refuses shorter prompts
inline constexpr int64_t kNeedleAnswerLen = 3;    // digits in a needle's value
inline constexpr int64_t kNeedleMinVocab = kNeedleBos + 1;

struct NeedlePrompt {
  int64_t length = 0, trial = 0;
  std::vector<int32_t> ids;  // [length]: the full sequence, answer and "\n" included
  int64_t prompt_len = 0;    // length - 4: the ids fed to the model
  std::string answer;        // the 3 digits
  char key = 0;              // the key letter asked about
  int64_t needle_pos = 0;    // index in `ids` of the asked needle's '['
  double depth = 0;          // (trial + 0.5) / trials

  std::span<const int32_t> prompt() const { return std::span<const int32_t>(ids).first(prompt_len); }
};

// Prompt `trial` of `trials` at `length` (needle_prompts.py's make_prompt). `seed` is taken mod
// 2^64, as Python's `& MASK` does for a negative seed.
// Fails if length < kNeedleMinLength or trial is outside [0, trials).
// The needle's layout (needle_prompts.py's `fmt`): kValueKey "[ddd K]" (version 1, the default),
// kKeyValueKey "[K ddd K]".
enum class NeedleFormat { kValueKey, kKeyValueKey };
// "vk" / "kvk".
const char* needle_format_name(NeedleFormat f);
Expected<NeedleFormat> needle_format_parse(std::string_view name);
// The layout a checkpoint directory was trained on: `args.needle_format` of its
// training_summary.json (written by tools/train_needle/train.py); kValueKey when the directory has
// no such file or the summary predates the option. A summary that is not JSON, or names an unknown
// layout, is an error naming the file.
Expected<NeedleFormat> needle_format_of_model(const std::filesystem::path& model_dir);

Expected<NeedlePrompt> needle_prompt_make(uint64_t seed, int64_t length, int64_t trial, int64_t trials,
                                          NeedleFormat format = NeedleFormat::kValueKey);

// One JSON line (no newline): length, trial, prompt_len, answer, key, needle_pos, depth, ids.
std::string needle_prompt_json(const NeedlePrompt& p);

struct NeedleOptions {
  std::vector<int64_t> lengths;
  int64_t trials = 20;
  uint64_t seed = 1234;
  // Prompt tokens per forward: as many trials as fit run in one batch; a longer prompt is
  // prefilled in chunks of this size.
  int64_t batch_tokens = 16384;
  NeedleFormat format = NeedleFormat::kValueKey;
};

struct NeedleTrial {
  int64_t trial = 0;
  std::string answer;
  char key = 0;
  std::vector<int32_t> predicted;  // [3] greedy ids
  int64_t digits_right = 0;        // positions where predicted equals the answer digit
  bool hit = false;
};

struct NeedleLengthResult {
  int64_t length = 0, trials = 0, hits = 0, digits_right = 0;
  double seconds = 0;
  std::vector<NeedleTrial> per_trial;
  double recall() const { return trials ? static_cast<double>(hits) / static_cast<double>(trials) : 0.0; }
  double digit_acc() const {
    return trials ? static_cast<double>(digits_right) / static_cast<double>(trials * kNeedleAnswerLen) : 0.0;
  }
};

// Called after each batch: (length, trials done at this length, trials at this length, hits so far).
using NeedleProgressFn = std::function<void(int64_t length, int64_t done, int64_t total, int64_t hits)>;

// Checks options against the model config: lengths in [kNeedleMinLength, max_position_embeddings],
// trials >= 1, batch_tokens >= 1, vocab_size >= kNeedleMinVocab.
Status needle_options_check(const NeedleOptions& o, const ModelConfig& c);

// Recall@1 per length, in the order of o.lengths.
Expected<std::vector<NeedleLengthResult>> needle_recall(const Model& model, Backend& backend, const NeedleOptions& o,
                                                        const NeedleProgressFn& progress = {});

// A table: length, recall@1, hits/trials, digit accuracy, seconds.
std::string needle_table_text(const std::vector<NeedleLengthResult>& rows);
// {"results": [{"length": L, "recall": r, "trials": n, "hits": h, "digit_acc": d, "seconds": s}, ...]}
std::string needle_table_json(const std::vector<NeedleLengthResult>& rows);

}  // namespace sparrow
