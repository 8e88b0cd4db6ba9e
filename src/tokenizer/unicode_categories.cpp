#include "tokenizer/unicode_categories.h"

#include <algorithm>
#include <array>

namespace sparrow {
namespace {

struct Run {
  uint32_t first;
  uint8_t category;
};
constexpr Run kRuns[] = {
#include "tokenizer/unicode_categories.inc"
};
constexpr size_t kNumRuns = sizeof(kRuns) / sizeof(kRuns[0]);

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

constexpr std::array<std::string_view, kNumUnicodeCategories> kShortNames = {
    "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
    "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};
// Oniguruma's long names, same order.
constexpr std::array<std::string_view, kNumUnicodeCategories> kLongNames = {
    "Uppercase_Letter", "Lowercase_Letter", "Titlecase_Letter", "Modifier_Letter", "Other_Letter",
    "Nonspacing_Mark", "Spacing_Mark", "Enclosing_Mark", "Decimal_Number", "Letter_Number", "Other_Number",
    "Connector_Punctuation", "Dash_Punctuation", "Open_Punctuation", "Close_Punctuation", "Initial_Punctuation",
    "Final_Punctuation", "Other_Punctuation", "Math_Symbol", "Currency_Symbol", "Modifier_Symbol", "Other_Symbol",
    "Space_Separator", "Line_Separator", "Paragraph_Separator", "Control", "Format", "Surrogate", "Private_Use",
    "Unassigned"};

uint32_t major_mask(char major) {
  uint32_t m = 0;
  for (int k = 0; k < kNumUnicodeCategories; ++k)
    if (kShortNames[k][0] == major) m |= 1u << k;
  return m;
}

}  // namespace

UnicodeCategory unicode_category(uint32_t cp) {
  // Last run starting at or before cp.
  const Run* it = std::upper_bound(kRuns, kRuns + kNumRuns, cp, [](uint32_t v, const Run& r) { return v < r.first; });
  return static_cast<UnicodeCategory>((it - 1)->category);
}

CodePointSet CodePointSet::from_ranges(std::vector<Range> ranges) {
  // Clip surrogates out, then sort and coalesce.
  std::vector<Range> clipped;
  for (auto [lo, hi] : ranges) {
    if (lo > hi || lo > kMaxCodePoint) continue;
    hi = std::min(hi, kMaxCodePoint);
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      clipped.push_back({lo, hi});
    } else {
      if (lo < kSurrogateLo) clipped.push_back({lo, kSurrogateLo - 1});
      if (hi > kSurrogateHi) clipped.push_back({kSurrogateHi + 1, hi});
    }
  }
  std::sort(clipped.begin(), clipped.end());
  CodePointSet s;
  for (const Range& r : clipped) {
    if (!s.ranges_.empty() && r.first <= s.ranges_.back().second + 1)
      s.ranges_.back().second = std::max(s.ranges_.back().second, r.second);
    else
      s.ranges_.push_back(r);
  }
  return s;
}

CodePointSet CodePointSet::all() { return from_ranges({{0, kMaxCodePoint}}); }

CodePointSet CodePointSet::categories(uint32_t mask) {
  std::vector<Range> r;
  for (size_t i = 0; i < kNumRuns; ++i) {
    if (!(mask & (1u << kRuns[i].category))) continue;
    const uint32_t end = i + 1 < kNumRuns ? kRuns[i + 1].first - 1 : kMaxCodePoint;
    r.push_back({kRuns[i].first, end});
  }
  return from_ranges(std::move(r));
}

CodePointSet CodePointSet::operator|(const CodePointSet& o) const {
  std::vector<Range> r = ranges_;
  r.insert(r.end(), o.ranges_.begin(), o.ranges_.end());
  return from_ranges(std::move(r));
}

CodePointSet CodePointSet::operator-(const CodePointSet& o) const {
  std::vector<Range> out;
  size_t j = 0;
  for (auto [lo, hi] : ranges_) {
    uint32_t cur = lo;
    bool done = false;
    while (j < o.ranges_.size() && o.ranges_[j].second < cur) ++j;
    for (size_t k = j; k < o.ranges_.size() && o.ranges_[k].first <= hi; ++k) {
      const auto [olo, ohi] = o.ranges_[k];
      if (olo > cur) out.push_back({cur, olo - 1});
      if (ohi >= hi) {
        done = true;
        break;
      }
      cur = std::max(cur, ohi + 1);
    }
    if (!done) out.push_back({cur, hi});
  }
  return from_ranges(std::move(out));
}

bool CodePointSet::contains(uint32_t cp) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), cp, [](uint32_t v, const Range& r) { return v < r.first; });
  return it != ranges_.begin() && (it - 1)->second >= cp;
}

std::optional<uint32_t> unicode_category_mask(std::string_view name) {
  if (name == "L&" || name == "LC") return (1u << 0) | (1u << 1) | (1u << 2);
  if (name.size() == 1) {
    const uint32_t m = major_mask(name[0]);
    if (m) return m;
    return std::nullopt;
  }
  static constexpr std::array<std::pair<std::string_view, char>, 5> kMajorLong = {
      {{"Letter", 'L'}, {"Mark", 'M'}, {"Number", 'N'}, {"Punctuation", 'P'}, {"Symbol", 'S'}}};
  for (auto [n, c] : kMajorLong)
    if (name == n) return major_mask(c);
  if (name == "Separator") return major_mask('Z');
  if (name == "Other") return major_mask('C');
  for (int k = 0; k < kNumUnicodeCategories; ++k)
    if (name == kShortNames[k] || name == kLongNames[k]) return 1u << k;
  return std::nullopt;
}

CodePointSet unicode_white_space() {
  return CodePointSet::from_ranges({{0x09, 0x0D}, {0x85, 0x85}}) | CodePointSet::categories(major_mask('Z'));
}
CodePointSet unicode_digit() { return CodePointSet::categories(1u << static_cast<int>(UnicodeCategory::kNd)); }

}  // namespace sparrow
