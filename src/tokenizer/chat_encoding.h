// DeepSeek-V4 chat encoding (dsv4-spec.md §7): an OpenAI-style message list -> the prompt text.
//
// There is no Jinja template: the reference is DeepSeek's Python renderer encoding_dsv4.py (the
// -0731 version, as the spec's ENC source re-implements it). Rules, in order:
//   1. tool messages become <tool_result>…</tool_result> blocks of a user turn, merged into the
//      user turn just before them; a user message right after tool results joins that turn
//      (blocks joined by "\n\n"); several results are put in the order of the calls' ids;
//   2. in thinking mode, unless some message carries tools, assistant turns before the last user
//      turn lose their reasoning and developer messages before it are dropped;
//   3. the prompt is BOS, then each message:
//        system     content ["\n\n" tools section] ["\n\n" response-format section]
//        developer  <｜User｜>content [tools] [response format]
//        user       <｜User｜>content
//        assistant  [reasoning</think>]content["\n\n" DSML tool calls]<｜end▁of▁sentence｜>
//                   (reasoning part only in thinking mode, for turns after the last user turn
//                   or when reasoning is kept)
//      and after a user/developer turn followed by an assistant turn or by nothing:
//        <｜Assistant｜> then <think> (thinking mode, last user turn or reasoning kept) or </think>;
//   4. in thinking mode, the first message is prefixed with the reasoning-effort instruction
//      (nothing for the default effort, fixed texts for high and max).
// Tool calls render as
//   <｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n…</｜DSML｜invoke>\n</｜DSML｜tool_calls>
// where V is a string argument as is, or any other value as Python's json.dumps writes it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparrow/status.h"

namespace sparrow {

enum class ThinkingMode { kChat, kThinking };
enum class ReasoningEffort { kDefault, kHigh, kMax };

// The special strings of the format (looked up in the tokenizer by these strings).
namespace dsv4 {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kToolCallsOpen = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kToolCallsClose = "</｜DSML｜tool_calls>";
}  // namespace dsv4

struct ToolCall {
  std::string id;         // OpenAI's tool_call id (orders tool results); may be empty
  std::string name;
  std::string arguments;  // JSON text of an object, as OpenAI's function.arguments
};

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool, latest_reminder
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;  // assistant
  std::vector<ToolCall> tool_calls;              // assistant
  std::string tool_call_id;                      // tool
  std::string tools_json;            // system/developer: JSON array of OpenAI tools, "" if none
  std::string response_format_json;  // system/developer: JSON value, "" if none
};

struct ChatEncodeOptions {
  ThinkingMode mode = ThinkingMode::kChat;
  ReasoningEffort effort = ReasoningEffort::kDefault;
  bool drop_thinking = true;  // drop earlier turns' reasoning (kept anyway when tools are present)
  bool add_bos = true;
};

// The prompt text (special tokens as text: tokenize it with add_special_tokens=false).
Expected<std::string> dsv4_encode_chat(const std::vector<ChatMessage>& messages, const ChatEncodeOptions& options);

// An OpenAI-style request: a JSON array of messages, or an object with "messages" and optionally
// "tools" and "response_format" (attached to the first system message; one is inserted at the
// front when there is none). Message content may be a string, null, or a list of
// {"type": "text", "text": …} parts (joined by "\n\n"); tool-call arguments may be a JSON string
// or an object.
Expected<std::vector<ChatMessage>> chat_messages_from_json(std::string_view json);

// The DSML block for `calls` (without the leading "\n\n"), as the encoder writes it.
Expected<std::string> dsv4_render_tool_calls(const std::vector<ToolCall>& calls);

// The arguments JSON text for DSML parameters (name, value, string flag), as the reference
// decoder writes it: {"k": "string value", "n": 5}; a non-string value is copied as written.
std::string dsv4_arguments_json(const std::vector<std::pair<std::string, std::pair<std::string, bool>>>& params);

}  // namespace sparrow
