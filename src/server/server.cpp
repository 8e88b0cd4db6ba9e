#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/chat_parser.h"

namespace sparrow::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// ---------------------------------------------------------------------------------------------
// Errors in OpenAI's shape.

struct ApiError {
  int http = 400;
  std::string message, type = "invalid_request_error", param, code;
};

ApiError bad_request(std::string param, std::string message, std::string code = "invalid_value") {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json_text(json{{"error", err}});
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  res.set_content(error_body(e), "application/json");
}

// ---------------------------------------------------------------------------------------------
// Connections. httplib hands each accepted connection to a TaskQueue as one job, and that job holds
// its thread until the client closes the connection (keep-alive included). httplib's ThreadPool
// parks connections beyond its threads in an unbounded list, where a request (and /health) waits
// without an answer. This queue runs connections on up to `workers` threads, made on demand; a
// connection that arrives while every one of them is busy goes to a few refusal threads instead,
// which answer generation requests with 503 at once and the cheap GET routes (health, metrics,
// models) as usual. Thread-safety: enqueue is called by httplib's listener thread, shutdown once
// after the listener stops.

thread_local bool t_refusing = false;  // set on refusal threads for their whole life

class ConnectionQueue final : public httplib::TaskQueue {
 public:
  ConnectionQueue(size_t workers, size_t refusal_workers) {
    main_.max = std::max<size_t>(workers, 1);
    refusal_.max = refusal_workers;
    refusal_.refuse = true;
    std::lock_guard<std::mutex> lock(mu_);
    while (refusal_.threads.size() < refusal_.max && spawn(refusal_)) {}
  }
  ~ConnectionQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    // Where refusal threads could not be made at all, the connection waits for a worker as before.
    Lane& lane = has_room(main_) || refusal_.threads.empty() ? main_ : refusal_;
    lane.jobs.push_back(std::move(fn));
    lane.cv.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    for (Lane* l : {&main_, &refusal_}) {
      l->cv.notify_all();
      for (auto& t : l->threads) t.join();
    }
  }

  // True on a refusal thread: the connection arrived while every worker was busy.
  static bool refusing() { return t_refusing; }

 private:
  struct Lane {
    std::deque<std::function<void()>> jobs;
    std::vector<std::thread> threads;
    size_t busy = 0, max = 0;
    bool refuse = false;
    std::condition_variable cv;
  };

  // REQUIRES: mu_ held. True if a thread of `l` is free for one more job (making one if allowed).
  bool has_room(Lane& l) {
    if (l.jobs.size() < l.threads.size() - l.busy) return true;
    return l.threads.size() < l.max && spawn(l);
  }

  // REQUIRES: mu_ held. False when the system refuses another thread.
  bool spawn(Lane& l) {
    try {
      l.threads.emplace_back([this, &l] { work(l); });
    } catch (const std::system_error&) {
      return false;
    }
    return true;
  }

  void work(Lane& l) {
    t_refusing = l.refuse;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        l.cv.wait(lock, [&] { return stopped_ || !l.jobs.empty(); });
        if (l.jobs.empty()) return;  // stopped, and every connection handed over has been served
        fn = std::move(l.jobs.front());
        l.jobs.pop_front();
        ++l.busy;
      }
      fn();
      std::lock_guard<std::mutex> lock(mu_);
      --l.busy;
    }
  }

  std::mutex mu_;
  Lane main_, refusal_;  // guarded by mu_ (the threads vectors grow only under it)
  bool stopped_ = false;  // guarded by mu_
};

// Refusal threads: 503s and GETs are quick, and a refused client is asked to close its connection.
constexpr size_t kRefusalThreads = 8;
// Default worker count beyond the engine's capacity (max_queue + max_batch): /health and /metrics
// probes and idle keep-alive connections, so the engine's queue limit is what refuses first.
constexpr int64_t kSpareConnections = 32;
// A plain (non-streamed) response that is not ready within this long is sent as chunks, one space
// per interval until the JSON is ready (JSON allows leading whitespace): a client that has gone
// fails a write, which cancels its request. It is also the wait before the first heartbeat.
constexpr std::chrono::milliseconds kHeartbeat{200};

// ---------------------------------------------------------------------------------------------
// Metrics.

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  void write(std::ostringstream& o, const char* name, const char* help) const {
    std::lock_guard<std::mutex> lock(mu_);
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      o << name << "_bucket{le=\"" << bounds_[i] << "\"} " << cum << '\n';
    }
    o << name << "_bucket{le=\"+Inf\"} " << count_ << '\n' << name << "_sum " << sum_ << '\n'
      << name << "_count " << count_ << '\n';
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Metrics {
  Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  std::atomic<uint64_t> requests{0}, errors{0}, cancelled{0}, plain_aborted{0}, refused{0};
  std::atomic<int64_t> active_streams{0}, active_plain{0};  // chunked responses being written
};

int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, rss = 0;
  f >> pages >> rss;
  return rss * sysconf(_SC_PAGESIZE);
}

// ---------------------------------------------------------------------------------------------
// One request's tokens, from the engine thread to the handler thread.

struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kStop;
  Status status;
  int64_t prompt_tokens = 0;
  Clock::time_point last_token;
  bool have_token = false;
};

// Stop strings: text is released only once no stop string can start inside it, so streamed and
// plain responses cut at the same byte.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Returns the text safe to emit; sets hit() once a stop string is found (the rest is dropped).
  std::string push(std::string_view s) {
    if (hit_) return {};
    held_ += s;
    size_t first = std::string::npos;
    for (const auto& st : stops_) first = std::min(first, held_.find(st));
    if (first != std::string::npos) {
      hit_ = true;
      std::string out = held_.substr(0, first);
      held_.clear();
      return out;
    }
    size_t keep = 0;
    for (const auto& st : stops_) {
      for (size_t k = std::min(st.size() - 1, held_.size()); k > keep; --k) {
        if (held_.compare(held_.size() - k, k, st, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  std::string flush() { return hit_ ? std::string() : std::exchange(held_, {}); }
  bool hit() const { return hit_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool hit_ = false;
};

// The parsed, validated request (both routes).
struct Job {
  bool chat = true;
  bool stream = false, include_usage = false;
  ThinkingMode mode = ThinkingMode::kChat;  // chat: where the reply starts (reasoning or content)
  GenerationRequest gen;
  std::vector<std::string> stops;
};

// Drives one enqueued request: waits for tokens, decodes and applies stop strings.
class Generation {
 public:
  Generation(Engine& engine, const Tokenizer& tok, std::shared_ptr<Channel> ch, uint64_t id, std::vector<std::string> stops)
      : engine_(engine), ch_(std::move(ch)), id_(id), decoder_(tok, /*skip_special_tokens=*/true), stop_(std::move(stops)) {}

  // Waits up to `wait` for progress; appends new text to `delta`. Returns true once finished.
  bool poll(std::string& delta, std::chrono::milliseconds wait) {
    if (done_) return true;
    std::vector<int32_t> tokens;
    bool finished = false;
    {
      std::unique_lock<std::mutex> lock(ch_->mu);
      ch_->cv.wait_for(lock, wait, [&] { return !ch_->tokens.empty() || ch_->finished; });
      tokens.swap(ch_->tokens);
      finished = ch_->finished;
      if (finished) {
        reason_ = ch_->reason;
        status_ = ch_->status;
      }
      prompt_tokens_ = ch_->prompt_tokens;
    }
    for (int32_t t : tokens) {
      ++completion_tokens_;
      delta += stop_.push(decoder_.push(t));
      if (stop_.hit()) {
        engine_.cancel(id_);  // the engine may still be decoding; its further tokens are dropped
        done_ = true;
        reason_ = FinishReason::kStop;
        return true;
      }
    }
    if (finished) {
      delta += stop_.push(decoder_.finish());
      if (!stop_.hit()) delta += stop_.flush();
      if (stop_.hit()) reason_ = FinishReason::kStop;
      done_ = true;
    }
    return done_;
  }
  uint64_t id() const { return id_; }
  bool done() const { return done_; }
  const Status& status() const { return status_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  // OpenAI has no "cancelled": a request ended by shutdown reports "abort" (as vLLM does).
  const char* finish_reason() const { return reason_ == FinishReason::kCancelled ? "abort" : finish_reason_name(reason_); }
  json usage() const {
    return {{"prompt_tokens", prompt_tokens_}, {"completion_tokens", completion_tokens_},
            {"total_tokens", prompt_tokens_ + completion_tokens_}};
  }

 private:
  Engine& engine_;
  std::shared_ptr<Channel> ch_;
  uint64_t id_;
  StreamDecoder decoder_;
  StopMatcher stop_;
  bool done_ = false;
  FinishReason reason_ = FinishReason::kStop;
  Status status_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Request parsing. Every failure names the field.

std::optional<ApiError> get_number(const json& body, const char* key, double lo, double hi, std::optional<double>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad_request(key, std::string(key) + ": expected a number", "invalid_type");
  double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    return bad_request(key, std::string(key) + ": must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + it->dump());
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& body, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    // 16.0 is accepted as 16, as Python clients may send it.
    if (it->is_number_float() && it->get<double>() == static_cast<double>(static_cast<int64_t>(it->get<double>())) &&
        std::abs(it->get<double>()) < 9e15) {
      out = static_cast<int64_t>(it->get<double>());
    } else {
      return bad_request(key, std::string(key) + ": expected an integer", "invalid_type");
    }
  } else if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    out = INT64_MAX;
  } else {
    out = it->get<int64_t>();
  }
  if (*out < lo || *out > hi)
    return bad_request(key, std::string(key) + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + it->dump());
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& body, const char* key, bool& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad_request(key, std::string(key) + ": expected a boolean", "invalid_type");
  out = it->get<bool>();
  return std::nullopt;
}

// The text of a message's `content`: a string, null, or an array of {"type":"text","text":...}.
std::optional<ApiError> content_text(const json& c, const std::string& param, std::string& out) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return bad_request(param, param + ": expected a string or an array of text parts", "invalid_type");
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || p["type"] != "text" || !p.contains("text") || !p["text"].is_string())
      return bad_request(pp, pp + ": only {\"type\": \"text\", \"text\": string} parts are supported", "invalid_type");
    out += p["text"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Server::Impl {
  Engine& engine;
  const Tokenizer& tok;
  ServerOptions opt;
  httplib::Server http;
  Metrics metrics;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_id{1};
  int port = 0;
  int64_t created = 0;
  int64_t http_workers = 0;  // opt.http_threads, or sized from the engine's capacity

  Impl(Engine& e, const Tokenizer& t, ServerOptions o) : engine(e), tok(t), opt(std::move(o)) {
    http_workers = opt.http_threads > 0 ? opt.http_threads
                                        : engine.options().max_queue + engine.options().max_batch + kSpareConnections;
    created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  std::string new_id(const char* prefix) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s-%016llx", prefix, static_cast<unsigned long long>(next_id.fetch_add(1)));
    return buf;
  }

  // Fields common to both routes; `prompt_param` names the field a too-long prompt is blamed on.
  std::optional<ApiError> check_model(const json& body) {
    if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
      if (!it->is_string()) return bad_request("model", "model: expected a string", "invalid_type");
      if (it->get<std::string>() != opt.served_model_name)
        return ApiError{404, "The model '" + it->get<std::string>() + "' does not exist (this server serves '" + opt.served_model_name + "')",
                        "invalid_request_error", "model", "model_not_found"};
    }
    return std::nullopt;
  }

  std::optional<ApiError> parse_common(const json& body, Job& job, const char* prompt_param) {
    std::optional<int64_t> n, max_tokens, max_completion, top_k, seed;
    std::optional<double> temperature, top_p;
    if (auto e = get_int(body, "n", 1, INT64_MAX, n)) return e;
    if (n && *n != 1) return bad_request("n", "n: only n=1 is supported");
    if (auto e = get_int(body, "max_tokens", 1, INT64_MAX, max_tokens)) return e;
    if (auto e = get_int(body, "max_completion_tokens", 1, INT64_MAX, max_completion)) return e;
    if (max_completion) max_tokens = max_completion;
    if (auto e = get_number(body, "temperature", 0, 2, temperature)) return e;
    if (auto e = get_number(body, "top_p", 0, 1, top_p)) return e;
    if (top_p && *top_p <= 0) return bad_request("top_p", "top_p: must be in (0, 1]");
    if (auto e = get_int(body, "top_k", -1, INT32_MAX, top_k)) return e;
    if (auto e = get_int(body, "seed", INT64_MIN, INT64_MAX, seed)) return e;
    if (auto e = get_bool(body, "stream", job.stream)) return e;
    bool ignore_eos = false;  // vLLM's extension: generate max_tokens tokens (benchmarks, tests)
    if (auto e = get_bool(body, "ignore_eos", ignore_eos)) return e;
    if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
      if (!it->is_object()) return bad_request("stream_options", "stream_options: expected an object", "invalid_type");
      if (auto e = get_bool(*it, "include_usage", job.include_usage)) {
        e->param = "stream_options.include_usage";
        return e;
      }
    }
    if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
      if (it->is_string()) {
        job.stops.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const auto& s : *it) {
          if (!s.is_string()) return bad_request("stop", "stop: expected a string or an array of strings", "invalid_type");
          job.stops.push_back(s.get<std::string>());
        }
      } else {
        return bad_request("stop", "stop: expected a string or an array of strings", "invalid_type");
      }
      std::erase_if(job.stops, [](const std::string& s) { return s.empty(); });
    }

    const int64_t prompt = static_cast<int64_t>(job.gen.prompt.size());
    if (prompt >= opt.max_context)
      return bad_request(prompt_param, std::string(prompt_param) + ": the prompt has " + std::to_string(prompt) +
                         " tokens; the context is " + std::to_string(opt.max_context) + " (prompt + max_tokens)",
                         "context_length_exceeded");
    const int64_t room = opt.max_context - prompt;
    if (max_tokens && *max_tokens > room)
      return bad_request(max_completion ? "max_completion_tokens" : "max_tokens",
                         std::string(max_completion ? "max_completion_tokens" : "max_tokens") + ": " + std::to_string(*max_tokens) +
                         " plus the prompt's " + std::to_string(prompt) + " tokens exceed the context of " + std::to_string(opt.max_context),
                         "context_length_exceeded");
    job.gen.max_tokens = max_tokens.value_or(room);
    job.gen.sampling.temperature = temperature.value_or(1.0);
    job.gen.sampling.top_p = top_p.value_or(1.0);
    job.gen.sampling.top_k = top_k && *top_k > 0 ? *top_k : 0;
    job.gen.sampling.seed = seed ? static_cast<uint64_t>(*seed) : std::random_device{}();
    if (!ignore_eos) {
      if (auto eos = tok.eos_id()) job.gen.stop_tokens.push_back(*eos);
      else if (engine.eos_token_id() >= 0) job.gen.stop_tokens.push_back(static_cast<int32_t>(engine.eos_token_id()));
    }
    return std::nullopt;
  }

  std::optional<ApiError> parse_chat(const json& body, Job& job) {
    job.chat = true;
    auto it = body.find("messages");
    if (it == body.end() || it->is_null()) return bad_request("messages", "messages: this field is required", "missing_required_parameter");
    if (!it->is_array()) return bad_request("messages", "messages: expected an array", "invalid_type");
    if (it->empty()) return bad_request("messages", "messages: at least one message is required");
    // Types are checked here so each 400 names its field; the encoder then reads the whole request
    // (tools, response_format, tool calls, reasoning) as the tokenizer's chat encoding defines it.
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return bad_request(p, p + ": expected an object", "invalid_type");
      if (!m.contains("role") || !m["role"].is_string()) return bad_request(p + ".role", p + ".role: expected a string", "invalid_type");
      static const std::array<std::string_view, 6> kRoles = {"system", "developer", "user", "assistant", "tool", "latest_reminder"};
      const std::string role = m["role"].get<std::string>();
      if (std::find(kRoles.begin(), kRoles.end(), role) == kRoles.end())
        return bad_request(p + ".role", p + ".role: unknown role '" + role + "'");
      std::string text;
      if (m.contains("content"))
        if (auto e = content_text(m["content"], p + ".content", text)) return e;
    }
    bool thinking = false;
    if (auto e = get_bool(body, "thinking", thinking)) return e;
    if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && kw->is_object())
      if (auto e = get_bool(*kw, "thinking", thinking)) return e;
    ChatEncodeOptions eo;
    eo.mode = job.mode = thinking ? ThinkingMode::kThinking : ThinkingMode::kChat;
    if (auto re = body.find("reasoning_effort"); re != body.end() && !re->is_null()) {
      if (!re->is_string()) return bad_request("reasoning_effort", "reasoning_effort: expected a string", "invalid_type");
      const std::string v = re->get<std::string>();
      if (v == "high") eo.effort = ReasoningEffort::kHigh;
      else if (v == "max") eo.effort = ReasoningEffort::kMax;
      else if (v != "low" && v != "medium" && v != "default")
        return bad_request("reasoning_effort", "reasoning_effort: expected low, medium, high or max");
    }
    auto msgs = chat_messages_from_json(json_text(body));
    if (!msgs.is_ok()) return bad_request("messages", "messages: " + msgs.status().message());
    auto text = dsv4_encode_chat(*msgs, eo);
    if (!text.is_ok()) return bad_request("messages", "messages: " + text.status().message());
    auto ids = tok.encode(*text, /*add_special_tokens=*/false);
    if (!ids.is_ok()) return bad_request("messages", "messages: " + ids.status().message());
    job.gen.prompt = std::move(*ids);
    return parse_common(body, job, "messages");
  }

  std::optional<ApiError> parse_completion(const json& body, Job& job) {
    job.chat = false;
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return bad_request("prompt", "prompt: this field is required", "missing_required_parameter");
    if (it->is_string()) {
      auto ids = tok.encode(it->get<std::string>(), /*add_special_tokens=*/true);
      if (!ids.is_ok()) return bad_request("prompt", "prompt: " + ids.status().message());
      job.gen.prompt = std::move(*ids);
    } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
      auto ids = tok.encode((*it)[0].get<std::string>(), true);
      if (!ids.is_ok()) return bad_request("prompt", "prompt: " + ids.status().message());
      job.gen.prompt = std::move(*ids);
    } else if (it->is_array()) {
      const int64_t vocab = engine.vocab_size();
      for (size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
          return bad_request("prompt", "prompt[" + std::to_string(i) + "]: expected a token id in [0, " + std::to_string(vocab) + ")");
        job.gen.prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else {
      return bad_request("prompt", "prompt: expected a string or an array of token ids", "invalid_type");
    }
    if (job.gen.prompt.empty()) return bad_request("prompt", "prompt: encodes to no tokens");
    return parse_common(body, job, "prompt");
  }

  // Queues `job`; on success `gen` is ready to poll.
  std::optional<ApiError> start(Job& job, std::shared_ptr<Generation>& gen) {
    auto ch = std::make_shared<Channel>();
    Metrics* m = &metrics;
    auto id = engine.enqueue(job.gen, [ch, m](const GenerationEvent& ev) {
      const auto now = Clock::now();
      if (ev.time_to_first_token_s > 0) m->ttft.observe(ev.time_to_first_token_s);
      std::lock_guard<std::mutex> lock(ch->mu);
      if (!ev.tokens.empty()) {
        if (ch->have_token) {
          const double dt = std::chrono::duration<double>(now - ch->last_token).count() / ev.tokens.size();
          for (size_t i = 0; i < ev.tokens.size(); ++i) m->itl.observe(dt);
        }
        ch->have_token = true;
        ch->last_token = now;
        ch->tokens.insert(ch->tokens.end(), ev.tokens.begin(), ev.tokens.end());
      }
      ch->prompt_tokens = ev.prompt_tokens;
      if (ev.finished) {
        ch->finished = true;
        ch->reason = ev.reason;
        ch->status = ev.status;
      }
      ch->cv.notify_all();
    });
    if (!id.is_ok()) {
      const Status& s = id.status();
      if (s.code() == StatusCode::kUnavailable) return ApiError{503, s.message(), "server_error", "", "unavailable"};
      const std::string& msg = s.message();
      std::string param = msg.substr(0, msg.find(':'));
      if (param == "prompt" && job.chat) param = "messages";
      return bad_request(param.size() < msg.size() ? param : "", msg);
    }
    gen = std::make_shared<Generation>(engine, tok, ch, *id, job.stops);
    return std::nullopt;
  }

  // OpenAI's tool_calls entries; `first` numbers them across a stream.
  static json tool_calls_json(const std::vector<ToolCall>& calls, const std::string& rid, size_t first) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string id = calls[i].id.empty() ? "call_" + rid.substr(rid.find('-') + 1) + "_" + std::to_string(first + i) : calls[i].id;
      out.push_back({{"index", first + i}, {"id", id}, {"type", "function"},
                     {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
    }
    return out;
  }

  // "stop" becomes "tool_calls" when the reply called tools, as OpenAI reports it.
  static std::string finish_name(const Generation& gen, bool called_tools) {
    const std::string r = gen.finish_reason();
    return r == "stop" && called_tools ? "tool_calls" : r;
  }

  json chunk_json(const Job& job, const std::string& rid, json choices) {
    return {{"id", rid}, {"object", job.chat ? "chat.completion.chunk" : "text_completion"}, {"created", now_s()},
            {"model", opt.served_model_name}, {"choices", std::move(choices)}};
  }

  static int64_t now_s() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  // The body of a finished plain (non-streamed) request, with its HTTP status.
  std::pair<int, std::string> plain_reply(const Job& job, const Generation& gen, const std::string& text, const std::string& rid) {
    if (!gen.status().is_ok()) {
      const ApiError e{500, gen.status().message(), "server_error", "", "internal_error"};
      return {e.http, error_body(e)};
    }
    json choice;
    if (job.chat) {
      // The same parser as the stream, fed the whole text: streamed and plain replies agree.
      const ChatDelta d = dsv4_parse_output(text, job.mode);
      json msg = {{"role", "assistant"}, {"content", d.content}};
      if (!d.reasoning.empty()) msg["reasoning_content"] = d.reasoning;
      if (!d.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(d.tool_calls, rid, 0);
      choice = {{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_name(gen, !d.tool_calls.empty())}};
    } else {
      choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", gen.finish_reason()}};
    }
    json out = {{"id", rid}, {"object", job.chat ? "chat.completion" : "text_completion"}, {"created", now_s()},
                {"model", opt.served_model_name}, {"choices", json::array({choice})},
                {"usage", gen.usage()}};
    return {200, json_text(out)};
  }

  // Polls `gen` into `text` until it finishes or `deadline` passes; true once finished.
  static bool poll_until(Generation& gen, std::string& text, Clock::time_point deadline) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (gen.poll(text, std::max(left, std::chrono::milliseconds(0)))) return true;
      if (Clock::now() >= deadline) return false;
    }
  }

  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    ++metrics.requests;
    if (ConnectionQueue::refusing()) {
      // Every HTTP worker holds a connection: refuse now rather than park the request unanswered.
      ++metrics.errors;
      ++metrics.refused;
      res.set_header("Retry-After", "1");
      send_error(res, ApiError{503, "the server is at its connection limit (" + std::to_string(http_workers) + " HTTP workers busy); retry later",
                               "server_error", "", "unavailable"});
      return;
    }
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    Job job;
    std::optional<ApiError> err;
    if (body.is_discarded()) {
      err = bad_request("", "the request body is not valid JSON (or not valid UTF-8)", "invalid_json");
    } else if (!body.is_object()) {
      err = bad_request("", "the request body must be a JSON object", "invalid_type");
    } else {
      err = check_model(body);
      if (!err) err = chat ? parse_chat(body, job) : parse_completion(body, job);
    }
    std::shared_ptr<Generation> gen;
    if (!err) err = start(job, gen);
    if (err) {
      ++metrics.errors;
      send_error(res, *err);
      return;
    }
    const std::string rid = new_id(chat ? "chatcmpl" : "cmpl");
    if (!job.stream) {
      // Every 4xx/503 is decided above, before anything is written. A request that ends within one
      // heartbeat gets an ordinary response (its status, 500 included, is exact); a longer one is
      // sent chunked with heartbeats so that a client that leaves cancels it (httplib 0.11 tells a
      // handler nothing about its connection, only a failed write does).
      struct Plain {
        std::string text;
        bool sent = false;
      };
      auto plain = std::make_shared<Plain>();
      if (poll_until(*gen, plain->text, Clock::now() + kHeartbeat)) {
        auto [status, text] = plain_reply(job, *gen, plain->text, rid);
        if (status != 200) ++metrics.errors;
        res.status = status;
        res.set_content(text, "application/json");
        return;
      }
      ++metrics.active_plain;
      Engine* eng = &engine;
      Metrics* m = &metrics;
      res.set_chunked_content_provider(
          "application/json",
          [this, gen, plain, job, rid](size_t, httplib::DataSink& sink) {
            if (!poll_until(*gen, plain->text, Clock::now() + kHeartbeat)) return sink.write(" ", 1);
            // The status line (200) is out already: an engine error can only be reported in the body.
            auto [status, text] = plain_reply(job, *gen, plain->text, rid);
            if (status != 200) ++metrics.errors;
            if (!sink.write(text.data(), text.size())) return false;
            plain->sent = true;
            sink.done();
            return true;
          },
          [eng, gen, plain, m](bool) {
            // Runs when the response is destroyed: a client that left frees its state now.
            if (!plain->sent) ++m->plain_aborted;
            eng->cancel(gen->id());
            --m->active_plain;
          });
      return;
    }

    ++metrics.active_streams;
    struct StreamState {
      bool sent_role = false, sent_final = false;
      Dsv4OutputParser parser;
      size_t tool_calls = 0;
      explicit StreamState(ThinkingMode mode) : parser(mode) {}
    };
    auto st = std::make_shared<StreamState>(job.mode);
    Engine* eng = &engine;
    Metrics* m = &metrics;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, gen, st, job, rid](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string s = "data: " + json_text(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          if (!st->sent_role && job.chat) {
            st->sent_role = true;
            json delta = {{"role", "assistant"}, {"content", ""}};
            if (!send(chunk_json(job, rid, json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}}))))
              return false;
          }
          std::string text;
          const bool done = gen->poll(text, std::chrono::milliseconds(200));
          bool sent = false;
          if (job.chat) {
            ChatDelta d = st->parser.push(text);
            if (done) {
              ChatDelta tail = st->parser.finish();
              d.content += tail.content;
              d.reasoning += tail.reasoning;
              d.tool_calls.insert(d.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
            }
            if (!d.empty()) {
              json delta = json::object();
              if (!d.content.empty()) delta["content"] = d.content;
              if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
              if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, rid, st->tool_calls);
              st->tool_calls += d.tool_calls.size();
              json c = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
              if (!send(chunk_json(job, rid, json::array({c})))) return false;
              sent = true;
            }
          } else if (!text.empty()) {
            json c = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
            if (!send(chunk_json(job, rid, json::array({c})))) return false;
            sent = true;
          }
          if (!sent && !done && !sink.is_writable()) return false;
          if (!done) return true;
          json c = job.chat ? json{{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", finish_name(*gen, st->tool_calls > 0)}}
                            : json{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", gen->finish_reason()}};
          json last = chunk_json(job, rid, json::array({c}));
          if (!send(last)) return false;
          if (job.include_usage) {
            json u = chunk_json(job, rid, json::array());
            u["usage"] = gen->usage();
            if (!send(u)) return false;
          }
          static constexpr char kDone[] = "data: [DONE]\n\n";
          if (!sink.write(kDone, sizeof kDone - 1)) return false;
          st->sent_final = true;
          sink.done();
          return true;
        },
        [eng, gen, st, m](bool) {
          // Runs when the response is destroyed: a client that left mid-stream frees its state now.
          if (!st->sent_final) ++m->cancelled;
          eng->cancel(gen->id());
          --m->active_streams;
        });
  }

  std::string metrics_text() {
    const EngineStats s = engine.stats();
    std::ostringstream o;
    auto gauge = [&](const char* name, const char* type, const char* help, double v) {
      o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << v << '\n';
    };
    gauge("sparrow_queue_length", "gauge", "Requests waiting for admission", static_cast<double>(s.queued));
    gauge("sparrow_running_requests", "gauge", "Requests prefilling or decoding", static_cast<double>(s.running));
    gauge("sparrow_prompt_tokens_total", "counter", "Prompt tokens processed", static_cast<double>(s.tokens_in));
    gauge("sparrow_generation_tokens_total", "counter", "Tokens generated", static_cast<double>(s.tokens_out));
    gauge("sparrow_requests_finished_total", "counter", "Requests the engine finished", static_cast<double>(s.requests_finished));
    gauge("sparrow_http_requests_total", "counter", "Generation requests received", static_cast<double>(metrics.requests.load()));
    gauge("sparrow_http_errors_total", "counter", "Generation requests answered with an error", static_cast<double>(metrics.errors.load()));
    gauge("sparrow_http_streams_aborted_total", "counter", "Streams that ended before their last chunk (client gone)",
          static_cast<double>(metrics.cancelled.load()));
    gauge("sparrow_http_active_streams", "gauge", "Streams being written", static_cast<double>(metrics.active_streams.load()));
    gauge("sparrow_http_plain_aborted_total", "counter", "Plain (non-streamed) requests whose client left before the reply",
          static_cast<double>(metrics.plain_aborted.load()));
    gauge("sparrow_http_refused_total", "counter", "Generation requests refused with 503 because every HTTP worker was busy",
          static_cast<double>(metrics.refused.load()));
    gauge("sparrow_decode_state_bytes", "gauge", "Decode state reserved by running requests", static_cast<double>(s.state_bytes));
    gauge("sparrow_resident_memory_bytes", "gauge", "Resident set size of the process", static_cast<double>(resident_bytes()));
    metrics.ttft.write(o, "sparrow_time_to_first_token_seconds", "Time from arrival to the first generated token");
    metrics.itl.write(o, "sparrow_inter_token_latency_seconds", "Time between consecutive generated tokens");
    return o.str();
  }

  void routes() {
    http.new_task_queue = [n = http_workers] { return new ConnectionQueue(static_cast<size_t>(n), kRefusalThreads); };
    http.set_payload_max_length(size_t{16} << 20);
    http.set_keep_alive_max_count(1000);
    http.set_tcp_nodelay(true);  // SSE chunks are small: without it each waits for the delayed ACK
    http.set_post_routing_handler([](const httplib::Request&, httplib::Response& r) {
      // A connection on a refusal thread would keep refusing for its keep-alive life: end it.
      if (ConnectionQueue::refusing()) r.set_header("Connection", "close");
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, true); });
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, false); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      json model = {{"id", opt.served_model_name}, {"object", "model"}, {"created", created}, {"owned_by", "sparrow"},
                    {"max_model_len", opt.max_context}};
      r.set_content(json_text(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
      r.status = stopping ? 503 : 200;
      r.set_content(stopping ? R"({"status":"shutting down"})" : R"({"status":"ok"})", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    http.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      if (r.status == 404) send_error(r, ApiError{404, "no route " + q.method + " " + q.path, "invalid_request_error", "", "not_found"});
      else if (r.status == 413) send_error(r, ApiError{413, "the request body is too large", "invalid_request_error", "", "too_large"});
      else send_error(r, ApiError{r.status, "HTTP error " + std::to_string(r.status), "invalid_request_error", "", ""});
    });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      ++metrics.errors;
      send_error(r, ApiError{500, what, "server_error", "", "internal_error"});
    });
  }
};

Server::Server(Engine& engine, const Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {
  impl_->routes();
}

Server::~Server() = default;

Status Server::bind() {
  auto& i = *impl_;
  if (i.opt.port == 0) {
    i.port = i.http.bind_to_any_port(i.opt.host.c_str());
    if (i.port <= 0) return Status::io_error("cannot listen on " + i.opt.host + " (any port)");
  } else {
    if (!i.http.bind_to_port(i.opt.host.c_str(), i.opt.port))
      return Status::io_error("cannot listen on " + i.opt.host + ":" + std::to_string(i.opt.port) + " (in use, or a bad address)");
    i.port = i.opt.port;
  }
  return Status::ok();
}

int Server::port() const { return impl_->port; }

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop(double drain_s) {
  auto& i = *impl_;
  i.stopping = true;
  i.engine.shutdown(/*finish=*/false);  // in-flight requests end with "abort"; new ones get 503
  const auto deadline = Clock::now() + std::chrono::duration<double>(drain_s);
  while (i.metrics.active_streams.load() + i.metrics.active_plain.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double drained = std::chrono::duration<double>(Clock::now() - deadline).count() + drain_s;
  std::fprintf(stderr, "sparrow: in-flight requests cancelled, streams drained in %.2f s\n", drained);
  i.http.stop();
}

}  // namespace sparrow::server
