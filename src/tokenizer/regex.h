// Pre-tokenizer regexes: PCRE2 (JIT-compiled) with Oniguruma's meaning of the patterns.
//
// Hugging Face `tokenizers` compiles the patterns of tokenizer.json with Oniguruma (Ruby syntax,
// UTF-8). PCRE2 with UTF and UCP agrees on the syntax these files use (classes, \p{..}, lookahead,
// alternation, greedy quantifiers) and on leftmost-first backtracking. What differs is rewritten:
//   \s       Oniguruma: White_Space (U+0009..U+000D, U+0085, Z*); PCRE2's UCP \s lacks U+0085
//   \h       Oniguruma: a hex digit; PCRE2: horizontal space
//   \uHHHH   Oniguruma only; becomes \x{HHHH}
//   ^, $     line anchors in Ruby syntax (PCRE2_MULTILINE), with LF as the only newline
//   classes  PCRE2's Unicode tables may be older than Oniguruma's (Debian 12: Unicode 14 against
//            16), so every class built from properties is checked against the generated table
//            (unicode_categories.h) and patched to match it exactly (see the .cpp).
// What cannot be mapped exactly is refused, not guessed: \w \W \b \B, nested classes, class
// intersections, POSIX [:name:]. Script properties (\p{Han}) use PCRE2's own tables.
//
// Thread-safety: a compiled Regex is immutable; find_all may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sparrow/status.h"

namespace sparrow {

// Rewrites an Oniguruma pattern into an equivalent PCRE2 pattern (see the file comment).
Expected<std::string> regex_translate_oniguruma(std::string_view pattern);

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern (translated, then JIT-compiled when the JIT is available).
  static Expected<Regex> compile(std::string_view oniguruma_pattern);
  // Compiles a pattern matching `literal` exactly.
  static Expected<Regex> literal(std::string_view literal);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  struct Match {
    size_t begin, end;  // byte offsets into the subject
  };
  // Every non-overlapping, non-empty match from left to right (as Rust's find_iter, with empty
  // matches skipped: a split needs a non-empty delimiter). REQUIRES: `subject` is valid UTF-8.
  // Appends to `out`; returns an error only if the regex engine fails (e.g. resource limits).
  Status find_all(std::string_view subject, std::vector<Match>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  explicit Regex(std::unique_ptr<Impl> impl, std::string pattern);
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace sparrow
