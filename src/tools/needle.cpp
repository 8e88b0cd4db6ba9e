#include "tools/needle.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>

#include <nlohmann/json.hpp>

#include "runtime/session.h"

namespace sparrow {
namespace {

// needle_prompts.py's constants (version 1).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr int kNeedles = 4;

int64_t needle_bytes(NeedleFormat f) { return f == NeedleFormat::kValueKey ? 6 : 7; }  // "[ddd K]" / "[K ddd K]"

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    state_ += kGolden;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

// Shortest text that reads back as `v` (what Python's repr gives, up to exponent style).
std::string double_text(double v) {
  std::array<char, 32> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  std::string s(buf.data(), end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

const char* needle_format_name(NeedleFormat f) { return f == NeedleFormat::kValueKey ? "vk" : "kvk"; }

Expected<NeedleFormat> needle_format_parse(std::string_view name) {
  if (name == "vk") return NeedleFormat::kValueKey;
  if (name == "kvk") return NeedleFormat::kKeyValueKey;
  return Status::invalid_argument("unknown needle format '" + std::string(name) + "' (expected vk or kvk)");
}

Expected<NeedleFormat> needle_format_of_model(const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / "training_summary.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NeedleFormat::kValueKey;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error("cannot read " + path.string());
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(path.string() + " is not a JSON object");
  const auto args = j.find("args");
  if (args == j.end() || !args->is_object()) return NeedleFormat::kValueKey;
  const auto fmt = args->find("needle_format");
  if (fmt == args->end()) return NeedleFormat::kValueKey;
  if (!fmt->is_string()) return Status::invalid_argument(path.string() + ": args.needle_format is not a string");
  auto parsed = needle_format_parse(fmt->get<std::string>());
  if (!parsed.is_ok()) return Status::invalid_argument(path.string() + ": " + parsed.status().message());
  return parsed;
}

Expected<NeedlePrompt> needle_prompt_make(uint64_t seed, int64_t length, int64_t trial, int64_t trials,
                                          NeedleFormat format) {
  const int64_t kNeedleBytes = needle_bytes(format);
  if (length < kNeedleMinLength)
    return Status::invalid_argument("needle prompts need length >= " + std::to_string(kNeedleMinLength) + ", got " +
                                    std::to_string(length));
  if (trials < 1 || trial < 0 || trial >= trials)
    return Status::invalid_argument("needle trial " + std::to_string(trial) + " is outside [0, " +
                                    std::to_string(trials) + ")");
  SplitMix64 rng(seed * kGolden + static_cast<uint64_t>(length) * 0xBF58476D1CE4E5B9ull +
                 static_cast<uint64_t>(trial) * 0x94D049BB133111EBull);
  const int64_t hay_len = length - 7;
  std::vector<int32_t> hay;
  hay.reserve(static_cast<size_t>(hay_len));
  const auto full = [&] { return static_cast<int64_t>(hay.size()) >= hay_len; };
  while (!full()) {
    const uint64_t w = 2 + rng.below(7);
    // Every letter is drawn even past the end (the draw order is part of the definition).
    for (uint64_t i = 0; i < w; ++i) {
      if (!full()) hay.push_back(static_cast<int32_t>('a' + rng.below(26)));
    }
    if (!full()) hay.push_back(' ');
  }
  std::vector<int32_t> keys;
  while (static_cast<int>(keys.size()) < kNeedles) {
    const auto k = static_cast<int32_t>('A' + rng.below(26));
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  std::array<std::array<int32_t, kNeedleAnswerLen>, kNeedles> vals{};
  for (auto& v : vals)
    for (int32_t& d : v) d = static_cast<int32_t>('0' + rng.below(10));
  std::array<double, kNeedles> depths{};
  depths[0] = (static_cast<double>(trial) + 0.5) / static_cast<double>(trials);
  for (int j = 1; j < kNeedles; ++j) depths[j] = static_cast<double>(rng.below(1000000)) / 1e6;

  // Raw starts spread over the slots left after reserving a needle and a byte per needle; sorting
  // them and adding that per rank keeps needles apart by at least one filler byte.
  const int64_t slots = hay_len - kNeedles * (kNeedleBytes + 1);
  std::array<int64_t, kNeedles> raw{};
  for (int j = 0; j < kNeedles; ++j) raw[j] = static_cast<int64_t>(depths[j] * static_cast<double>(slots - 1));
  std::array<int, kNeedles> order{};
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return raw[a] != raw[b] ? raw[a] < raw[b] : a < b; });
  std::array<int64_t, kNeedles> starts{};
  for (int r = 0; r < kNeedles; ++r) starts[order[r]] = raw[order[r]] + r * (kNeedleBytes + 1);
  for (int j = 0; j < kNeedles; ++j) {
    int32_t* s = hay.data() + starts[j];
    int64_t i = 0;
    s[i++] = '[';
    if (format == NeedleFormat::kKeyValueKey) s[i++] = keys[j];
    for (int64_t d = 0; d < kNeedleAnswerLen; ++d) s[i++] = vals[j][d];
    s[i++] = keys[j];
    s[i++] = ']';
  }

  NeedlePrompt p;
  p.length = length;
  p.trial = trial;
  p.ids.reserve(static_cast<size_t>(length));
  p.ids.push_back(kNeedleBos);
  p.ids.insert(p.ids.end(), hay.begin(), hay.end());
  p.ids.push_back('?');
  p.ids.push_back(keys[0]);
  p.ids.insert(p.ids.end(), vals[0].begin(), vals[0].end());
  p.ids.push_back('\n');
  p.prompt_len = length - 4;
  for (int32_t d : vals[0]) p.answer.push_back(static_cast<char>(d));
  p.key = static_cast<char>(keys[0]);
  p.needle_pos = 1 + starts[0];
  p.depth = depths[0];
  return p;
}

std::string needle_prompt_json(const NeedlePrompt& p) {
  std::string s = "{\"length\": " + std::to_string(p.length) + ", \"trial\": " + std::to_string(p.trial) +
                  ", \"prompt_len\": " + std::to_string(p.prompt_len) + ", \"answer\": \"" + p.answer +
                  "\", \"key\": \"" + std::string(1, p.key) + "\", \"needle_pos\": " + std::to_string(p.needle_pos) +
                  ", \"depth\": " + double_text(p.depth) + ", \"ids\": [";
  for (size_t i = 0; i < p.ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(p.ids[i]);
  }
  return s + "]}";
}

Status needle_options_check(const NeedleOptions& o, const ModelConfig& c) {
  // The messages name `sparrow needle`'s flags; the model-independent checks come first.
  if (o.lengths.empty()) return Status::invalid_argument("--lengths: no lengths given");
  for (int64_t L : o.lengths)
    if (L < kNeedleMinLength)
      return Status::invalid_argument("--lengths: " + std::to_string(L) + " is below the minimum needle length " +
                                      std::to_string(kNeedleMinLength));
  if (o.trials < 1) return Status::invalid_argument("--trials must be at least 1, got " + std::to_string(o.trials));
  if (o.batch_tokens < 1)
    return Status::invalid_argument("--batch-tokens must be at least 1, got " + std::to_string(o.batch_tokens));
  if (c.vocab_size < kNeedleMinVocab)
    return Status::invalid_argument("the model's vocabulary has " + std::to_string(c.vocab_size) +
                                    " ids; needle prompts need a byte vocabulary with <bos> = 256 (at least " +
                                    std::to_string(kNeedleMinVocab) + " ids)");
  for (int64_t L : o.lengths)
    if (L > c.max_position_embeddings)
      return Status::invalid_argument("--lengths: " + std::to_string(L) + " is above the model's " +
                                      "max_position_embeddings " + std::to_string(c.max_position_embeddings));
  return Status::ok();
}

Expected<std::vector<NeedleLengthResult>> needle_recall(const Model& model, Backend& backend, const NeedleOptions& o,
                                                        const NeedleProgressFn& progress) {
  const ModelConfig& c = model.config();
  SPARROW_RETURN_IF_ERROR(model.check_backend(backend));
  SPARROW_RETURN_IF_ERROR(needle_options_check(o, c));
  const int64_t V = c.vocab_size;
  std::vector<NeedleLengthResult> out;
  for (int64_t L : o.lengths) {
    const auto t0 = std::chrono::steady_clock::now();
    NeedleLengthResult res;
    res.length = L;
    res.trials = o.trials;
    const int64_t prompt_len = L - 4;
    const int64_t per_batch = std::clamp<int64_t>(o.batch_tokens / prompt_len, 1, o.trials);
    const int64_t chunk = std::min(prompt_len, o.batch_tokens);
    for (int64_t first = 0; first < o.trials; first += per_batch) {
      const int64_t B = std::min(per_batch, o.trials - first);
      std::vector<NeedlePrompt> prompts;
      std::vector<std::unique_ptr<SequenceState>> states;
      for (int64_t b = 0; b < B; ++b) {
        SPARROW_ASSIGN_OR_RETURN(NeedlePrompt p, needle_prompt_make(o.seed, L, first + b, o.trials, o.format));
        prompts.push_back(std::move(p));
        states.push_back(backend.create_sequence_state(c));
      }
      // predicted[b]: the greedy ids so far; next[b]: what sequence b is fed next.
      std::vector<std::vector<int32_t>> predicted(static_cast<size_t>(B));
      std::vector<std::vector<int32_t>> next(static_cast<size_t>(B));
      int64_t fed = 0;
      while (static_cast<int64_t>(predicted[0].size()) < kNeedleAnswerLen) {
        const bool prefill = fed < prompt_len;
        const int64_t n = prefill ? std::min(chunk, prompt_len - fed) : 1;
        std::vector<SequenceChunk> chunks;
        for (int64_t b = 0; b < B; ++b)
          chunks.push_back({states[b].get(), prefill ? prompts[b].prompt().subspan(fed, n)
                                                     : std::span<const int32_t>(next[b])});
        BatchInfo batch = batch_build(chunks);
        std::vector<int64_t> last_rows;
        for (int64_t b = 0; b < B; ++b) last_rows.push_back(batch.seq_end[b] - 1);
        const Tensor logits = model.forward(backend, batch, {.logits_rows = &last_rows});
        for (int64_t b = 0; b < B; ++b) states[b]->advance(n);
        if (prefill) fed += n;
        if (fed < prompt_len) continue;  // more prompt to feed
        // The greedy ids where the logits are (Backend::argmax_rows: ties to the lower id).
        SPARROW_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, download_token_ids(backend, backend.argmax_rows(logits), V));
        for (int64_t b = 0; b < B; ++b) {
          const int32_t best = ids.at(b);
          predicted[b].push_back(best);
          next[b].assign(1, best);
        }
      }
      for (int64_t b = 0; b < B; ++b) {
        NeedleTrial t;
        t.trial = prompts[b].trial;
        t.answer = prompts[b].answer;
        t.key = prompts[b].key;
        t.predicted = predicted[b];
        for (int64_t d = 0; d < kNeedleAnswerLen; ++d)
          t.digits_right += t.predicted[d] == static_cast<unsigned char>(t.answer[d]) ? 1 : 0;
        t.hit = t.digits_right == kNeedleAnswerLen;
        res.hits += t.hit ? 1 : 0;
        res.digits_right += t.digits_right;
        res.per_trial.push_back(std::move(t));
      }
      if (progress) progress(L, first + B, o.trials, res.hits);
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(std::move(res));
  }
  return out;
}

std::string needle_table_text(const std::vector<NeedleLengthResult>& rows) {
  std::string s = "length  recall@1  hits/trials  digit_acc   seconds\n";
  char line[128];
  for (const NeedleLengthResult& r : rows) {
    const std::string ht = std::to_string(r.hits) + "/" + std::to_string(r.trials);
    std::snprintf(line, sizeof line, "%6lld  %8.3f  %11s  %9.3f  %8.2f\n", static_cast<long long>(r.length), r.recall(),
                  ht.c_str(), r.digit_acc(), r.seconds);
    s += line;
  }
  return s;
}

std::string needle_table_json(const std::vector<NeedleLengthResult>& rows) {
  std::string s = "{\"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const NeedleLengthResult& r = rows[i];
    if (i) s += ", ";
    s += "{\"length\": " + std::to_string(r.length) + ", \"recall\": " + double_text(r.recall()) +
         ", \"trials\": " + std::to_string(r.trials) + ", \"hits\": " + std::to_string(r.hits) +
         ", \"digit_acc\": " + double_text(r.digit_acc()) + ", \"seconds\": " + double_text(r.seconds) + "}";
  }
  return s + "]}";
}

}  // namespace sparrow
