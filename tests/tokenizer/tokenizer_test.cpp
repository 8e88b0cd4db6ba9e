// Tokenizer building blocks: UTF-8 helpers, the Oniguruma -> PCRE2 regex translation, split
// behaviours, BPE merging against a naive reference, and the Tokenizer on small tokenizers made
// here or shipped under tests/fixtures/tokenizer/tiny. Exactness against Hugging Face's
// implementations on the real DeepSeek tokenizer is tests/tokenizer/run_exactness.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_categories.h"
#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

const std::filesystem::path kTiny = std::filesystem::path(SPARROW_FIXTURES_DIR) / "tokenizer" / "tiny";

std::string cp_utf8(uint32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

// ---- UTF-8 ----

TEST(Utf8, FindsInvalidSequences) {
  EXPECT_FALSE(utf8_find_invalid("plain ascii"));
  EXPECT_FALSE(utf8_find_invalid("中文 😀 é"));
  EXPECT_EQ(utf8_find_invalid("ab\xC3"), 2u);            // truncated 2-byte sequence
  EXPECT_EQ(utf8_find_invalid("a\xC0\x80"), 1u);         // overlong NUL
  EXPECT_EQ(utf8_find_invalid("\xED\xA0\x80"), 0u);      // a surrogate
  EXPECT_EQ(utf8_find_invalid("x\xF4\x90\x80\x80"), 1u); // above U+10FFFF
  EXPECT_EQ(utf8_find_invalid("\x80"), 0u);              // stray continuation byte
}

TEST(Utf8, RepairReplacesMaximalSubparts) {
  // Unicode's "maximal subpart" examples: a truncated 3-byte sequence is one U+FFFD, a stray
  // continuation byte is one U+FFFD each.
  EXPECT_EQ(utf8_repair("a\xE4\xB8" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_repair("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_repair("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_repair("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // C0 is never a lead byte
  EXPECT_EQ(utf8_repair("ok 中"), "ok 中");
}

TEST(Utf8, CompletePrefixStopsBeforeAnUnfinishedCharacter) {
  const std::string s = "ab中";  // 中 = E4 B8 AD
  EXPECT_EQ(utf8_complete_prefix(s), s.size());
  EXPECT_EQ(utf8_complete_prefix(s.substr(0, 4)), 2u);
  EXPECT_EQ(utf8_complete_prefix(s.substr(0, 3)), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\xFF"), 2u);  // invalid bytes never complete: pass them on
}

// ---- Regex translation ----

std::vector<std::string> matches(const std::string& pattern, const std::string& text) {
  auto re = Regex::compile(pattern);
  EXPECT_TRUE(re.is_ok()) << re.status().to_string();
  std::vector<Regex::Match> m;
  EXPECT_TRUE(re->find_all(text, m).is_ok());
  std::vector<std::string> out;
  for (auto x : m) out.push_back(text.substr(x.begin, x.end - x.begin));
  return out;
}

TEST(Regex, WhiteSpaceIsOnigurumasSet) {
  // U+0085 (NEXT LINE) is White_Space; U+200B (ZERO WIDTH SPACE) and U+FEFF are not.
  EXPECT_EQ(matches("\\s+", "a\u0085b"), std::vector<std::string>{"\u0085"});
  EXPECT_TRUE(matches("\\s+", "a\u200b\ufeffb").empty());
  EXPECT_EQ(matches("\\S+", "x\u0085y"), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(matches("[^\\s]+", "x\u0085y"), (std::vector<std::string>{"x", "y"}));
}

TEST(Regex, HexDigitShorthandIsOnigurumas) {
  EXPECT_EQ(matches("\\h+", "zz0aFg \t"), std::vector<std::string>{"0aF"});
}

TEST(Regex, PropertiesFollowTheReferenceUnicodeVersion) {
  // Characters Unicode 16 added: U+1C89 CYRILLIC CAPITAL LETTER TJE (Lu), U+1F8B8 (an arrow, So),
  // U+10D40 GARAY DIGIT ZERO (Nd). Hugging Face tokenizers' Oniguruma knows them; a PCRE2 with
  // older tables would not, and " \U0001F8B8" would split differently.
  EXPECT_EQ(unicode_category(0x1C89), UnicodeCategory::kLu);
  EXPECT_EQ(unicode_category(0x1F8B8), UnicodeCategory::kSo);
  EXPECT_EQ(matches("\\p{L}+", "a" + cp_utf8(0x1C89) + "b"), std::vector<std::string>{"a" + cp_utf8(0x1C89) + "b"});
  EXPECT_EQ(matches(" ?[\\p{P}\\p{S}]+", "x " + cp_utf8(0x1F8B8)), std::vector<std::string>{" " + cp_utf8(0x1F8B8)});
  EXPECT_EQ(matches("\\p{N}+", cp_utf8(0x10D40) + "7"), std::vector<std::string>{cp_utf8(0x10D40) + "7"});
  // And in a negated class: a new letter is not "not a letter".
  EXPECT_EQ(matches("[^\\p{L}]+", "1" + cp_utf8(0x1C89) + "2"), (std::vector<std::string>{"1", "2"}));
  // Unassigned code points stay outside every letter class.
  EXPECT_EQ(unicode_category(0x0378), UnicodeCategory::kCn);
  EXPECT_TRUE(matches("\\p{L}", cp_utf8(0x0378)).empty());
}

TEST(Regex, CategoryTableIsConsistent) {
  EXPECT_EQ(unicode_category('A'), UnicodeCategory::kLu);
  EXPECT_EQ(unicode_category('a'), UnicodeCategory::kLl);
  EXPECT_EQ(unicode_category('5'), UnicodeCategory::kNd);
  EXPECT_EQ(unicode_category(' '), UnicodeCategory::kZs);
  EXPECT_EQ(unicode_category(0x4E2D), UnicodeCategory::kLo);  // 中
  EXPECT_EQ(unicode_category(0x0301), UnicodeCategory::kMn);  // combining acute
  EXPECT_EQ(unicode_category(0xE000), UnicodeCategory::kCo);
  EXPECT_EQ(unicode_category(0x10FFFF), UnicodeCategory::kCn);
  const CodePointSet all_letters = CodePointSet::categories(0x1F);  // Lu Ll Lt Lm Lo
  EXPECT_TRUE(all_letters.contains(0x4E2D));
  EXPECT_FALSE(all_letters.contains('1'));
  EXPECT_EQ(CodePointSet::all().complement().ranges().size(), 0u);
  // Sets never hold surrogates.
  EXPECT_FALSE(CodePointSet::from_ranges({{0xD000, 0xE100}}).contains(0xD900));
}

TEST(Regex, LookaheadAndAlternationBehaveAsInHuggingFace) {
  // \s+(?!\S) leaves the last space for the word that follows (GPT-2's trick).
  EXPECT_EQ(matches("\\s+(?!\\S)|\\s+", "a   b"), (std::vector<std::string>{"  ", " "}));
  EXPECT_EQ(matches("\\p{N}{1,3}", "1234567"), (std::vector<std::string>{"123", "456", "7"}));
}

TEST(Regex, RefusesWhatItCannotTranslateExactly) {
  for (const char* p : {"\\w+", "\\bfoo", "[[:alpha:]]", "[a[b]]", "[a&&b]", "\\q"}) {
    auto re = Regex::compile(p);
    EXPECT_FALSE(re.is_ok()) << p;
  }
  EXPECT_FALSE(Regex::compile("[abc").is_ok());
}

TEST(Regex, EmptyMatchesAreSkipped) {
  EXPECT_EQ(matches("x*", "axxbx"), (std::vector<std::string>{"xx", "x"}));
}

TEST(Regex, LiteralPatternsQuoteEverything) {
  auto re = Regex::literal("a.\\E+");
  ASSERT_TRUE(re.is_ok()) << re.status().to_string();
  std::vector<Regex::Match> m;
  ASSERT_TRUE(re->find_all("xa.\\E+ ab\\E+", m).is_ok());
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].begin, 1u);
}

// ---- Split behaviours (Hugging Face's documented example: "the-final--countdown" on "-") ----

std::vector<std::string> split(SplitBehavior b, bool invert = false) {
  const std::string text = "the-final--countdown";
  auto re = Regex::literal("-");
  std::vector<Regex::Match> m;
  EXPECT_TRUE(re->find_all(text, m).is_ok());
  std::vector<std::string_view> out;
  split_by_matches(text, m, b, invert, out);
  return {out.begin(), out.end()};
}

TEST(PreTokenizer, SplitBehaviorsMatchTheHuggingFaceDocs) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split(SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split(SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
  // invert: the words are the delimiters and are removed; each "-" match stays its own piece.
  EXPECT_EQ(split(SplitBehavior::kRemoved, true), (V{"-", "-", "-"}));
}

// ---- BPE against a naive reference ----

// The definition, written as plainly as possible: repeatedly merge the adjacent pair with the
// lowest rank, the leftmost one among equals.
std::vector<std::string> naive_bpe(const std::vector<std::string>& symbols, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> s = symbols;
  while (s.size() > 1) {
    int best = -1, best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = ranks.find({s[i], s[i + 1]});
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    s[best] += s[best + 1];
    s.erase(s.begin() + best + 1);
  }
  return s;
}

TEST(Bpe, MergesByRankLeftmostFirst) {
  std::vector<std::pair<std::string, int32_t>> vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}};
  // "b c" outranks "a b": "abc" -> a + bc, and there is no merge (a, bc).
  auto m = BpeModel::build(vocab, {{"b", "c"}, {"a", "b"}, {"ab", "c"}, {"a", "a"}}, {});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  std::vector<int32_t> out;
  m->encode_piece("abc", out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 4}));
  out.clear();
  m->encode_piece("aaa", out);  // equal ranks: the leftmost pair first
  EXPECT_EQ(out, (std::vector<int32_t>{6, 0}));
  out.clear();
  m->encode_piece("abx", out);  // 'x' has no token and no unk: dropped (after merging "ab")
  EXPECT_EQ(out, (std::vector<int32_t>{3}));
}

TEST(Bpe, RefusesMergesOutsideTheVocabulary) {
  auto m = BpeModel::build({{"a", 0}, {"b", 1}}, {{"a", "b"}}, {});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("'ab' is not in the vocabulary"), std::string::npos);
}

TEST(Bpe, AgreesWithTheNaiveDefinitionOnRandomWords) {
  // Alphabet a..e; 60 random merges over growing symbols; words up to 300 symbols so both the
  // quadratic path (<= 64) and the heap path are exercised.
  std::mt19937 rng(7);
  std::vector<std::string> tokens = {"a", "b", "c", "d", "e"};
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < 60) {
    const std::string& l = tokens[rng() % tokens.size()];
    const std::string& r = tokens[rng() % std::min<size_t>(tokens.size(), 8)];
    if (ranks.count({l, r}) || l.size() + r.size() > 6) continue;
    ranks[{l, r}] = static_cast<int>(merges.size());
    merges.push_back({l, r});
    if (std::find(tokens.begin(), tokens.end(), l + r) == tokens.end()) tokens.push_back(l + r);
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (size_t i = 0; i < tokens.size(); ++i) vocab.push_back({tokens[i], static_cast<int32_t>(i)});
  auto m = BpeModel::build(vocab, merges, {});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 1 + rng() % (trial < 200 ? 64 : 300);
    std::string word;
    std::vector<std::string> symbols;
    for (size_t i = 0; i < n; ++i) {
      // Runs of one letter stress equal-rank ties.
      const char c = static_cast<char>('a' + (rng() % 3 == 0 ? 0 : rng() % 5));
      word += c;
      symbols.push_back(std::string(1, c));
    }
    std::vector<int32_t> ids;
    m->encode_piece(word, ids);
    std::vector<std::string> got;
    for (int32_t id : ids) got.push_back(*m->token(id));
    ASSERT_EQ(got, naive_bpe(symbols, ranks)) << "word " << word;
  }
}

TEST(Bpe, ByteLevelTableIsGpt2s) {
  EXPECT_EQ(byte_level_char('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(byte_level_char(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_level_char('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_level_char(0), 0x100u);
  EXPECT_EQ(byte_level_char(0xAD), 0x143u);  // the last non-printable byte gets the last slot
  for (int b = 0; b < 256; ++b) EXPECT_EQ(byte_level_byte(byte_level_char(static_cast<uint8_t>(b))), b);
}

// ---- Tokenizer ----

// A tokenizer.json with every byte in the vocabulary, GPT-2's pre-tokenizer (ByteLevel with
// use_regex), a few merges, and two added tokens.
std::string full_byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[cp_utf8(byte_level_char(static_cast<uint8_t>(b)))] = id++;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"Ã", "©"}};
  nlohmann::json jm = nlohmann::json::array();
  for (auto& [a, b] : merges) {
    vocab[a + b] = id++;
    jm.push_back(nlohmann::json::array({a, b}));  // the [a, b] pair form
  }
  nlohmann::json added = nlohmann::json::array();
  added.push_back({{"id", id++}, {"content", "<s>"}, {"special", true}, {"normalized", false}});
  added.push_back({{"id", id++}, {"content", "<tool>"}, {"special", false}, {"normalized", true}});
  added.push_back({{"id", id++}, {"content", "<tool>x"}, {"special", false}, {"normalized", true}});
  nlohmann::json t = {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", jm}}},
  };
  return t.dump();
}

TEST(Tokenizer, EncodesWithMergesAndAddedTokens) {
  auto tok = Tokenizer::from_json(full_byte_tokenizer_json(), R"({"bos_token": "<s>", "add_bos_token": true})");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const int32_t world = *tok->token_to_id("Ġworld");
  const int32_t s = *tok->token_to_id("<s>");
  const int32_t tool = *tok->token_to_id("<tool>"), toolx = *tok->token_to_id("<tool>x");
  EXPECT_EQ(tok->bos_id(), s);
  auto ids = tok->encode("<s> world<tool>x<tool>y");
  ASSERT_TRUE(ids.is_ok());
  // The longest added token wins at a position ("<tool>x" over "<tool>").
  EXPECT_EQ(*ids, (std::vector<int32_t>{s, world, toolx, tool, 'y'}));
  auto with_bos = tok->encode("a", /*add_special_tokens=*/true);
  EXPECT_EQ(*with_bos, (std::vector<int32_t>{s, 'a'}));
  // "é" = C3 A9 -> 'Ã' '©' -> merged.
  EXPECT_EQ(*tok->encode("é"), std::vector<int32_t>{*tok->token_to_id("Ã©")});
}

TEST(Tokenizer, DecodeRoundTripsAndSkipsSpecialTokens) {
  auto tok = Tokenizer::from_json(full_byte_tokenizer_json(), "");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::string text = "<s>Héllo, world!\n\t中文 😀 <tool>\r\n";
  auto ids = tok->encode(text);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*tok->decode(*ids), text);
  EXPECT_EQ(*tok->decode(*ids, /*skip_special_tokens=*/true), "Héllo, world!\n\t中文 😀 <tool>\r\n");
  auto bad = tok->decode(std::vector<int32_t>{1, 99999});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("token id 99999 at position 1"), std::string::npos);
}

TEST(Tokenizer, StreamDecoderEmitsOnlyWholeCharacters) {
  auto tok = Tokenizer::from_json(full_byte_tokenizer_json(), "");
  ASSERT_TRUE(tok.is_ok());
  auto ids = tok->encode("a中😀é b");
  ASSERT_TRUE(ids.is_ok());
  StreamDecoder dec(*tok);
  std::string streamed;
  for (int32_t id : *ids) {
    const std::string piece = dec.push(id);
    EXPECT_FALSE(utf8_find_invalid(piece)) << "a partial character was emitted";
    streamed += piece;
  }
  streamed += dec.finish();
  EXPECT_EQ(streamed, "a中😀é b");
  // Bytes that never complete come out as U+FFFD at the end, as decode() gives them.
  StreamDecoder cut(*tok);
  std::string s = cut.push(0xE4);  // two of 中's three bytes
  s += cut.push(0xB8);
  EXPECT_EQ(s, "");
  EXPECT_EQ(cut.finish(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, RejectsInvalidUtf8AndUnsupportedFiles) {
  auto tok = Tokenizer::from_json(full_byte_tokenizer_json(), "");
  ASSERT_TRUE(tok.is_ok());
  auto bad = tok->encode("ok\xFFno");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("byte 2"), std::string::npos);

  auto j = nlohmann::json::parse(full_byte_tokenizer_json());
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  auto meta = Tokenizer::from_json(j.dump(), "", "x.json");
  ASSERT_FALSE(meta.is_ok());
  EXPECT_NE(meta.status().message().find("pre-tokenizer 'Metaspace'"), std::string::npos);
  EXPECT_NE(meta.status().message().find("x.json"), std::string::npos);

  EXPECT_FALSE(Tokenizer::from_json("{not json", "").is_ok());
  auto missing = Tokenizer::load("/no/such/tokenizer.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(TinyTokenizer, SpecialTokensSitInsideTheTinyVocabulary) {
  auto tok = Tokenizer::load(kTiny);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 128);  // the tiny checkpoints' vocabulary
  for (const char* s : {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
                        "</think>", "｜DSML｜"}) {
    auto id = tok->token_to_id(s);
    ASSERT_TRUE(id.has_value()) << s;
    EXPECT_LT(*id, 128) << s;
  }
  EXPECT_EQ(tok->bos_id(), 0);  // the checkpoints' config.json says bos 0, eos 1
  EXPECT_EQ(tok->eos_id(), 1);
  // "Hi": no merge applies; each byte is its own token. The alphabet is TAB, LF, SPACE at 2..4,
  // then '!'..'~' from 5, so 'H' (0x48) is 5 + 0x27 = 44 and 'i' (0x69) is 5 + 0x48 = 77.
  EXPECT_EQ(*tok->encode("Hi"), (std::vector<int32_t>{44, 77}));
  // A chat prompt: the special tokens come out whole.
  auto ids = tok->encode("<｜User｜>Hi<｜Assistant｜></think>");
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{*tok->token_to_id("<｜User｜>"), 44, 77, *tok->token_to_id("<｜Assistant｜>"),
                                        *tok->token_to_id("</think>")}));
  // Bytes outside its alphabet are dropped (there is no unk token), as Hugging Face does.
  EXPECT_EQ(*tok->encode("H\xC3\xA9i"), (std::vector<int32_t>{44, 77}));
  // Round trip of ASCII text.
  const std::string text = "The capital of France is Paris.\n\tthe token";
  EXPECT_EQ(*tok->decode(*tok->encode(text)), text);
}

}  // namespace
}  // namespace sparrow
