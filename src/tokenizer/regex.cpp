#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>

#include "tokenizer/unicode_categories.h"
#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match resources shared by every Regex: an ovector of one pair is all find_all needs
// (capture groups are ignored), and a JIT stack large enough for long runs of one character class.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

using CodeDeleter = void (*)(pcre2_code*);
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;

Expected<CodePtr> compile_pcre2(const std::string& pattern, const std::string& shown) {
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, cctx);
  pcre2_compile_context_free(cctx);
  if (!code)
    return Status::invalid_argument("cannot compile regex " + shown + " at offset " + std::to_string(err_off) + ": " +
                                    pcre2_error_text(err));
  return CodePtr(code, pcre2_code_free);
}

// ---- What PCRE2 itself matches with a class: run it over a string of every scalar value. ----

// The UTF-8 string of U+0000..U+10FFFF without surrogates, in order (4.3 MB, built once).
const std::string& all_scalars() {
  static const std::string s = [] {
    std::string out;
    out.reserve(4400000);
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp)
      if (cp < 0xD800 || cp > 0xDFFF) utf8_append(out, cp);
    return out;
  }();
  return s;
}

// Code point whose encoding starts at byte `off` of all_scalars() (0x110000 at the end).
uint32_t scalar_at(size_t off) {
  if (off < 0x80) return static_cast<uint32_t>(off);
  off -= 0x80;
  if (off < 0x780 * 2) return static_cast<uint32_t>(0x80 + off / 2);
  off -= 0x780 * 2;
  if (off < 0xD000 * 3) return static_cast<uint32_t>(0x800 + off / 3);
  off -= 0xD000 * 3;
  if (off < 0x2000 * 3) return static_cast<uint32_t>(0xE000 + off / 3);
  off -= 0x2000 * 3;
  return static_cast<uint32_t>(0x10000 + off / 4);
}

// The set a PCRE2 class (e.g. "[^\r\n\p{L}]") matches with this PCRE2's Unicode tables. Cached.
Expected<CodePointSet> pcre2_class_members(const std::string& cls) {
  static std::mutex mu;
  static std::map<std::string, CodePointSet> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(cls); it != cache.end()) return it->second;
  }
  SPARROW_ASSIGN_OR_RETURN(CodePtr code, compile_pcre2(cls + "+", "class " + cls));
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  const std::string& subject = all_scalars();
  ThreadMatchState& st = thread_match_state();
  std::vector<CodePointSet::Range> ranges;
  PCRE2_SIZE start = 0;
  while (start < subject.size()) {
    const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                               PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return Status::internal("evaluating class " + cls + ": " + pcre2_error_text(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    if (ov[1] == ov[0]) break;  // cannot happen with "+": a safeguard against looping
    ranges.push_back({scalar_at(ov[0]), scalar_at(ov[1]) - 1});
    start = ov[1];
  }
  CodePointSet set = CodePointSet::from_ranges(std::move(ranges));
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(cls, set);
  return set;
}

// ---- Oniguruma pattern -> PCRE2 pattern ----

std::string hex_escape(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\x{%x}", cp);
  return buf;
}

std::string ranges_body(const CodePointSet& s) {
  std::string out;
  for (auto [lo, hi] : s.ranges()) out += lo == hi ? hex_escape(lo) : hex_escape(lo) + "-" + hex_escape(hi);
  return out;
}

struct Translator {
  std::string_view p;
  size_t i = 0;
  std::string out;

  Status refuse(const std::string& what) const {
    return Status::unsupported("regex uses " + what + ", which Sparrow does not translate from Oniguruma to PCRE2: " +
                               std::string(p));
  }
  Status bad(const std::string& what) const { return Status::invalid_argument("bad regex (" + what + "): " + std::string(p)); }

  // One class member: a single code point, or a set with its PCRE2 spelling. `verifiable` is
  // false for a set whose Oniguruma meaning Sparrow cannot compute (a script property).
  struct Item {
    bool is_char = false;
    uint32_t cp = 0;
    std::string native;
    CodePointSet target;
    bool verifiable = true;
  };

  Expected<uint32_t> hex_digits(size_t max_digits, bool braced) {
    uint32_t v = 0;
    size_t n = 0;
    while (i < p.size() && n < max_digits && std::isxdigit(static_cast<unsigned char>(p[i]))) {
      v = v * 16 + static_cast<uint32_t>(std::stoi(std::string(1, p[i]), nullptr, 16));
      ++i;
      ++n;
    }
    if (n == 0) return bad("a hex escape without digits");
    if (braced) {
      if (i >= p.size() || p[i] != '}') return bad("unterminated \\x{");
      ++i;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return bad("escape of a non-scalar code point");
    return v;
  }

  // After a backslash (i at the escaped character): a literal or a set.
  Expected<Item> escape(bool in_class) {
    if (i >= p.size()) return bad("a trailing backslash");
    const char c = p[i++];
    Item it;
    auto literal = [&](uint32_t cp) {
      it.is_char = true;
      it.cp = cp;
      return it;
    };
    switch (c) {
      case 't': return literal(0x09);
      case 'n': return literal(0x0A);
      case 'r': return literal(0x0D);
      case 'f': return literal(0x0C);
      case 'v': return literal(0x0B);
      case 'a': return literal(0x07);
      case 'e': return literal(0x1B);
      case 'x': {
        const bool braced = i < p.size() && p[i] == '{';
        if (braced) ++i;
        SPARROW_ASSIGN_OR_RETURN(uint32_t v, hex_digits(braced ? 8 : 2, braced));
        return literal(v);
      }
      case 'u': {
        SPARROW_ASSIGN_OR_RETURN(uint32_t v, hex_digits(4, false));
        return literal(v);
      }
      case 's':
      case 'S':
        // Spelled as Oniguruma's set (PCRE2's UCP \s lacks U+0085); outside a class \S is the
        // negated body, marked by a leading '^'.
        it.target = unicode_white_space();
        if (c == 'S') it.target = it.target.complement();
        it.native = c == 's' ? "\\t-\\r\\x{85}\\p{Z}" : in_class ? "\\S" : "^\\t-\\r\\x{85}\\p{Z}";
        return it;
      case 'd':
      case 'D':
        it.target = unicode_digit();
        if (c == 'D') it.target = it.target.complement();
        it.native = c == 'd' ? "\\p{Nd}" : "\\P{Nd}";
        return it;
      case 'h':
      case 'H':  // Oniguruma: hexadecimal digit (PCRE2's \h is horizontal space)
        if (c == 'H' && in_class) return refuse("\\H inside a class");
        it.target = CodePointSet::from_ranges({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
        if (c == 'H') it.target = it.target.complement();
        it.native = c == 'h' ? "0-9A-Fa-f" : "^0-9A-Fa-f";
        return it;
      case 'p':
      case 'P': {
        if (i >= p.size() || p[i] != '{') return refuse("a property escape without braces");
        const size_t close = p.find('}', i);
        if (close == std::string_view::npos) return bad("unterminated \\p{");
        std::string name(p.substr(i + 1, close - i - 1));
        i = close + 1;
        bool negate = c == 'P';
        if (!name.empty() && name[0] == '^') {
          negate = !negate;
          name.erase(0, 1);
        }
        it.native = std::string(negate ? "\\P{" : "\\p{") + name + "}";
        if (auto mask = unicode_category_mask(name)) {
          it.target = CodePointSet::categories(*mask);
          if (negate) it.target = it.target.complement();
        } else {
          it.verifiable = false;  // a script or binary property: PCRE2's own tables decide
        }
        return it;
      }
      case 'w':
      case 'W':
      case 'b':
      case 'B':
        return refuse(std::string("\\") + c + " (Oniguruma's word characters differ between and within classes)");
      default:
        break;
    }
    if (std::isalnum(static_cast<unsigned char>(c))) return refuse(std::string("the escape \\") + c);
    // An escaped punctuation or multi-byte character stands for itself.
    --i;
    SPARROW_ASSIGN_OR_RETURN(uint32_t cp, literal_char());
    return literal(cp);
  }

  Expected<uint32_t> literal_char() {
    const size_t len = utf8_sequence_length(p, i);
    if (len == 0) return bad("invalid UTF-8");
    std::string utf8(p.substr(i, len));
    i += len;
    const auto u = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(utf8[k])); };
    return len == 1 ? u(0)
           : len == 2 ? ((u(0) & 0x1F) << 6) | (u(1) & 0x3F)
           : len == 3 ? ((u(0) & 0x0F) << 12) | ((u(1) & 0x3F) << 6) | (u(2) & 0x3F)
                      : ((u(0) & 0x07) << 18) | ((u(1) & 0x3F) << 12) | ((u(2) & 0x3F) << 6) | (u(3) & 0x3F);
  }

  // Emits a class given by its PCRE2 body, fixed up so that it matches exactly `target` (the
  // Oniguruma meaning) whatever Unicode tables this PCRE2 has: code points PCRE2 misses are added,
  // code points it wrongly includes are excluded.
  Status emit_class(const std::string& body, bool negated, const CodePointSet& positive_target, bool verifiable) {
    const std::string native = std::string(negated ? "[^" : "[") + body + "]";
    if (!verifiable) {
      out += native;
      return Status::ok();
    }
    SPARROW_ASSIGN_OR_RETURN(CodePointSet have, pcre2_class_members(native));
    const CodePointSet want = negated ? positive_target.complement() : positive_target;
    const CodePointSet add = want - have, remove = have - want;
    if (add.empty() && remove.empty()) {
      out += native;
    } else if (!negated) {
      const std::string cls = "[" + body + ranges_body(add) + "]";
      out += remove.empty() ? cls : "(?:(?![" + ranges_body(remove) + "])" + cls + ")";
    } else {
      const std::string cls = "[^" + body + ranges_body(remove) + "]";
      out += add.empty() ? cls : "(?:" + cls + "|[" + ranges_body(add) + "])";
    }
    return Status::ok();
  }

  // At '[': parses the class up to its ']' and emits it.
  Status char_class() {
    ++i;  // '['
    bool negated = false;
    if (i < p.size() && p[i] == '^') {
      negated = true;
      ++i;
    }
    std::string body;
    CodePointSet target;
    bool verifiable = true, has_sets = false;
    bool first = true;
    while (true) {
      if (i >= p.size()) return bad("an unterminated character class");
      const char c = p[i];
      if (c == ']' && !first) {
        ++i;
        break;
      }
      first = false;
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') return refuse("a POSIX class [:name:]");
        return refuse("a nested character class");
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') return refuse("a class intersection (&&)");
      Item a;
      if (c == '\\') {
        ++i;
        SPARROW_ASSIGN_OR_RETURN(a, escape(true));
      } else {
        SPARROW_ASSIGN_OR_RETURN(a.cp, literal_char());
        a.is_char = true;
      }
      if (!a.is_char) {
        has_sets = true;
        body += a.native;
        target = target | a.target;
        verifiable = verifiable && a.verifiable;
        continue;
      }
      // A range a-b (a '-' right before ']' is a literal).
      uint32_t hi = a.cp;
      if (i + 1 < p.size() && p[i] == '-' && p[i + 1] != ']') {
        ++i;
        Item b;
        if (p[i] == '\\') {
          ++i;
          SPARROW_ASSIGN_OR_RETURN(b, escape(true));
        } else {
          SPARROW_ASSIGN_OR_RETURN(b.cp, literal_char());
          b.is_char = true;
        }
        if (!b.is_char) return bad("a range ending in a class escape");
        if (b.cp < a.cp) return bad("a range out of order");
        hi = b.cp;
      }
      body += hi == a.cp ? hex_escape(a.cp) : hex_escape(a.cp) + "-" + hex_escape(hi);
      target = target | CodePointSet::from_ranges({{a.cp, hi}});
    }
    // Only a class with sets depends on Unicode tables; one of literals needs no check.
    if (!has_sets) {
      out += std::string(negated ? "[^" : "[") + body + "]";
      return Status::ok();
    }
    return emit_class(body, negated, target, verifiable);
  }

  Status run() {
    while (i < p.size()) {
      const char c = p[i];
      if (c == '[') {
        SPARROW_RETURN_IF_ERROR(char_class());
        continue;
      }
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      // Escapes outside a class: sets become fixed classes; anchors, back-references and
      // literals keep their PCRE2 spelling (same meaning), except \u which PCRE2 lacks.
      ++i;
      if (i >= p.size()) return bad("a trailing backslash");
      const char n = p[i];
      if (n == 'A' || n == 'z' || n == 'Z' || n == 'G' || n == 'k' || n == 'K' || n == 'R' || n == 'X' ||
          (n >= '1' && n <= '9')) {
        out += '\\';
        continue;  // the next loop iteration copies the letter (and any argument) verbatim
      }
      SPARROW_ASSIGN_OR_RETURN(Item it, escape(false));
      if (it.is_char) {
        out += hex_escape(it.cp);
        continue;
      }
      // \H's and \S's native spellings are negated bodies.
      if (it.native.rfind("^", 0) == 0) {
        SPARROW_RETURN_IF_ERROR(emit_class(it.native.substr(1), true, it.target.complement(), it.verifiable));
      } else {
        SPARROW_RETURN_IF_ERROR(emit_class(it.native, false, it.target, it.verifiable));
      }
    }
    return Status::ok();
  }
};

}  // namespace

Expected<std::string> regex_translate_oniguruma(std::string_view pattern) {
  Translator t;
  t.p = pattern;
  SPARROW_RETURN_IF_ERROR(t.run());
  return std::move(t.out);
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::unique_ptr<Impl> impl, std::string pattern) : impl_(std::move(impl)), pattern_(std::move(pattern)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Expected<Regex> Regex::compile(std::string_view oniguruma_pattern) {
  SPARROW_ASSIGN_OR_RETURN(std::string translated, regex_translate_oniguruma(oniguruma_pattern));
  SPARROW_ASSIGN_OR_RETURN(auto code, compile_pcre2(translated, "'" + std::string(oniguruma_pattern) + "'"));
  auto impl = std::make_unique<Impl>();
  impl->code = code.release();
  // The JIT is an optimisation only: without it (an unsupported CPU, a PCRE2 built without JIT)
  // the interpreter gives the same matches.
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(impl), std::string(oniguruma_pattern));
}

Expected<Regex> Regex::literal(std::string_view literal) {
  // \Q..\E quotes everything except a literal "\E", which is emitted outside the quote.
  std::string quoted;
  size_t pos = 0;
  while (true) {
    const size_t e = literal.find("\\E", pos);
    quoted += "\\Q" + std::string(literal.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos)) + "\\E";
    if (e == std::string_view::npos) break;
    quoted += "\\\\E";
    pos = e + 2;
  }
  SPARROW_ASSIGN_OR_RETURN(auto code, compile_pcre2(quoted, "literal '" + std::string(literal) + "'"));
  auto impl = std::make_unique<Impl>();
  impl->code = code.release();
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(impl), std::string(literal));
}

Status Regex::find_all(std::string_view subject, std::vector<Match>& out) const {
  ThreadMatchState& st = thread_match_state();
  if (!st.data || !st.context) return Status::internal("PCRE2 could not allocate match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const PCRE2_SIZE n = subject.size();
  PCRE2_SIZE start = 0;
  while (start <= n) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, n, start, PCRE2_NO_UTF_CHECK, st.data, st.context)
                        : pcre2_match(impl_->code, s, n, start, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return Status::internal("regex '" + pattern_ + "' failed: " + pcre2_error_text(rc));
    // rc == 0 means the ovector (one pair) is too small for the capture groups: the whole-match
    // pair is still set, which is all that is needed.
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.push_back({b, e});
      start = e;
    } else {
      // Empty match: step over one character (as find_iter does) and search again.
      if (e >= n) break;
      const size_t len = utf8_sequence_length(subject, e);
      start = e + (len == 0 ? 1 : len);
    }
  }
  return Status::ok();
}

}  // namespace sparrow
