#include "tokenizer/chat_parser.h"

#include <algorithm>
#include <array>

#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

constexpr std::string_view kDsmlTag = "<｜DSML｜";
constexpr std::string_view kDsmlTagAfterBlank = "\n\n<｜DSML｜";
constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

constexpr std::array<std::string_view, 4> kReasoningMarkers = {dsv4::kThinkEnd, dsv4::kEos, kDsmlTagAfterBlank, kDsmlTag};
constexpr std::array<std::string_view, 3> kContentMarkers = {dsv4::kEos, kDsmlTagAfterBlank, kDsmlTag};

template <size_t N>
std::pair<size_t, std::string_view> find_first(std::string_view s, const std::array<std::string_view, N>& markers) {
  size_t best = std::string_view::npos;
  std::string_view which;
  for (std::string_view m : markers) {
    const size_t p = s.find(m);
    if (p < best || (p == best && p != std::string_view::npos && m.size() > which.size())) {
      best = p;
      which = m;
    }
  }
  return {best, which};
}

// Length of the longest suffix of `s` that is a proper prefix of some marker.
template <size_t N>
size_t partial_marker_suffix(std::string_view s, const std::array<std::string_view, N>& markers) {
  size_t best = 0;
  for (std::string_view m : markers)
    for (size_t len = std::min(s.size(), m.size() - 1); len > best; --len)
      if (s.substr(s.size() - len) == m.substr(0, len)) {
        best = len;
        break;
      }
  return best;
}

// Value of attr="..." starting the search at `from`; npos-safe.
bool read_attr(std::string_view s, std::string_view attr, size_t& pos, std::string& value) {
  const std::string key = " " + std::string(attr) + "=\"";
  if (s.compare(pos, key.size(), key) != 0) return false;
  const size_t start = pos + key.size();
  const size_t end = s.find('"', start);
  if (end == std::string_view::npos) return false;
  value = std::string(s.substr(start, end - start));
  pos = end + 1;
  return true;
}

}  // namespace

Dsv4OutputParser::Dsv4OutputParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::kThinking ? State::kReasoning : State::kContent) {}

ChatDelta Dsv4OutputParser::push(std::string_view text) {
  ChatDelta out;
  if (state_ == State::kDone) return out;
  buf_.append(text);
  run(out, false);
  return out;
}

ChatDelta Dsv4OutputParser::finish() {
  ChatDelta out;
  if (state_ != State::kDone) run(out, true);
  buf_.clear();
  return out;
}

void Dsv4OutputParser::parse_invoke(std::string_view s, ChatDelta& out) {
  // s = <｜DSML｜invoke name="N">\n (<｜DSML｜parameter name="K" string="B">V</｜DSML｜parameter>\n)* </｜DSML｜invoke>
  size_t pos = kInvokeOpen.size();
  std::string name;
  if (!read_attr(s, "name", pos, name) || s.compare(pos, 1, ">") != 0) {
    errors_.push_back("malformed invoke tag: " + std::string(s.substr(0, 80)));
    return;
  }
  ++pos;
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> params;
  while (true) {
    const size_t open = s.find(kParamOpen, pos);
    if (open == std::string_view::npos) break;
    pos = open + kParamOpen.size();
    std::string key, flag;
    if (!read_attr(s, "name", pos, key) || !read_attr(s, "string", pos, flag) || (flag != "true" && flag != "false") ||
        s.compare(pos, 1, ">") != 0) {
      errors_.push_back("malformed parameter tag in tool call '" + name + "'");
      return;
    }
    ++pos;
    const size_t close = s.find(kParamClose, pos);
    if (close == std::string_view::npos) {
      errors_.push_back("unclosed parameter '" + key + "' in tool call '" + name + "'");
      return;
    }
    std::string value(s.substr(pos, close - pos));
    pos = close + kParamClose.size();
    if (std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == key; })) {
      errors_.push_back("duplicate parameter '" + key + "' in tool call '" + name + "'");
      continue;
    }
    params.push_back({key, {std::move(value), flag == "true"}});
  }
  out.tool_calls.push_back(ToolCall{"", name, dsv4_arguments_json(params)});
}

void Dsv4OutputParser::run(ChatDelta& out, bool final) {
  while (true) {
    if (state_ == State::kDone) {
      buf_.clear();
      return;
    }
    if (state_ == State::kToolCalls) {
      const size_t inv = buf_.find(kInvokeClose);
      const size_t blk = buf_.find(dsv4::kToolCallsClose);
      if (inv != std::string::npos && (blk == std::string::npos || inv < blk)) {
        const size_t start = buf_.find(kInvokeOpen);
        if (start != std::string::npos && start < inv)
          parse_invoke(std::string_view(buf_).substr(start, inv + kInvokeClose.size() - start), out);
        else
          errors_.push_back("</｜DSML｜invoke> without <｜DSML｜invoke");
        buf_.erase(0, inv + kInvokeClose.size());
        continue;
      }
      if (blk != std::string::npos) {
        buf_.erase(0, blk + dsv4::kToolCallsClose.size());
        state_ = State::kContent;  // normally only <｜end▁of▁sentence｜> follows
        continue;
      }
      if (buf_.find(dsv4::kEos) != std::string::npos) {
        errors_.push_back("the reply ended inside a tool-call block");
        state_ = State::kDone;
        continue;
      }
      if (final) {
        if (buf_.find_first_not_of(" \n") != std::string::npos)
          errors_.push_back("the output stopped inside a tool-call block");
        buf_.clear();
      }
      return;
    }

    // Reasoning or content: text up to the first marker goes out.
    const bool reasoning = state_ == State::kReasoning;
    std::string& sink = reasoning ? out.reasoning : out.content;
    auto [p, marker] = reasoning ? find_first(buf_, kReasoningMarkers) : find_first(buf_, kContentMarkers);
    if (p != std::string::npos) {
      sink.append(buf_, 0, p);
      if (marker == dsv4::kThinkEnd) {
        buf_.erase(0, p + marker.size());
        state_ = State::kContent;
      } else if (marker == dsv4::kEos) {
        state_ = State::kDone;
      } else {  // DSML markup: the "\n\n" before it belongs to the markup, not to the text
        buf_.erase(0, p + (marker == kDsmlTagAfterBlank ? 2 : 0));
        if (reasoning) errors_.push_back("a tool call started inside the reasoning");
        state_ = State::kToolCalls;
      }
      continue;
    }
    size_t hold = reasoning ? partial_marker_suffix(buf_, kReasoningMarkers) : partial_marker_suffix(buf_, kContentMarkers);
    if (final) {
      // What is held back was not markup after all unless it has the markers' fullwidth bar
      // (a cut-off "<｜DSML" or "<｜end▁of"): "\n", "<" or "</thi" are text.
      const std::string_view tail = std::string_view(buf_).substr(buf_.size() - hold);
      if (tail.find("｜") == std::string_view::npos) {
        hold = 0;
      } else {
        errors_.push_back("the output stopped inside a tag: '" + std::string(tail) + "'");
      }
      sink.append(utf8_repair(std::string_view(buf_).substr(0, buf_.size() - hold)));
      buf_.clear();
      return;
    }
    const size_t emit = utf8_complete_prefix(std::string_view(buf_).substr(0, buf_.size() - hold));
    sink.append(buf_, 0, emit);
    buf_.erase(0, emit);
    return;
  }
}

ChatDelta dsv4_parse_output(std::string_view text, ThinkingMode mode, std::vector<std::string>* errors) {
  Dsv4OutputParser p(mode);
  ChatDelta a = p.push(text);
  ChatDelta b = p.finish();
  a.content += b.content;
  a.reasoning += b.reasoning;
  a.tool_calls.insert(a.tool_calls.end(), b.tool_calls.begin(), b.tool_calls.end());
  if (errors) *errors = p.errors();
  return a;
}

}  // namespace sparrow
