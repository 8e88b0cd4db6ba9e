// `sparrow run`: text in, text out. The prompt is tokenized (plain, or as a DeepSeek-V4 chat with
// --chat/--think/--system/--messages), tokens are sampled and streamed to the terminal as text.
// In chat mode the reply is parsed as it streams: content goes to stdout, reasoning to stderr,
// tool calls to stdout as one JSON object per line at the end; DSML markup is never printed.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cmd_tokenizer_options.h"
#include "common.h"
#include "runtime/stream_generate.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/chat_parser.h"
#include "tokenizer/stop_strings.h"

namespace sparrow::app {
namespace {

void out_text(FILE* f, std::string_view s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

Expected<std::string> read_file_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::not_found(path + " cannot be opened");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

void add_run_command(CLI::App& app) {
  struct Opts {
    TokenizerSource src;
    std::string prompt, system, messages, effort = "default", backend = "cpu";
    bool chat = false, think = false, raw = false, show_ids = false;
    int64_t max_tokens = 256;
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
    int64_t top_k = 0;
    uint64_t seed = 0;
    std::vector<std::string> stops;
    ModelRunOptions run;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt, streamed to the terminal");
  add_tokenizer_options(cmd, &o->src, /*model_required=*/true);
  cmd->add_option("prompt", o->prompt, "The prompt text (in chat mode: the user message)");
  cmd->add_flag("--chat", o->chat, "Encode the prompt as a DeepSeek-V4 chat (chat mode: the reply follows </think>)");
  cmd->add_flag("--think", o->think, "Thinking mode (implies --chat): the reply starts with reasoning after <think>");
  cmd->add_option("--system", o->system, "System message (implies --chat)");
  cmd->add_option("--messages", o->messages,
                  "OpenAI-style messages JSON file (implies --chat); the prompt, if given, is added as a user message");
  cmd->add_option("--effort", o->effort, "Reasoning effort in thinking mode: default, high or max")
      ->check(CLI::IsMember({"default", "high", "max"}))
      ->capture_default_str();
  cmd->add_flag("--raw", o->raw, "In chat mode, print the generated text as is (markup included) instead of parsing it");
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Tokens to generate at most")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Keep the K most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "Drop tokens below MIN_P times the top probability (0: off)")->capture_default_str();
  cmd->add_option("--repetition-penalty", o->repetition_penalty, "Penalty for ids already seen (1: off)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed (same seed, same tokens)")->capture_default_str();
  cmd->add_option("--stop", o->stops, "Stop when this text appears (repeatable); it is not printed")
      ->allow_extra_args(false);
  cmd->add_flag("--show-ids", o->show_ids, "Print the prompt and generated token ids on stderr");
  add_backend_option(cmd, &o->backend);
  add_model_run_options(cmd, &o->run);
  cmd->callback([o] {
    const bool chat = o->chat || o->think || !o->system.empty() || !o->messages.empty();
    if (o->prompt.empty() && o->messages.empty()) fail(Status::invalid_argument("give a prompt (or --messages FILE)"));
    StreamGenerateOptions gen;
    gen.max_new_tokens = o->max_tokens;
    gen.sampling.temperature = o->temperature;
    gen.sampling.top_k = o->top_k;
    gen.sampling.top_p = o->top_p;
    gen.sampling.seed = o->seed;
    gen.min_p = o->min_p;
    gen.repetition_penalty = o->repetition_penalty;
    if (Status s = stream_generate_options_check(gen); !s.is_ok()) fail(s);

    Tokenizer tok = load_tokenizer_or_fail(o->src);
    // The prompt text.
    std::string text = o->prompt;
    const ThinkingMode mode = o->think ? ThinkingMode::kThinking : ThinkingMode::kChat;
    if (chat) {
      std::vector<ChatMessage> msgs;
      if (!o->messages.empty()) {
        auto j = read_file_text(o->messages);
        if (!j.is_ok()) fail(j.status());
        auto parsed = chat_messages_from_json(*j);
        if (!parsed.is_ok()) fail(parsed.status().with_context(o->messages));
        msgs = std::move(parsed).value();
      }
      if (!o->system.empty()) {
        ChatMessage s;
        s.role = "system";
        s.content = o->system;
        msgs.insert(msgs.begin(), std::move(s));
      }
      if (!o->prompt.empty()) {
        ChatMessage u;
        u.role = "user";
        u.content = o->prompt;
        msgs.push_back(std::move(u));
      }
      ChatEncodeOptions ce;
      ce.mode = mode;
      ce.effort = o->effort == "high" ? ReasoningEffort::kHigh : o->effort == "max" ? ReasoningEffort::kMax : ReasoningEffort::kDefault;
      auto rendered = dsv4_encode_chat(msgs, ce);
      if (!rendered.is_ok()) fail(rendered.status());
      text = std::move(rendered).value();
    }
    // Chat text carries its BOS as text; a plain prompt gets what tokenizer_config.json says.
    auto ids = tok.encode(text, /*add_special_tokens=*/!chat);
    if (!ids.is_ok()) fail(ids.status().with_context("prompt"));
    if (auto eos = tok.eos_id()) gen.stop_tokens.push_back(*eos);

    auto backend = make_backend_or_fail(o->backend);
    auto model = load_model_or_fail(o->src.model, model_overrides_or_fail(o->run, o->backend));
    if (verbose_flag()) std::fprintf(stderr, "sparrow: prompt text: %s\n", text.c_str());

    StreamDecoder decoder(tok);
    StopStringFilter stops(o->stops);
    Dsv4OutputParser parser(mode);
    bool in_reasoning = false;
    auto show = [&](std::string_view piece) {
      if (!chat || o->raw) {
        out_text(stdout, piece);
        return;
      }
      ChatDelta d = parser.push(piece);
      if (!d.reasoning.empty()) {
        in_reasoning = true;
        out_text(stderr, d.reasoning);
      }
      if (!d.content.empty()) {
        if (in_reasoning) out_text(stderr, "\n");
        in_reasoning = false;
        out_text(stdout, d.content);
      }
      for (const ToolCall& c : d.tool_calls) {
        nlohmann::json j = {{"tool_call", {{"name", c.name}, {"arguments", c.arguments}}}};
        out_text(stdout, "\n" + j.dump() + "\n");
      }
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto result = stream_generate(*model, *backend, *ids, gen, [&](int32_t id) {
      show(stops.push(decoder.push(id)));
      return !stops.stopped() && !(chat && !o->raw && parser.done());
    });
    if (!result.is_ok()) fail(result.status());
    show(stops.push(decoder.finish()));
    show(stops.finish());
    if (chat && !o->raw) {
      ChatDelta d = parser.finish();
      out_text(stderr, d.reasoning);
      out_text(stdout, d.content);
      for (const std::string& e : parser.errors()) std::fprintf(stderr, "sparrow: output format: %s\n", e.c_str());
    }
    out_text(stdout, "\n");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o->show_ids) {
      std::string p, g;
      for (int32_t id : *ids) p += (p.empty() ? "" : ",") + std::to_string(id);
      for (int32_t id : result->tokens) g += (g.empty() ? "" : ",") + std::to_string(id);
      std::fprintf(stderr, "sparrow: prompt ids %s\nsparrow: generated ids %s\n", p.c_str(), g.c_str());
    }
    const char* why = stops.stopped() ? "stop string" : result->reason == FinishReason::kStop ? "end of sequence"
                      : result->reason == FinishReason::kLength ? "max tokens" : "end of reply";
    std::fprintf(stderr, "sparrow: %zu prompt + %zu generated tokens in %.2f s (%.1f tokens/s), stopped at %s\n",
                 ids->size(), result->tokens.size(), s, s > 0 ? result->tokens.size() / s : 0.0, why);
  });
}

}  // namespace sparrow::app
