// The --tokenizer / --model options shared by the subcommands that need a tokenizer
// (tokenize, detokenize, render-chat, run).
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "common.h"
#include "tokenizer/tokenizer.h"

namespace sparrow::app {

struct TokenizerSource {
  std::string tokenizer;  // a tokenizer.json file or a directory holding one
  std::string model;      // a checkpoint directory holding tokenizer.json
};

inline void add_tokenizer_options(CLI::App* cmd, TokenizerSource* src, bool model_required = false) {
  cmd->add_option("--tokenizer", src->tokenizer,
                  "tokenizer.json, or a directory holding it (tokenizer_config.json beside it is read too)");
  auto* m = cmd->add_option("--model", src->model, "Checkpoint directory (its tokenizer.json is used unless --tokenizer)");
  if (model_required) m->required();
}

// Loads the tokenizer named by --tokenizer, else the one in --model; prints timing on stderr.
inline Tokenizer load_tokenizer_or_fail(const TokenizerSource& src, bool verbose = true) {
  if (src.tokenizer.empty() && src.model.empty())
    fail(Status::invalid_argument("give --tokenizer FILE|DIR or --model DIR"));
  const std::string path = src.tokenizer.empty() ? src.model : src.tokenizer;
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(path);
  if (!tok.is_ok()) fail(tok.status());
  if (verbose) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "sparrow: tokenizer %s: %d ids, %zu added tokens, loaded in %.2f s\n", path.c_str(),
                 tok->vocab_size(), tok->added_tokens().size(), s);
  }
  return std::move(tok).value();
}

}  // namespace sparrow::app
