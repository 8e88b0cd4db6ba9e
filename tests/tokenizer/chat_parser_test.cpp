// The streaming output parser: the whole-text result pinned by hand, then the same text fed in
// every possible split (one cut anywhere, two cuts anywhere, byte by byte) must give the same
// content, reasoning and tool calls, and no DSML byte may ever reach content (traps.md row 15).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_parser.h"
#include "tokenizer/stop_strings.h"

namespace sparrow {
namespace {

const std::string EOS = "<｜end▁of▁sentence｜>";

struct Parsed {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  std::vector<std::string> errors;
};

void add(Parsed& p, const ChatDelta& d) {
  // No delta may carry markup (the exact content checks below catch pieces of it too).
  for (const std::string* s : {&d.content, &d.reasoning})
    EXPECT_EQ(s->find("DSML"), std::string::npos) << "markup leaked: '" << *s << "'";
  p.content += d.content;
  p.reasoning += d.reasoning;
  for (const ToolCall& c : d.tool_calls) p.calls.push_back({c.name, c.arguments});
}

Parsed feed(const std::vector<std::string>& chunks, ThinkingMode mode) {
  Dsv4OutputParser parser(mode);
  Parsed p;
  for (const std::string& c : chunks) add(p, parser.push(c));
  add(p, parser.finish());
  p.errors = parser.errors();
  return p;
}

bool same(const Parsed& a, const Parsed& b) {
  return a.content == b.content && a.reasoning == b.reasoning && a.calls == b.calls && a.errors == b.errors;
}

// Feeds `text` whole, then split at every cut point, every pair of cut points and byte by byte;
// every way must equal the whole-text result. Returns that result.
Parsed parse_every_way(const std::string& text, ThinkingMode mode) {
  const Parsed whole = feed({text}, mode);
  for (size_t i = 0; i <= text.size(); ++i)
    EXPECT_TRUE(same(feed({text.substr(0, i), text.substr(i)}, mode), whole)) << "cut at " << i;
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      const Parsed p = feed({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, mode);
      if (!same(p, whole)) {
        ADD_FAILURE() << "cuts at " << i << ", " << j << ": content '" << p.content << "'";
        return whole;
      }
    }
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  EXPECT_TRUE(same(feed(bytes, mode), whole)) << "byte by byte";
  return whole;
}

const std::string kCallBlock =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris, \"FR\"</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

TEST(ChatParser, ContentWithToolCallsEverySplit) {
  const Parsed p = parse_every_way("Let me check.\n" + kCallBlock + EOS, ThinkingMode::kChat);
  EXPECT_EQ(p.content, "Let me check.\n");  // the "\n\n" before the block is markup, the "\n" before it is not
  EXPECT_EQ(p.reasoning, "");
  // Arguments as DeepSeek's reference parser writes them: strings JSON-quoted, other values as written.
  EXPECT_EQ(p.calls, (std::vector<std::pair<std::string, std::string>>{
                         {"get_weather", R"({"city": "Paris, \"FR\"", "days": 2})"}, {"now", "{}"}}));
  EXPECT_TRUE(p.errors.empty());
  // The arguments are valid JSON.
  EXPECT_EQ(nlohmann::json::parse(p.calls[0].second)["city"], "Paris, \"FR\"");
}

TEST(ChatParser, ThinkingModeEverySplit) {
  const Parsed p = parse_every_way("I should call the tool.\n</think>Sure 中文 😀" + kCallBlock + EOS, ThinkingMode::kThinking);
  EXPECT_EQ(p.reasoning, "I should call the tool.\n");
  EXPECT_EQ(p.content, "Sure 中文 😀");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_TRUE(p.errors.empty());
}

TEST(ChatParser, PlainReplyEverySplit) {
  const Parsed p = parse_every_way("a < b and c </ d\n\nx <｜ y" + EOS + "ignored after EOS", ThinkingMode::kChat);
  // "<" and "</" that are not markers come out as text; so does a lone "<｜" that does not start
  // a marker ("<｜ y" is neither EOS nor DSML).
  EXPECT_EQ(p.content, "a < b and c </ d\n\nx <｜ y");
}

TEST(ChatParser, TrailingNewlinesAndTextAreFlushedAtTheEnd) {
  Dsv4OutputParser parser(ThinkingMode::kChat);
  ChatDelta d = parser.push("Hello\n");
  EXPECT_EQ(d.content, "Hello");  // the "\n" might start "\n\n<｜DSML｜"
  d = parser.push("\n");
  EXPECT_EQ(d.content, "");
  d = parser.finish();
  EXPECT_EQ(d.content, "\n\n");  // it did not
  EXPECT_TRUE(parser.errors().empty());
}

TEST(ChatParser, CutOffMarkupIsDroppedAndReported) {
  Parsed p = feed({"Answer.\n\n<｜DSML｜tool_ca"}, ThinkingMode::kChat);
  EXPECT_EQ(p.content, "Answer.");
  EXPECT_FALSE(p.errors.empty());
  p = feed({"Answer.<｜end▁of"}, ThinkingMode::kChat);
  EXPECT_EQ(p.content, "Answer.");
  EXPECT_FALSE(p.errors.empty());
  // An unfinished invoke is not emitted as a call.
  p = feed({"x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1"},
           ThinkingMode::kChat);
  EXPECT_EQ(p.content, "x");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_FALSE(p.errors.empty());
}

TEST(ChatParser, DsmlWithoutTheWrapperStillNeverReachesContent) {
  const Parsed p = parse_every_way(
      "ok <｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">v</｜DSML｜parameter>\n</｜DSML｜invoke>" + EOS,
      ThinkingMode::kChat);
  EXPECT_EQ(p.content, "ok ");
  EXPECT_EQ(p.calls, (std::vector<std::pair<std::string, std::string>>{{"f", R"({"q": "v"})"}}));
}

TEST(ChatParser, MalformedInvokesAreReportedNotEmitted) {
  Parsed p = feed({"\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nme=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS},
                  ThinkingMode::kChat);
  EXPECT_TRUE(p.calls.empty());
  ASSERT_EQ(p.errors.size(), 1u);
  p = feed({"\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1"
            "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS},
           ThinkingMode::kChat);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.errors.size(), 1u);
}

TEST(ChatParser, RoundTripWithTheEncoder) {
  std::vector<ToolCall> calls = {{"", "search", R"({"query": "línea \"1\"\nnext", "limit": 5, "filters": {"a": [1, 2.5]}})"},
                                 {"", "noop", "{}"}};
  auto block = dsv4_render_tool_calls(calls);
  ASSERT_TRUE(block.is_ok());
  const Parsed p = feed({"Done." + std::string("\n\n") + *block + EOS}, ThinkingMode::kChat);
  EXPECT_EQ(p.content, "Done.");
  ASSERT_EQ(p.calls.size(), 2u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].first, calls[i].name);
    EXPECT_EQ(nlohmann::json::parse(p.calls[i].second), nlohmann::json::parse(calls[i].arguments));
  }
}

TEST(StopStrings, EverySplitStopsAtTheSameText) {
  const std::string text = "one two ###END### three";
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      StopStringFilter f({"###END###", "zzz"});
      std::string out = f.push(text.substr(0, i));
      out += f.push(text.substr(i, j - i));
      out += f.push(text.substr(j));
      out += f.finish();
      ASSERT_EQ(out, "one two ") << i << "," << j;
      ASSERT_TRUE(f.stopped());
      ASSERT_EQ(f.matched(), "###END###");
    }
  StopStringFilter none({"xyz"});
  std::string out = none.push("abcx");  // "x" is held: it could start "xyz"
  EXPECT_EQ(out, "abc");
  out += none.push("y");
  out += none.finish();
  EXPECT_EQ(out, "abcxy");
  EXPECT_FALSE(none.stopped());
}

}  // namespace
}  // namespace sparrow
