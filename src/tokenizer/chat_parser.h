// Streaming parser of DeepSeek-V4 model output: splits the generated text into content,
// reasoning_content and tool_calls as it arrives (the inverse of chat_encoding.h).
//
// Grammar of a reply (after the prompt's <｜Assistant｜><think> or <｜Assistant｜></think>):
//   [reasoning </think>]  (thinking mode only)
//   content
//   ["\n\n<｜DSML｜tool_calls>\n" (<｜DSML｜invoke name="N">\n
//        (<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n)*
//    </｜DSML｜invoke>\n)* "</｜DSML｜tool_calls>"]
//   <｜end▁of▁sentence｜>
//
// Invariant (traps.md row 15): no byte of DSML markup ever reaches content or reasoning. Text
// that could still turn out to be the start of a marker ("\n", "\n\n<｜DS", "</thi", ...) is held
// back until the next push decides, and content is never cut inside a UTF-8 character. Any
// "<｜DSML｜" starts tool-call parsing, even without the tool_calls wrapper or its "\n\n".
// Tool calls are emitted whole, each when its </｜DSML｜invoke> arrives; their arguments are JSON
// text as DeepSeek's reference parser writes it ({"k": "string", "n": 5}).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_encoding.h"

namespace sparrow {

struct ChatDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class Dsv4OutputParser {
 public:
  // kThinking: the reply starts inside the reasoning (the prompt ended with <think>).
  explicit Dsv4OutputParser(ThinkingMode mode);

  // Feeds the next piece of generated text (any split, even inside a tag or a character).
  ChatDelta push(std::string_view text);
  // End of generation: flushes held-back text that turned out not to be markup ("\n", "<");
  // a cut-off marker (one with the fullwidth bar: "<｜DSML", "<｜end▁of") or tool call is dropped
  // and reported in errors().
  ChatDelta finish();

  // True once <｜end▁of▁sentence｜> was seen (later text is ignored).
  bool done() const { return state_ == State::kDone; }
  // Format problems met so far (a malformed invoke, an unclosed block, ...).
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  enum class State { kReasoning, kContent, kToolCalls, kDone };
  void run(ChatDelta& out, bool final);
  void parse_invoke(std::string_view text, ChatDelta& out);

  State state_;
  std::string buf_;  // text not yet emitted or consumed
  std::vector<std::string> errors_;
};

// Whole-text convenience: push(text) then finish(), merged.
ChatDelta dsv4_parse_output(std::string_view text, ThinkingMode mode, std::vector<std::string>* errors = nullptr);

}  // namespace sparrow
