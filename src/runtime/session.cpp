#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/check.h"

namespace sparrow {

BatchInfo batch_build(const std::vector<SequenceChunk>& chunks) {
  BatchInfo b;
  for (const SequenceChunk& c : chunks) {
    const int32_t s = static_cast<int32_t>(b.seqs.size());
    b.seqs.push_back(c.state);
    b.seq_begin.push_back(b.num_tokens());
    const int64_t start = c.state->length();
    for (size_t i = 0; i < c.ids.size(); ++i) {
      b.token_ids.push_back(c.ids[i]);
      b.positions.push_back(start + static_cast<int64_t>(i));
      b.seq_of_token.push_back(s);
    }
    b.seq_end.push_back(b.num_tokens());
  }
  return b;
}

Status token_ids_check(std::span<const int32_t> ids, int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      return Status::invalid_argument("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                      " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  return Status::ok();
}

Expected<std::vector<float>> Session::logits(std::span<const int32_t> ids, int64_t chunk) const {
  SPARROW_RETURN_IF_ERROR(model_.check_backend(backend_));
  SPARROW_RETURN_IF_ERROR(token_ids_check(ids, model_.config().vocab_size));
  if (ids.empty()) return Status::invalid_argument("no token ids given");
  const int64_t T = static_cast<int64_t>(ids.size());
  if (chunk <= 0) chunk = T;
  auto state = backend_.create_sequence_state(model_.config());
  std::vector<float> all;
  all.reserve(static_cast<size_t>(T * model_.config().vocab_size));
  for (int64_t begin = 0; begin < T; begin += chunk) {
    const int64_t n = std::min(chunk, T - begin);
    BatchInfo batch = batch_build({{state.get(), ids.subspan(begin, n)}});
    Tensor logits = model_.forward(backend_, batch, options_);
    state->advance(n);
    std::vector<float> host = backend_.download_f32(logits);
    all.insert(all.end(), host.begin(), host.end());
  }
  return all;
}

Expected<std::vector<int32_t>> Session::generate(std::span<const int32_t> prompt, int64_t n,
                                                 std::vector<double>* step_seconds) const {
  SPARROW_RETURN_IF_ERROR(model_.check_backend(backend_));
  SPARROW_RETURN_IF_ERROR(token_ids_check(prompt, model_.config().vocab_size));
  if (prompt.empty()) return Status::invalid_argument("generation needs at least one prompt token");
  if (n < 0) return Status::invalid_argument("number of tokens to generate must be >= 0, got " + std::to_string(n));
  const int64_t V = model_.config().vocab_size;
  auto state = backend_.create_sequence_state(model_.config());
  // Each step's id stays where the logits are (Backend::argmax_rows) and is the next step's input
  // there (BatchInfo::device_token_ids), so the backend can queue step t + 1 while step t runs;
  // the ids come back once, at the end.
  std::vector<Tensor> ids;
  ids.reserve(static_cast<size_t>(n));
  const std::vector<int32_t> placeholder = {0};
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    BatchInfo batch = batch_build({{state.get(), i == 0 ? prompt : std::span<const int32_t>(placeholder)}});
    if (i > 0) batch.device_token_ids = ids.back();
    const std::vector<int64_t> last_row = {batch.num_tokens() - 1};
    ForwardOptions opt = options_;
    opt.logits_rows = &last_row;
    Tensor logits = model_.forward(backend_, batch, opt);
    state->advance(batch.num_tokens());
    ids.push_back(backend_.argmax_rows(logits));
    if (step_seconds) {
      if (i == 0) (void)backend_.download_i32(ids.back());  // the prompt's time includes its finish
      const auto t1 = std::chrono::steady_clock::now();
      step_seconds->push_back(std::chrono::duration<double>(t1 - t0).count());
      t0 = t1;
    }
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (const Tensor& t : ids) {
    SPARROW_ASSIGN_OR_RETURN(const std::vector<int32_t> best, download_token_ids(backend_, t, V));
    out.push_back(best.at(0));
  }
  if (step_seconds && n > 1) {
    // The last step's wait for the queued work, so that the steps' times add up to the wall time.
    step_seconds->back() += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

}  // namespace sparrow
