#include "tokenizer/pre_tokenizer.h"

namespace sparrow {

void split_by_matches(std::string_view piece, const std::vector<Regex::Match>& m, SplitBehavior behavior, bool invert,
                      std::vector<std::string_view>& out) {
  // The piece as alternating (span, is_match) runs, as Hugging Face's find_matches gives them.
  struct Run {
    size_t b, e;
    bool is_match;
  };
  thread_local std::vector<Run> runs;
  runs.clear();
  size_t prev = 0;
  for (const Regex::Match& x : m) {
    if (x.begin != prev) runs.push_back({prev, x.begin, invert});
    runs.push_back({x.begin, x.end, !invert});
    prev = x.end;
  }
  if (prev != piece.size()) runs.push_back({prev, piece.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Run& r : runs) emit(r.b, r.e);
      return;
    case SplitBehavior::kRemoved:
      for (const Run& r : runs)
        if (!r.is_match) emit(r.b, r.e);
      return;
    case SplitBehavior::kContiguous:
    case SplitBehavior::kMergedWithPrevious: {
      // Contiguous: a run joins the previous one when both are matches or both are not.
      // MergedWithPrevious: a match joins the run before it (unless that was a match too).
      std::vector<Run> acc;
      bool previous_match = false;
      for (const Run& r : runs) {
        const bool join = behavior == SplitBehavior::kContiguous ? r.is_match == previous_match
                                                                 : (r.is_match && !previous_match);
        if (join && !acc.empty())
          acc.back().e = r.e;
        else
          acc.push_back(r);
        previous_match = r.is_match;
      }
      for (const Run& r : acc) emit(r.b, r.e);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      // A match joins the run after it (unless that is a match too): the mirror image.
      std::vector<Run> acc;
      bool previous_match = false;
      for (size_t i = runs.size(); i-- > 0;) {
        const Run& r = runs[i];
        if (r.is_match && !previous_match && !acc.empty())
          acc.back().b = r.b;
        else
          acc.push_back(r);
        previous_match = r.is_match;
      }
      for (size_t i = acc.size(); i-- > 0;) emit(acc[i].b, acc[i].e);
      return;
    }
  }
}

Expected<const std::vector<std::string_view>*> PreTokenizer::run(std::string_view text,
                                                                 PreTokenizeScratch& scratch) const {
  std::vector<std::string_view>* cur = &scratch.a;
  std::vector<std::string_view>* next = &scratch.b;
  cur->clear();
  if (!text.empty()) cur->push_back(text);
  for (const PreTokenizerStep& step : steps_) {
    next->clear();
    if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
      for (std::string_view p : *cur) {
        if (step.add_prefix_space && (p.empty() || p.front() != ' ')) {
          scratch.owned.push_back(" " + std::string(p));
          next->push_back(scratch.owned.back());
        } else {
          next->push_back(p);
        }
      }
    } else {
      for (std::string_view p : *cur) {
        scratch.matches.clear();
        SPARROW_RETURN_IF_ERROR(step.regex->find_all(p, scratch.matches));
        if (scratch.matches.empty()) {
          if (step.behavior == SplitBehavior::kRemoved && step.invert) continue;  // all of it is "delimiter"
          next->push_back(p);
          continue;
        }
        split_by_matches(p, scratch.matches, step.behavior, step.invert, *next);
      }
    }
    std::swap(cur, next);
  }
  return cur;
}

}  // namespace sparrow
