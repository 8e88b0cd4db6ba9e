// The OpenAI-compatible HTTP server (cpp-httplib): /v1/chat/completions, /v1/completions,
// /v1/models, /health, /metrics. It sees only the engine API and the tokenizer.
//
// Threading: httplib runs each connection on a pool thread; a request's tokens arrive from the
// engine thread through a per-request channel (engine callbacks only append and notify), and the
// handler thread decodes, applies stop strings and writes. A request whose client goes away
// (streamed, or plain and longer than a heartbeat) is cancelled in the engine at once. A connection
// arriving while every HTTP worker is busy gets 503 for generation requests rather than waiting.
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
  // Connections served at once (each holds a thread, a stream or an idle keep-alive included);
  // 0: the engine's max_queue + max_batch + 32, so that its queue limit is what refuses first.
  int http_threads = 0;
};

class Server {
 public:
  // REQUIRES: engine and tokenizer outlive the server; SIGPIPE is ignored (a client that has gone
  // must make a write fail, not kill the process; `sparrow serve` ignores it).
  // The HTTP worker count comes from options.http_threads or, at 0, from engine.options().
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
