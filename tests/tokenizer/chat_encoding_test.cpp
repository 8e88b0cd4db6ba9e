// DeepSeek-V4 chat encoding: the spec's example strings (dsv4-spec.md §7) pinned, and the
// renderer's rules (tools, DSML calls, tool results, dropped reasoning, effort) each on a case
// whose expected text is written out by hand from the rules, not produced by the code.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/py_json.h"

namespace sparrow {
namespace {

const std::string BOS = "<｜begin▁of▁sentence｜>", EOS = "<｜end▁of▁sentence｜>", U = "<｜User｜>",
                  A = "<｜Assistant｜>";

ChatMessage msg(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

std::string encode(const std::vector<ChatMessage>& m, ThinkingMode mode, ReasoningEffort effort = ReasoningEffort::kDefault) {
  ChatEncodeOptions o;
  o.mode = mode;
  o.effort = effort;
  auto s = dsv4_encode_chat(m, o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? *s : "";
}

// The tools section, typed from the DeepSeek-V4 paper's table 4 ("Tool Call Schema").
std::string tools_section(const std::string& schemas) {
  return "## Tools\n\n"
         "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
         "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
         "<｜DSML｜tool_calls>\n"
         "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
         "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
         "...\n"
         "</｜DSML｜invoke>\n"
         "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</｜DSML｜invoke>\n"
         "</｜DSML｜tool_calls>\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n" +
         schemas + "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

TEST(ChatEncoding, SpecChatModeExample) {
  // dsv4-spec.md §7 (HF-T _v4_chat): <｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>
  EXPECT_EQ(encode({msg("user", "Hi")}, ThinkingMode::kChat), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
}

TEST(ChatEncoding, SpecThinkingMultiTurnExample) {
  // dsv4-spec.md §7: the earlier turn's reasoning is dropped and its user turn ends in </think>.
  ChatMessage a1 = msg("assistant", "a1");
  a1.reasoning_content = "r1";
  EXPECT_EQ(encode({msg("user", "q1"), a1, msg("user", "q2")}, ThinkingMode::kThinking),
            "<｜begin▁of▁sentence｜><｜User｜>q1<｜Assistant｜></think>a1<｜end▁of▁sentence｜><｜User｜>q2<｜Assistant｜><think>");
}

TEST(ChatEncoding, ChatModeMultiTurn) {
  ChatMessage a1 = msg("assistant", "a1");
  a1.reasoning_content = "never shown in chat mode";
  EXPECT_EQ(encode({msg("system", "Be brief."), msg("user", "q1"), a1, msg("user", "q2")}, ThinkingMode::kChat),
            BOS + "Be brief." + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "</think>");
}

TEST(ChatEncoding, ReplyAfterTheLastUserTurnKeepsItsReasoning) {
  ChatMessage a = msg("assistant", "a");
  a.reasoning_content = "r";
  EXPECT_EQ(encode({msg("user", "q"), a}, ThinkingMode::kThinking), BOS + U + "q" + A + "<think>r</think>a" + EOS);
}

TEST(ChatEncoding, ToolsCallsAndResults) {
  ChatMessage sys = msg("system", "You are helpful.");
  sys.tools_json = R"([{"type": "function", "function": {"name": "get_weather", "description": "Get weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  ChatMessage call = msg("assistant", "");
  call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris", "days": 2, "opts": {"unit": "C", "x": [1.5, true, null]}})"});
  ChatMessage result = msg("tool", R"({"temp": 21})");
  result.tool_call_id = "call_1";
  const std::string schema =
      R"({"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})";
  const std::string want =
      BOS + "You are helpful.\n\n" + tools_section(schema) + U + "Weather in Paris?" + A + "</think>" +
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\": \"C\", \"x\": [1.5, true, null]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
      EOS + U + "<tool_result>{\"temp\": 21}</tool_result>" + A + "</think>";
  EXPECT_EQ(encode({sys, msg("user", "Weather in Paris?"), call, result}, ThinkingMode::kChat), want);
}

TEST(ChatEncoding, ToolsKeepEarlierReasoningInThinkingMode) {
  ChatMessage sys = msg("system", "");
  sys.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  ChatMessage a1 = msg("assistant", "a1");
  a1.reasoning_content = "r1";
  EXPECT_EQ(encode({sys, msg("user", "q1"), a1, msg("user", "q2")}, ThinkingMode::kThinking),
            BOS + "\n\n" + tools_section(R"({"name": "f"})") + U + "q1" + A + "<think>r1</think>a1" + EOS + U + "q2" + A +
                "<think>");
}

TEST(ChatEncoding, ReasoningEffortPrefixesTheFirstMessageInThinkingModeOnly) {
  const std::string max_text =
      "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
      "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
      "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
      "underlying cause rather than any surface symptom.\n"
      "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain "
      "that no assumption remains unchecked and no error remains undiscovered.\n\n";
  EXPECT_EQ(encode({msg("user", "q")}, ThinkingMode::kThinking, ReasoningEffort::kMax), BOS + max_text + U + "q" + A + "<think>");
  const std::string high = encode({msg("user", "q")}, ThinkingMode::kThinking, ReasoningEffort::kHigh);
  EXPECT_EQ(high.rfind(BOS + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n", 0), 0u);
  EXPECT_EQ(high.substr(high.size() - (U + "q" + A + "<think>").size()), U + "q" + A + "<think>");
  EXPECT_EQ(encode({msg("user", "q")}, ThinkingMode::kChat, ReasoningEffort::kMax), BOS + U + "q" + A + "</think>");
  EXPECT_EQ(encode({msg("user", "q")}, ThinkingMode::kThinking), BOS + U + "q" + A + "<think>");
}

TEST(ChatEncoding, ToolResultsFollowTheOrderOfTheCalls) {
  ChatMessage call = msg("assistant", "");
  call.tool_calls.push_back({"a", "f", "{}"});
  call.tool_calls.push_back({"b", "g", "{}"});
  ChatMessage rb = msg("tool", "B"), ra = msg("tool", "A");
  rb.tool_call_id = "b";
  ra.tool_call_id = "a";
  const std::string got = encode({msg("user", "q"), call, rb, ra, msg("user", "thanks")}, ThinkingMode::kChat);
  // Both results and the next user text form one user turn, blocks joined by a blank line.
  const std::string calls =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_EQ(got, BOS + U + "q" + A + "</think>" + calls + EOS + U +
                     "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nthanks" + A + "</think>");
}

TEST(ChatEncoding, ConsecutiveUserMessagesJoin) {
  EXPECT_EQ(encode({msg("user", "one"), msg("user", "two")}, ThinkingMode::kChat), BOS + U + "one\n\ntwo" + A + "</think>");
}

TEST(ChatEncoding, DeveloperAndLatestReminder) {
  // A developer message is a user turn; in thinking mode one before the last user turn is dropped.
  EXPECT_EQ(encode({msg("developer", "rules"), msg("user", "q")}, ThinkingMode::kChat), BOS + U + "rules" + U + "q" + A + "</think>");
  EXPECT_EQ(encode({msg("developer", "rules"), msg("user", "q")}, ThinkingMode::kThinking), BOS + U + "q" + A + "<think>");
  EXPECT_EQ(encode({msg("user", "q"), msg("latest_reminder", "today is Monday")}, ThinkingMode::kChat),
            BOS + U + "q" + A + "</think><｜latest_reminder｜>today is Monday");
}

TEST(ChatEncoding, ArgumentsThatAreNotAnObject) {
  ChatMessage call = msg("assistant", "");
  call.tool_calls.push_back({"", "f", "not json"});
  call.tool_calls.push_back({"", "g", "[1, 2]"});
  auto s = dsv4_render_tool_calls(call.tool_calls);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(*s,
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"arguments\" string=\"true\">not json"
            "</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"arguments\" "
            "string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
}

TEST(ChatEncoding, Errors) {
  ChatEncodeOptions o;
  auto bad_role = dsv4_encode_chat({msg("robot", "x")}, o);
  ASSERT_FALSE(bad_role.is_ok());
  EXPECT_NE(bad_role.status().message().find("message 0: unknown role 'robot'"), std::string::npos);
  ChatMessage sys = msg("system", "");
  sys.tools_json = "{\"not\": \"a list\"}";
  EXPECT_FALSE(dsv4_encode_chat({sys, msg("user", "q")}, o).is_ok());
  ChatMessage dev;
  dev.role = "developer";
  EXPECT_FALSE(dsv4_encode_chat({dev}, o).is_ok());
}

TEST(ChatMessagesJson, OpenAiRequestWithTools) {
  auto m = chat_messages_from_json(R"({
    "model": "x",
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}]
  })");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 4u);  // a system message was inserted to carry the tools
  EXPECT_EQ((*m)[0].role, "system");
  EXPECT_EQ((*m)[1].content, "part one\n\npart two");
  EXPECT_FALSE((*m)[2].content.has_value());
  ASSERT_EQ((*m)[2].tool_calls.size(), 1u);
  EXPECT_EQ((*m)[2].tool_calls[0].id, "c1");
  const std::string s = encode(*m, ThinkingMode::kChat);
  // Keys keep their order (z before a), the object arguments too (b before a).
  EXPECT_EQ(s.rfind(BOS + "\n\n" + tools_section(R"({"name": "f", "parameters": {"z": 1, "a": 2}})"), 0), 0u);
  EXPECT_NE(s.find("<｜DSML｜parameter name=\"b\" string=\"false\">1</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>"),
            std::string::npos);
  EXPECT_NE(s.find(U + "<tool_result>ok</tool_result>" + A + "</think>"), std::string::npos);
}

TEST(ChatMessagesJson, Errors) {
  EXPECT_FALSE(chat_messages_from_json("[{").is_ok());
  EXPECT_FALSE(chat_messages_from_json(R"({"no_messages": []})").is_ok());
  auto r = chat_messages_from_json(R"([{"content": "x"}])");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("message 0"), std::string::npos);
  EXPECT_FALSE(chat_messages_from_json(R"([{"role": "user", "content": 5}])").is_ok());
}

TEST(PyJson, WritesWhatPythonJsonDumpsWrites) {
  using J = nlohmann::ordered_json;
  // Expected strings are Python 3's json.dumps(json.loads(src), ensure_ascii=False).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"b": 1, "a": [true, false, null]})", R"({"b": 1, "a": [true, false, null]})"},
      {R"({"x":1.0,"y":0.1,"z":-2.5})", R"({"x": 1.0, "y": 0.1, "z": -2.5})"},
      {"[1e-5, 1e16, 1.5e-7, 123456789.0, 1e5, 0.0001, 1.7976931348623157e308]",
       "[1e-05, 1e+16, 1.5e-07, 123456789.0, 100000.0, 0.0001, 1.7976931348623157e+308]"},
      {"[9999999999999998.0, 0.30000000000000004, -0.0]", "[9999999999999998.0, 0.30000000000000004, -0.0]"},
      {R"(["é中😀", "q\"b\\s\n\t\r\b\f", "\u0001\u001f", "/"])",
       "[\"é中😀\", \"q\\\"b\\\\s\\n\\t\\r\\b\\f\", \"\\u0001\\u001f\", \"/\"]"},
      {"{}", "{}"},
      {"[]", "[]"},
      {"[-12, 18446744073709551615]", "[-12, 18446744073709551615]"},
  };
  for (const auto& [src, want] : cases) EXPECT_EQ(py_json_dumps(J::parse(src)), want) << src;
}

}  // namespace
}  // namespace sparrow
