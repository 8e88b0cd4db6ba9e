// Unicode general categories and code point sets, as Hugging Face's tokenizers sees them.
//
// The table (unicode_categories.inc) is generated from Hugging Face's Rust tokenizers by
// tests/tokenizer/js/gen_unicode_table.mjs, so Sparrow's regex classes agree with the reference
// whatever Unicode version the system's PCRE2 carries (Debian 12's PCRE2 10.42 has Unicode 14;
// tokenizers 0.23.2's Oniguruma has Unicode 16: about 10,000 code points differ).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace sparrow {

// Order matches the generator's table.
enum class UnicodeCategory : uint8_t {
  kLu, kLl, kLt, kLm, kLo, kMn, kMc, kMe, kNd, kNl, kNo, kPc, kPd, kPs, kPe, kPi, kPf,
  kPo, kSm, kSc, kSk, kSo, kZs, kZl, kZp, kCc, kCf, kCs, kCo, kCn,
};
constexpr int kNumUnicodeCategories = 30;

UnicodeCategory unicode_category(uint32_t cp);

// A set of Unicode scalar values as sorted, disjoint, non-adjacent inclusive ranges. Surrogates
// (U+D800..U+DFFF) are never members: they cannot occur in UTF-8 text.
class CodePointSet {
 public:
  using Range = std::pair<uint32_t, uint32_t>;
  CodePointSet() = default;
  static CodePointSet from_ranges(std::vector<Range> ranges);  // any order, may overlap
  static CodePointSet single(uint32_t cp) { return from_ranges({{cp, cp}}); }
  // Members of any category whose bit (1 << category) is in `mask`.
  static CodePointSet categories(uint32_t mask);
  static CodePointSet all();

  CodePointSet operator|(const CodePointSet& o) const;
  CodePointSet operator-(const CodePointSet& o) const;
  CodePointSet complement() const { return all() - *this; }
  bool empty() const { return ranges_.empty(); }
  bool contains(uint32_t cp) const;
  const std::vector<Range>& ranges() const { return ranges_; }
  bool operator==(const CodePointSet& o) const { return ranges_ == o.ranges_; }

 private:
  std::vector<Range> ranges_;
};

// Category mask of a property name: a general category ("Lu") or major class ("L"), also in
// Oniguruma's long forms ("Letter", "Uppercase_Letter") and with an "Is" prefix; nullopt for
// anything else (scripts, binary properties).
std::optional<uint32_t> unicode_category_mask(std::string_view name);

// Oniguruma's shorthand classes for UTF-8 subjects.
CodePointSet unicode_white_space();  // \s: U+0009..U+000D, U+0085 and Z*
CodePointSet unicode_digit();        // \d: Nd

}  // namespace sparrow
