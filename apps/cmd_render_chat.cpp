// `sparrow render-chat`: the DeepSeek-V4 prompt of an OpenAI-style message list (the text, or its
// token ids with a tokenizer), for checking what `run` and the server feed the model.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cmd_tokenizer_options.h"
#include "common.h"
#include "tokenizer/chat_encoding.h"

namespace sparrow::app {

void add_render_chat_command(CLI::App& app) {
  struct Opts {
    TokenizerSource src;
    std::string messages, effort = "default";
    bool think = false, keep_reasoning = false, no_bos = false, ids = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("render-chat", "Print the DeepSeek-V4 prompt of a chat (OpenAI-style messages JSON)");
  cmd->add_option("--messages", o->messages, "Messages JSON file: an array, or an object with \"messages\" (and \"tools\"); - for stdin")
      ->required();
  cmd->add_flag("--think", o->think, "Thinking mode (default: chat mode)");
  cmd->add_option("--effort", o->effort, "Reasoning effort in thinking mode: default, high or max")
      ->check(CLI::IsMember({"default", "high", "max"}))
      ->capture_default_str();
  cmd->add_flag("--keep-reasoning", o->keep_reasoning, "Keep earlier turns' reasoning (drop_thinking=False)");
  cmd->add_flag("--no-bos", o->no_bos, "Leave out the BOS text");
  cmd->add_flag("--ids", o->ids, "Print token ids (needs --tokenizer or --model) instead of text");
  add_tokenizer_options(cmd, &o->src);
  cmd->callback([o] {
    std::string json;
    if (o->messages == "-") {
      json.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream f(o->messages, std::ios::binary);
      if (!f) fail(Status::not_found(o->messages + " cannot be opened"));
      std::ostringstream ss;
      ss << f.rdbuf();
      json = ss.str();
    }
    auto msgs = chat_messages_from_json(json);
    if (!msgs.is_ok()) fail(msgs.status().with_context(o->messages));
    ChatEncodeOptions ce;
    ce.mode = o->think ? ThinkingMode::kThinking : ThinkingMode::kChat;
    ce.effort = o->effort == "high" ? ReasoningEffort::kHigh : o->effort == "max" ? ReasoningEffort::kMax : ReasoningEffort::kDefault;
    ce.drop_thinking = !o->keep_reasoning;
    ce.add_bos = !o->no_bos;
    auto text = dsv4_encode_chat(*msgs, ce);
    if (!text.is_ok()) fail(text.status().with_context(o->messages));
    if (!o->ids) {
      std::fwrite(text->data(), 1, text->size(), stdout);
      return;
    }
    Tokenizer tok = load_tokenizer_or_fail(o->src, false);
    auto ids = tok.encode(*text, false);
    if (!ids.is_ok()) fail(ids.status());
    std::string out = "[";
    for (size_t i = 0; i < ids->size(); ++i) out += (i ? "," : "") + std::to_string((*ids)[i]);
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace sparrow::app
