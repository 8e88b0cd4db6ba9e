// `sparrow tokenize` and `sparrow detokenize`: text <-> token ids with a tokenizer.json.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cmd_tokenizer_options.h"
#include "common.h"

namespace sparrow::app {
namespace {

Expected<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::not_found(path + " cannot be opened");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --ids for detokenize: what parse_ids takes, or a .json file holding one array of ids (what
// `sparrow tokenize` prints).
Expected<std::vector<int32_t>> parse_ids_or_json(const std::string& arg) {
  if (arg.size() > 5 && arg.substr(arg.size() - 5) == ".json") {
    SPARROW_ASSIGN_OR_RETURN(std::string text, read_text_file(arg));
    std::string list;
    for (char c : text)
      if (c != '[' && c != ']' && c != ' ' && c != '\n' && c != '\r' && c != '\t') list += c;
    if (list.empty()) return std::vector<int32_t>{};
    auto ids = parse_ids(list);
    if (!ids.is_ok()) return ids.status().with_context(arg);
    return ids;
  }
  return parse_ids(arg);
}

void write_stdout(std::string_view s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size())
    fail(Status::io_error("cannot write to stdout"));
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  struct TokenizeOpts {
    TokenizerSource src;
    std::string in, text;
    bool add_special = false, stats = false;
  };
  auto t = std::make_shared<TokenizeOpts>();
  auto* tok_cmd = app.add_subcommand("tokenize", "Print the token ids of a text as one JSON array");
  add_tokenizer_options(tok_cmd, &t->src);
  auto* in_opt = tok_cmd->add_option("--in", t->in, "UTF-8 text file to encode (its bytes exactly)");
  tok_cmd->add_option("--text", t->text, "Text to encode (instead of --in)")->excludes(in_opt);
  tok_cmd->add_flag("--add-special-tokens", t->add_special,
                    "Add BOS/EOS as tokenizer_config.json says (default: raw text only, like add_special_tokens=False)");
  tok_cmd->add_flag("--stats", t->stats, "Print the encoding time and throughput on stderr");
  tok_cmd->callback([t] {
    Tokenizer tok = load_tokenizer_or_fail(t->src, t->stats);
    std::string text = t->text;
    if (!t->in.empty()) {
      auto r = read_text_file(t->in);
      if (!r.is_ok()) fail(r.status());
      text = std::move(r).value();
    } else if (t->text.empty()) {
      fail(Status::invalid_argument("give --in TEXTFILE or --text TEXT"));
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = tok.encode(text, t->add_special);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ids.is_ok()) fail(ids.status().with_context(t->in.empty() ? "--text" : t->in));
    std::string out = "[";
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i) out += ',';
      out += std::to_string((*ids)[i]);
    }
    out += "]\n";
    write_stdout(out);
    if (t->stats)
      std::fprintf(stderr, "sparrow: encoded %zu bytes into %zu tokens in %.3f s (%.2f MB/s)\n", text.size(),
                   ids->size(), s, s > 0 ? text.size() / s / 1e6 : 0.0);
  });

  struct DetokenizeOpts {
    TokenizerSource src;
    std::string ids;
    bool skip_special = false;
  };
  auto d = std::make_shared<DetokenizeOpts>();
  auto* det_cmd = app.add_subcommand("detokenize", "Print the text of token ids (exactly, no newline added)");
  add_tokenizer_options(det_cmd, &d->src);
  det_cmd->add_option("--ids", d->ids, "Token ids: a list like 1,2,3, a .npy file, or a .json file with one array")
      ->required();
  det_cmd->add_flag("--skip-special-tokens", d->skip_special, "Leave out special tokens (BOS, EOS, ...)");
  det_cmd->callback([d] {
    auto ids = parse_ids_or_json(d->ids);
    if (!ids.is_ok()) fail(ids.status());
    Tokenizer tok = load_tokenizer_or_fail(d->src, false);
    auto text = tok.decode(*ids, d->skip_special);
    if (!text.is_ok()) fail(text.status());
    write_stdout(*text);
  });
}

}  // namespace sparrow::app
