#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "tokenizer/py_json.h"

namespace sparrow {
namespace {

using ojson = nlohmann::ordered_json;

// Reasoning-effort instructions of the -0731 renderer (the spec's ENC source): none for the
// default ("low"), these for "high" and "max".
constexpr std::string_view kEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
constexpr std::string_view kEffortMax =
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
    "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
    "underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain "
    "that no assumption remains unchecked and no error remains undiscovered.\n\n";

// The tools section (DeepSeek-V4 paper, table 4; identical in every copy of the renderer).
constexpr std::string_view kToolsHead =
    "## Tools\n\n"
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
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

struct Block {
  bool tool_result = false;
  std::string text;  // text, or the tool result's content
  std::string tool_use_id;
};

// A message after tool results are merged into user turns.
struct Turn {
  std::string role;
  std::optional<std::string> content;
  std::optional<std::string> reasoning;
  std::vector<ToolCall> calls;
  bool has_blocks = false;
  std::vector<Block> blocks;
  std::vector<ojson> tools;  // the function objects
  std::optional<ojson> response_format;
};

Expected<std::optional<ojson>> parse_json_field(const std::string& text, const std::string& what) {
  if (text.empty()) return std::optional<ojson>();
  ojson j = ojson::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::invalid_argument(what + " is not valid JSON");
  return std::optional<ojson>(std::move(j));
}

Expected<std::vector<ojson>> parse_tools(const std::string& text, size_t index) {
  const std::string what = "message " + std::to_string(index) + ": tools";
  SPARROW_ASSIGN_OR_RETURN(std::optional<ojson> j, parse_json_field(text, what));
  std::vector<ojson> out;
  if (!j) return out;
  if (!j->is_array()) return Status::invalid_argument(what + " is not a JSON array");
  for (const ojson& t : *j) {
    if (!t.is_object()) return Status::invalid_argument(what + ": a tool is not a JSON object");
    out.push_back(t.contains("function") ? t["function"] : t);
  }
  return out;
}

std::string render_tools(const std::vector<ojson>& tools) {
  std::string s(kToolsHead);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) s += '\n';
    s += py_json_dumps(tools[i]);
  }
  s += kToolsTail;
  return s;
}

// The DSML parameters of one call: its JSON arguments' entries in order; arguments that are not
// a JSON object become one parameter named "arguments" (as the reference does).
std::string render_parameters(const std::string& arguments) {
  ojson args = ojson::parse(arguments, nullptr, false);
  if (args.is_discarded()) {
    args = ojson::object({{"arguments", arguments}});
  } else if (!args.is_object()) {
    ojson wrapped = ojson::object();
    wrapped["arguments"] = std::move(args);
    args = std::move(wrapped);
  }
  std::string out;
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += '\n';
    first = false;
    const bool is_str = it.value().is_string();
    out += "<｜DSML｜parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") + "\">";
    out += is_str ? it.value().get<std::string>() : py_json_dumps(it.value());
    out += "</｜DSML｜parameter>";
  }
  return out;
}

int last_user_index(const std::vector<Turn>& turns) {
  for (int i = static_cast<int>(turns.size()) - 1; i >= 0; --i)
    if (turns[i].role == "user" || turns[i].role == "developer") return i;
  return -1;
}

std::string render_user_blocks(const Turn& t) {
  std::string out;
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    if (i) out += "\n\n";
    const Block& b = t.blocks[i];
    out += b.tool_result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
  }
  return out;
}

}  // namespace

Expected<std::string> dsv4_render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out = std::string(dsv4::kToolCallsOpen) + "\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) out += '\n';
    out += "<｜DSML｜invoke name=\"" + calls[i].name + "\">\n" + render_parameters(calls[i].arguments) +
           "\n</｜DSML｜invoke>";
  }
  out += "\n" + std::string(dsv4::kToolCallsClose);
  return out;
}

std::string dsv4_arguments_json(const std::vector<std::pair<std::string, std::pair<std::string, bool>>>& params) {
  std::string out = "{";
  for (size_t i = 0; i < params.size(); ++i) {
    if (i) out += ", ";
    const auto& [key, vs] = params[i];
    out += py_json_quote(key) + ": " + (vs.second ? py_json_quote(vs.first) : vs.first);
  }
  return out + "}";
}

Expected<std::string> dsv4_encode_chat(const std::vector<ChatMessage>& messages, const ChatEncodeOptions& opt) {
  // 1. Tool results into user turns.
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool", "latest_reminder"};
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles))
      return Status::invalid_argument("message " + std::to_string(i) + ": unknown role '" + m.role + "'");
    if (m.role == "tool") {
      Block b{true, m.content.value_or(""), m.tool_call_id};
      if (!turns.empty() && turns.back().role == "user" && turns.back().has_blocks) {
        turns.back().blocks.push_back(std::move(b));
      } else {
        Turn t;
        t.role = "user";
        t.has_blocks = true;
        t.blocks.push_back(std::move(b));
        turns.push_back(std::move(t));
      }
      continue;
    }
    if (m.role == "user") {
      Block b{false, m.content.value_or(""), ""};
      if (!turns.empty() && turns.back().role == "user" && turns.back().has_blocks) {
        turns.back().blocks.push_back(std::move(b));
      } else {
        Turn t;
        t.role = "user";
        t.content = m.content;
        t.has_blocks = true;
        t.blocks.push_back(std::move(b));
        turns.push_back(std::move(t));
      }
      continue;
    }
    Turn t;
    t.role = m.role;
    t.content = m.content;
    t.reasoning = m.reasoning_content;
    t.calls = m.tool_calls;
    SPARROW_ASSIGN_OR_RETURN(t.tools, parse_tools(m.tools_json, i));
    SPARROW_ASSIGN_OR_RETURN(t.response_format,
                             parse_json_field(m.response_format_json, "message " + std::to_string(i) + ": response_format"));
    if (m.role == "developer" && !m.content) return Status::invalid_argument("message " + std::to_string(i) + ": a developer message needs content");
    turns.push_back(std::move(t));
  }

  // 2. Several tool results in one turn follow the order of the calls that asked for them.
  std::map<std::string, int> call_order;
  for (Turn& t : turns) {
    if (t.role == "assistant" && !t.calls.empty()) {
      call_order.clear();
      for (size_t k = 0; k < t.calls.size(); ++k)
        if (!t.calls[k].id.empty()) call_order[t.calls[k].id] = static_cast<int>(k);
    } else if (t.role == "user" && t.has_blocks && !call_order.empty()) {
      std::vector<Block> results;
      for (const Block& b : t.blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) {
        auto rank = [&](const Block& x) {
          auto it = call_order.find(x.tool_use_id);
          return it == call_order.end() ? 0 : it->second;
        };
        return rank(a) < rank(b);
      });
      size_t k = 0;
      for (Block& b : t.blocks)
        if (b.tool_result) b = results[k++];
    }
  }

  // 3. Earlier reasoning is dropped in thinking mode, unless tools are present.
  const bool thinking = opt.mode == ThinkingMode::kThinking;
  bool drop = opt.drop_thinking;
  for (const Turn& t : turns)
    if (!t.tools.empty()) drop = false;
  if (thinking && drop) {
    const int last_user = last_user_index(turns);
    std::vector<Turn> kept;
    for (int i = 0; i < static_cast<int>(turns.size()); ++i) {
      Turn& t = turns[i];
      if (t.role == "user" || t.role == "system" || t.role == "latest_reminder" || i >= last_user) {
        kept.push_back(std::move(t));
      } else if (t.role == "assistant") {
        t.reasoning.reset();
        kept.push_back(std::move(t));
      }  // developer messages before the last user turn are dropped
    }
    turns = std::move(kept);
  }

  // 4. Render.
  const int last_user = last_user_index(turns);
  std::string prompt = opt.add_bos ? std::string(dsv4::kBos) : std::string();
  for (int i = 0; i < static_cast<int>(turns.size()); ++i) {
    const Turn& t = turns[i];
    if (i == 0 && thinking) {
      if (opt.effort == ReasoningEffort::kHigh) prompt += kEffortHigh;
      if (opt.effort == ReasoningEffort::kMax) prompt += kEffortMax;
    }
    auto sections = [&](std::string& s) {
      if (!t.tools.empty()) s += "\n\n" + render_tools(t.tools);
      if (t.response_format) s += "\n\n" + std::string(kResponseFormatHead) + py_json_dumps(*t.response_format);
    };
    if (t.role == "system") {
      prompt += t.content.value_or("");
      sections(prompt);
    } else if (t.role == "developer") {
      prompt += std::string(dsv4::kUser) + t.content.value_or("");
      sections(prompt);
    } else if (t.role == "user") {
      prompt += std::string(dsv4::kUser) + (t.has_blocks ? render_user_blocks(t) : t.content.value_or(""));
    } else if (t.role == "latest_reminder") {
      prompt += std::string(dsv4::kLatestReminder) + t.content.value_or("");
    } else {  // assistant
      if (thinking && (!drop || i > last_user)) prompt += t.reasoning.value_or("") + std::string(dsv4::kThinkEnd);
      prompt += t.content.value_or("");
      if (!t.calls.empty()) {
        SPARROW_ASSIGN_OR_RETURN(std::string calls, dsv4_render_tool_calls(t.calls));
        prompt += "\n\n" + calls;
      }
      prompt += dsv4::kEos;
    }
    const bool next_is_reply = i + 1 >= static_cast<int>(turns.size()) || turns[i + 1].role == "assistant" ||
                               turns[i + 1].role == "latest_reminder";
    if (next_is_reply && (t.role == "user" || t.role == "developer")) {
      prompt += dsv4::kAssistant;
      prompt += thinking && (!drop || i >= last_user) ? dsv4::kThinkStart : dsv4::kThinkEnd;
    }
  }
  return prompt;
}

namespace {

// Text of an OpenAI content value: a string, null, or a list of parts ({"type": "text", …} kept,
// any other part as "[Unsupported TYPE]", the reference's rendering of tool-result lists).
Expected<std::optional<std::string>> content_text(const ojson& v, const std::string& where) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (!v.is_array()) return Status::invalid_argument(where + ": content must be a string, null or a list of parts");
  std::string out;
  bool first = true;
  for (const ojson& part : v) {
    if (!first) out += "\n\n";
    first = false;
    if (part.is_string()) {
      out += part.get<std::string>();
      continue;
    }
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if (type == "text" && part.contains("text") && part["text"].is_string())
      out += part["text"].get<std::string>();
    else
      out += "[Unsupported " + type + "]";
  }
  return std::optional<std::string>(out);
}

}  // namespace

Expected<std::vector<ChatMessage>> chat_messages_from_json(std::string_view text) {
  ojson j = ojson::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::invalid_argument("messages: not valid JSON");
  ojson request_tools, request_format;
  if (j.is_object()) {
    if (!j.contains("messages") || !j["messages"].is_array())
      return Status::invalid_argument("messages: the JSON object has no \"messages\" array");
    if (j.contains("tools") && !j["tools"].is_null()) request_tools = j["tools"];
    if (j.contains("response_format") && !j["response_format"].is_null()) request_format = j["response_format"];
    ojson msgs = j["messages"];
    j = std::move(msgs);
  }
  if (!j.is_array()) return Status::invalid_argument("messages: expected a JSON array of messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const ojson& m = j[i];
    const std::string where = "message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status::invalid_argument(where + ": expected an object with a string \"role\"");
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (m.contains("content")) {
      SPARROW_ASSIGN_OR_RETURN(msg.content, content_text(m["content"], where));
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) msg.tool_call_id = m["tool_call_id"].get<std::string>();
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (const ojson& c : m["tool_calls"]) {
        if (!c.is_object()) return Status::invalid_argument(where + ": a tool call is not an object");
        const ojson& f = c.contains("function") ? c["function"] : c;
        ToolCall tc;
        if (c.contains("id") && c["id"].is_string()) tc.id = c["id"].get<std::string>();
        if (!f.contains("name") || !f["name"].is_string()) return Status::invalid_argument(where + ": a tool call has no name");
        tc.name = f["name"].get<std::string>();
        if (f.contains("arguments")) tc.arguments = f["arguments"].is_string() ? f["arguments"].get<std::string>() : f["arguments"].dump();
        else tc.arguments = "{}";
        msg.tool_calls.push_back(std::move(tc));
      }
    }
    if (m.contains("tools") && m["tools"].is_array()) msg.tools_json = m["tools"].dump();
    if (m.contains("response_format") && !m["response_format"].is_null()) msg.response_format_json = m["response_format"].dump();
    out.push_back(std::move(msg));
  }
  if (!request_tools.is_null() || !request_format.is_null()) {
    auto sys = std::find_if(out.begin(), out.end(), [](const ChatMessage& m) { return m.role == "system"; });
    if (sys == out.end()) {
      ChatMessage s;
      s.role = "system";
      s.content = "";
      sys = out.insert(out.begin(), std::move(s));
    }
    if (!request_tools.is_null()) {
      if (!request_tools.is_array()) return Status::invalid_argument("tools: expected a JSON array");
      sys->tools_json = request_tools.dump();
    }
    if (!request_format.is_null()) sys->response_format_json = request_format.dump();
  }
  return out;
}

}  // namespace sparrow
