// `sparrow serve`: the OpenAI-compatible HTTP server (src/server/) over an Engine.
//
// Signals: SIGTERM and SIGINT are blocked in every thread and taken by sigwait() on the main
// thread, so the shutdown sequence runs in ordinary code: /health turns 503, in-flight requests
// are cancelled (streams end with finish_reason "abort" and [DONE]), the listener closes, exit 0.
#include <csignal>
#include <cstdio>
#include <thread>

#include <pthread.h>

#include "cmd_tokenizer_options.h"
#include "common.h"
#include "server/server.h"
#include "sparrow/engine.h"

namespace sparrow::app {

void add_serve_command(CLI::App& app) {
  struct Opts {
    TokenizerSource src;
    std::string backend = "cpu", host = "127.0.0.1", name;
    int port = 8000;
    int64_t max_context = 4096, max_batch = 32, max_queue = 256;
    int http_threads = 0;  // 0: sized from the engine (see server::ServerOptions)
    ModelRunOptions run;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API (chat/completions, completions, models, health, metrics)");
  add_tokenizer_options(cmd, &opts->src, /*model_required=*/true);
  cmd->add_option("--host", opts->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", opts->port, "Port to listen on (0: any free port, printed on stderr)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--served-model-name", opts->name, "Model name clients must send (default: the --model directory's name)");
  cmd->add_option("--max-context", opts->max_context, "Prompt + max_tokens of one request")->check(CLI::Range(int64_t{2}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--max-batch", opts->max_batch, "Requests decoding together")->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  cmd->add_option("--max-queue", opts->max_queue, "Waiting requests before 503")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--http-threads", opts->http_threads,
                  "Connections served at once (each stream holds one); more get 503. 0: max-queue + max-batch + 32")
      ->check(CLI::Range(0, 65536))->capture_default_str();
  add_backend_option(cmd, &opts->backend);
  add_model_run_options(cmd, &opts->run);
  cmd->callback([opts] {
    // Blocked before any thread starts, so every thread inherits the mask and only sigwait sees them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

    // The flags' errors name the flag; the engine parses them again.
    (void)model_overrides_or_fail(opts->run, opts->backend);
    Tokenizer tok = load_tokenizer_or_fail(opts->src);
    EngineOptions eo;
    eo.model_dir = opts->src.model;
    eo.backend = opts->backend;
    eo.max_batch = opts->max_batch;
    eo.max_context = opts->max_context;
    eo.max_queue = opts->max_queue;
    eo.precision = opts->run.precision;
    eo.index_keys = opts->run.index_keys;
    eo.index_topk = opts->run.index_topk;
    eo.attn_weights = opts->run.attn_weights;
    auto engine = Engine::create(eo);
    if (!engine.is_ok()) fail(engine.status());
    if ((*engine)->vocab_size() < tok.vocab_size())
      fail(Status::invalid_argument("the tokenizer has " + std::to_string(tok.vocab_size()) + " ids but the model's vocabulary is " +
                                    std::to_string((*engine)->vocab_size())));

    server::ServerOptions so;
    so.host = opts->host;
    so.port = opts->port;
    so.max_context = opts->max_context;
    so.http_threads = opts->http_threads;
    so.served_model_name = opts->name;
    if (so.served_model_name.empty()) {
      std::string dir = opts->src.model;
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      so.served_model_name = dir.substr(dir.find_last_of('/') + 1);
    }
    server::Server srv(**engine, tok, so);
    if (Status st = srv.bind(); !st.is_ok()) fail(st);
    std::fprintf(stderr, "sparrow: serving '%s' on http://%s:%d\n", so.served_model_name.c_str(), so.host.c_str(), srv.port());
    std::thread http([&srv] { srv.run(); });
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "sparrow: %s: shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    srv.stop();
    http.join();
    (*engine)->shutdown(/*finish=*/false);
    std::fprintf(stderr, "sparrow: stopped\n");
  });
}

}  // namespace sparrow::app
