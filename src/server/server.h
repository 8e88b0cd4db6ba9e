// The OpenAI-compatible HTTP server (cpp-httplib): /v1/chat/completions, /v1/completions,
// /v1/models, /health, /metrics. It sees only the engine API and the tokenizer.
//
// Threading: httplib runs each connection on a pool thread; a request's tokens arrive from the
// engine thread through a per-request channel (engine callbacks only append and notify), and the
// handler thread decodes, applies stop strings and writes. A stream whose client goes away is
// cancelled in the engine at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sparrow/engine.h"
#include "sparrow/status.h"
#include "tokenizer/tokenizer.h"

namespace sparrow::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: any free port (see Server::port())
  std::string served_model_name = "sparrow";
  int64_t max_context = 4096;         // the engine's max_context: prompt + max_tokens
  int http_threads = 128;             // connections served at once (a stream holds one)
};

class Server {
 public:
  // REQUIRES: engine and tokenizer outlive the server.
  Server(Engine& engine, const Tokenizer& tokenizer, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  Status bind();     // listens on host:port; errors name the address
  int port() const;  // the bound port
  void run();        // serves until stop(); REQUIRES: bind() succeeded
  // Graceful stop: /health turns 503, the engine cancels everything in flight (streams end with
  // their final chunk), streams get up to `drain_s` to finish, then the listener closes.
  void stop(double drain_s = 5.0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparrow::server
