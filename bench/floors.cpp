#include "bench/floors.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>

#include "core/check.h"

namespace sparrow::bench {

namespace {

constexpr int64_t kFp8Tile = 128;       // FP8 weights: one e8m0 scale per 128x128 tile (spec §2.2)
constexpr int64_t kFp4Block = 32;       // MXFP4 experts: one e8m0 scale per 1x32 block
constexpr int64_t kKvScaleBlock = 64;   // KV nope dims: one e8m0 scale per 64 values (spec §3.0.6)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t bf16_bytes(int64_t out, int64_t in) { return out * in * 2; }

// One routed expert: w1 and w3 [F, D], w2 [D, F].
int64_t expert_bytes(const ModelConfig& c, ExpertFormat f) {
  const int64_t F = c.moe_intermediate, D = c.hidden_size;
  switch (f) {
    case ExpertFormat::kMxfp4: return 2 * mxfp4_weight_bytes(F, D) + mxfp4_weight_bytes(D, F);
    case ExpertFormat::kFp8Block: return 2 * fp8_block_weight_bytes(F, D) + fp8_block_weight_bytes(D, F);
  }
  return 0;
}

// Width of a compressor's pending rows: CSA keeps both halves (2 dim), HCA one.
int64_t compressor_width(const ModelConfig& c, int64_t layer, int64_t dim) {
  return c.attention[layer] == AttentionKind::kCsa ? 2 * dim : dim;
}

// Per-layer weights touched by a step over `tokens` tokens (ape rows: `ape_rows` of m).
void add_weights(StepFloor& f, const ModelConfig& c, int64_t l, int64_t tokens, double ape_rows, const FloorOptions& o) {
  const int64_t D = c.hidden_size, H = c.num_heads, Dh = c.head_dim, G = c.o_groups;
  const int64_t q_lora = c.q_lora_rank, o_lora = c.o_lora_rank, S = c.hc_mult;
  const int64_t Hi = c.index_heads, di = c.index_head_dim, E = c.num_experts, K = c.experts_per_token;
  const AttentionKind kind = c.attention[l];
  StepBytes& b = f.bytes;

  b.attn_weights = fp8_block_weight_bytes(q_lora, D) + fp8_block_weight_bytes(H * Dh, q_lora) +
                   fp8_block_weight_bytes(Dh, D) + fp8_block_weight_bytes(G * o_lora, H * Dh / G) +
                   fp8_block_weight_bytes(D, G * o_lora) + q_lora * 2 + Dh * 2 + H * 4;
  if (kind != AttentionKind::kSliding) {
    const int64_t w = compressor_width(c, l, Dh);
    b.extra_weights = 2 * bf16_bytes(w, D) + ape_rows * w * 4 + Dh * 2;  // wkv, wgate, ape, norm
    if (kind == AttentionKind::kCsa) {
      b.extra_weights += fp8_block_weight_bytes(Hi * di, q_lora) + bf16_bytes(Hi, D);  // wq_b, weights_proj
      b.extra_weights += 2 * bf16_bytes(2 * di, D) + ape_rows * 2 * di * 4 + di * 2;  // indexer compressor
    }
  }
  b.router_weights = bf16_bytes(E, D) + (c.moe[l] == MoeKind::kScored ? E * 4.0 : tokens * K * 8.0);
  f.experts_touched = expected_distinct_experts(E, K, tokens);
  b.routed_experts = f.experts_touched * static_cast<double>(expert_bytes(c, o.experts));
  b.shared_expert = c.num_shared_experts * (2 * fp8_block_weight_bytes(c.moe_intermediate, D) +
                                            fp8_block_weight_bytes(D, c.moe_intermediate));
  b.norms_mhc = 2 * D * 2 + 2 * (c.mix_dim() * S * D * 4 + c.mix_dim() * 4 + 3 * 4);
}

// FLOPs of the projections for one token (spec §3.3, §3.4): 2 N K each.
void add_gemm_flops(StepFlops& fl, const ModelConfig& c, int64_t l) {
  const double D = c.hidden_size, H = c.num_heads, Dh = c.head_dim, G = c.o_groups;
  const double q_lora = c.q_lora_rank, o_lora = c.o_lora_rank, S = c.hc_mult, F = c.moe_intermediate;
  const double Hi = c.index_heads, di = c.index_head_dim;
  const AttentionKind kind = c.attention[l];
  fl.gemm_fp8 += 2 * (q_lora * D + H * Dh * q_lora + Dh * D + G * o_lora * (H * Dh / G) + D * G * o_lora);
  fl.gemm_fp8 += (c.experts_per_token + c.num_shared_experts) * 3 * 2 * F * D;
  fl.gemm_bf16 += 2 * c.num_experts * D + 2 * 2 * c.mix_dim() * S * D;  // router, both mHC sites
  if (kind != AttentionKind::kSliding) fl.gemm_bf16 += 2 * 2 * compressor_width(c, l, c.head_dim) * D;
  if (kind == AttentionKind::kCsa) {
    fl.gemm_fp8 += 2 * Hi * di * q_lora;
    fl.gemm_bf16 += 2 * Hi * D + 2 * 2 * (2 * di) * D;
  }
}

struct TokenKeys {
  int64_t window = 0, compressed = 0, scored = 0;
};

// Keys attended and indexer entries scored by the token at position t (spec §3.3, §5.3).
TokenKeys token_keys(const ModelConfig& c, int64_t l, int64_t t) {
  TokenKeys k;
  k.window = std::min(c.sliding_window, t + 1);
  const int64_t m = c.compress_ratio[l];
  switch (c.attention[l]) {
    case AttentionKind::kSliding: break;
    case AttentionKind::kHca: k.compressed = (t + 1) / m; break;
    case AttentionKind::kCsa:
      k.scored = (t + 1) / m;
      k.compressed = std::min(c.index_topk, k.scored);
      break;
  }
  return k;
}

void add_context_flops(StepFloor& f, const ModelConfig& c, const TokenKeys& k, int64_t count) {
  const double H = c.num_heads, Dh = c.head_dim, Hi = c.index_heads, di = c.index_head_dim;
  f.flops.attention += count * 4 * H * Dh * static_cast<double>(k.window + k.compressed);
  f.flops.indexer += count * (2 * Hi * di + 2 * Hi) * static_cast<double>(k.scored);
  f.attended_keys += count * (k.window + k.compressed);
  f.scored_entries += count * k.scored;
}

}  // namespace

FloorOptions floor_options_for(const ModelConfig& c) {
  FloorOptions o;
  o.experts = c.expert_dtype == "fp8" ? ExpertFormat::kFp8Block : ExpertFormat::kMxfp4;
  return o;
}

const char* index_key_format_name(IndexKeyFormat f) {
  switch (f) {
    case IndexKeyFormat::kFp8: return "fp8";
    case IndexKeyFormat::kFp4: return "fp4";
    case IndexKeyFormat::kBf16: return "bf16";
  }
  return "?";
}

int64_t fp8_block_weight_bytes(int64_t out, int64_t in) {
  return out * in + ceil_div(out, kFp8Tile) * ceil_div(in, kFp8Tile);
}

int64_t mxfp4_weight_bytes(int64_t out, int64_t in) {
  SPARROW_CHECK(in % 2 == 0);
  return out * in / 2 + out * ceil_div(in, kFp4Block);
}

int64_t kv_record_bytes(const ModelConfig& c) {
  const int64_t nope = c.nope_dim();
  return (nope + ceil_div(nope, kKvScaleBlock) + 7) / 8 * 8 + 2 * c.rope_dim;
}

int64_t index_key_bytes(const ModelConfig& c, IndexKeyFormat f) {
  const int64_t di = c.index_head_dim;
  switch (f) {
    case IndexKeyFormat::kFp8: return di + 4;
    case IndexKeyFormat::kFp4: return ceil_div(di, 2) + ceil_div(di, kFp4Block);
    case IndexKeyFormat::kBf16: return 2 * di;
  }
  return 0;
}

double expected_distinct_experts(int64_t E, int64_t K, int64_t tokens) {
  if (E <= 0 || K <= 0 || tokens <= 0) return 0.0;
  const double miss = 1.0 - static_cast<double>(std::min(K, E)) / static_cast<double>(E);
  return static_cast<double>(E) * (1.0 - std::pow(miss, static_cast<double>(tokens)));
}

StepFloor decode_floor(const ModelConfig& c, int64_t l, int64_t batch, int64_t context, const FloorOptions& o) {
  SPARROW_CHECK(l >= 0 && l < c.num_layers);
  SPARROW_CHECK(batch >= 1 && context >= 0);
  StepFloor f;
  f.tokens = batch;
  const int64_t m = c.compress_ratio[l];
  // The batch's ape rows: one per distinct position mod m, in expectation (same assumption as the
  // experts': positions independent and uniform mod m).
  const double ape_rows = m > 0 ? expected_distinct_experts(m, 1, batch) : 0.0;
  add_weights(f, c, l, batch, ape_rows, o);
  add_gemm_flops(f.flops, c, l);
  f.flops.gemm_fp8 *= batch;
  f.flops.gemm_bf16 *= batch;

  const TokenKeys k = token_keys(c, l, context);
  add_context_flops(f, c, k, batch);
  const double record = static_cast<double>(kv_record_bytes(c));
  f.bytes.kv_window = batch * k.window * record;
  f.bytes.kv_compressed = batch * k.compressed * record;
  f.bytes.index_keys = batch * k.scored * static_cast<double>(index_key_bytes(c, o.index_keys));
  double rows = 0;  // compressor kv + gate rows per token, bf16
  if (c.attention[l] != AttentionKind::kSliding) rows += 2 * compressor_width(c, l, c.head_dim) * 2;
  if (c.attention[l] == AttentionKind::kCsa) rows += 2 * (2 * c.index_head_dim) * 2;
  f.bytes.state_writes = batch * (record + rows);
  f.bytes.activations = batch * 2.0 * c.hc_mult * c.hidden_size * 2;
  return f;
}

StepFloor prefill_floor(const ModelConfig& c, int64_t l, int64_t tokens, const FloorOptions& o) {
  SPARROW_CHECK(l >= 0 && l < c.num_layers);
  SPARROW_CHECK(tokens >= 1);
  StepFloor f;
  f.tokens = tokens;
  const int64_t m = c.compress_ratio[l];
  add_weights(f, c, l, tokens, static_cast<double>(std::min(m, tokens)), o);
  add_gemm_flops(f.flops, c, l);
  f.flops.gemm_fp8 *= tokens;
  f.flops.gemm_bf16 *= tokens;
  for (int64_t t = 0; t < tokens; ++t) add_context_flops(f, c, token_keys(c, l, t), 1);

  const double record = static_cast<double>(kv_record_bytes(c));
  const int64_t entries = m > 0 ? tokens / m : 0;
  f.bytes.kv_compressed = entries * record;
  if (c.attention[l] == AttentionKind::kCsa)
    f.bytes.index_keys = entries * static_cast<double>(index_key_bytes(c, o.index_keys));
  f.bytes.state_writes = std::min(c.sliding_window, tokens) * record;
  f.bytes.activations = tokens * 2.0 * c.hc_mult * c.hidden_size * 2;
  return f;
}

FloorTime floor_time(const StepFloor& f, const Peaks& p) {
  FloorTime t;
  SPARROW_CHECK(p.hbm_bytes_per_s > 0 && p.bf16_flops_per_s > 0 && p.fp8_flops_per_s > 0);
  t.memory_s = f.bytes.total() / p.hbm_bytes_per_s;
  t.compute_s = (f.flops.gemm_fp8 + f.flops.indexer) / p.fp8_flops_per_s +
                (f.flops.gemm_bf16 + f.flops.attention) / p.bf16_flops_per_s;
  t.memory_bound = t.memory_s >= t.compute_s;
  t.floor_s = std::max(t.memory_s, t.compute_s);
  return t;
}

ModelStepFloor model_step_floor(const ModelConfig& c, int64_t context, double head_bytes, const FloorOptions& o,
                                const Peaks& p) {
  ModelStepFloor f;
  for (int64_t l = 0; l < c.num_layers; ++l) f.layers_s += floor_time(decode_floor(c, l, 1, context, o), p).floor_s;
  f.head_s = head_bytes / p.hbm_bytes_per_s;
  return f;
}

std::vector<SegmentSummary> summarise_segments(const std::vector<SegmentSample>& samples, size_t last_steps) {
  std::vector<std::vector<SegmentSample>> steps;
  for (const SegmentSample& s : samples) {
    if (s.segment == 0 || steps.empty()) steps.emplace_back();
    steps.back().push_back(s);
  }
  const size_t first = steps.size() > last_steps ? steps.size() - last_steps : 0;
  std::map<int, std::vector<double>> ms;
  std::map<int, SegmentSample> last;
  for (size_t i = first; i < steps.size(); ++i)
    for (const SegmentSample& s : steps[i]) {
      ms[s.segment].push_back(s.ms);
      last[s.segment] = s;
    }
  std::vector<SegmentSummary> out;
  for (auto& [segment, v] : ms) {
    std::sort(v.begin(), v.end());
    const SegmentSample& l = last[segment];
    out.push_back({.segment = segment, .median_ms = v[v.size() / 2], .nodes = l.nodes, .kernels = l.kernels,
                   .driver_kernels = l.driver_kernels});
  }
  return out;
}

std::string short_kernel_name(const std::string& mangled) {
  // The identifiers of the Itanium mangling are <length><chars>; the function's is the last one
  // that ends in "kernel", its template arguments the L<type><value>E that follow it inside I..E.
  std::string best;
  size_t best_end = std::string::npos;
  for (size_t i = 0; i < mangled.size();) {
    if (!std::isdigit(static_cast<unsigned char>(mangled[i]))) {  // (an identifier's digits are jumped over with it)
      ++i;
      continue;
    }
    size_t j = i, len = 0;
    while (j < mangled.size() && std::isdigit(static_cast<unsigned char>(mangled[j])) && len < 100000)
      len = len * 10 + static_cast<size_t>(mangled[j++] - '0');
    if (len == 0 || j + len > mangled.size()) {
      i = j;
      continue;
    }
    const std::string id = mangled.substr(j, len);
    if (id.size() >= 6 && id.compare(id.size() - 6, 6, "kernel") == 0) best = id, best_end = j + len;
    i = j + len;
  }
  if (best.empty()) return mangled;
  if (best_end < mangled.size() && mangled[best_end] == 'I') {
    std::string args;
    size_t k = best_end + 1;
    while (k < mangled.size() && mangled[k] == 'L') {
      size_t e = mangled.find('E', k);
      if (e == std::string::npos) break;
      // L<type code><value>E: the type is one letter for the builtins used here (i, b, l, j, m).
      std::string v = mangled.substr(k + 2, e - k - 2);
      if (!v.empty() && v[0] == 'n') v[0] = '-';
      args += (args.empty() ? "" : ",") + v;
      k = e + 1;
    }
    if (!args.empty()) best += "<" + args + ">";
  }
  return best;
}

std::vector<TracedSegment> summarise_kernel_trace(const std::vector<TracedLaunch>& launches) {
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::map<int, std::vector<const TracedLaunch*>> by_segment;
  std::map<int, int> skipped;
  for (const TracedLaunch& l : launches) {
    if (!l.complete || l.records.size() != l.kernels.size() || l.records.empty()) {
      ++skipped[l.segment];
      continue;
    }
    std::vector<const TracedLaunch*>& v = by_segment[l.segment];
    if (!v.empty() && v.front()->kernels != l.kernels) {
      ++skipped[l.segment];
      continue;
    }
    v.push_back(&l);
  }
  std::vector<TracedSegment> out;
  for (auto& [segment, ls] : by_segment) {
    TracedSegment t{.segment = segment, .launches = static_cast<int>(ls.size()), .skipped = skipped[segment]};
    const size_t n = ls.front()->kernels.size();
    std::vector<double> span;
    for (const TracedLaunch* l : ls)
      span.push_back(static_cast<double>(l->records.back().first_past_wait - l->records.front().first_past_wait) * 1e-3);
    t.span_us = median(span);
    for (size_t k = 0; k < n; ++k) {
      std::vector<double> chain, resident, spread;
      std::vector<double> blocks;
      for (const TracedLaunch* l : ls) {
        const TracedLaunch::Record& r = l->records[k];
        if (k + 1 < n) chain.push_back(static_cast<double>(l->records[k + 1].first_past_wait - r.first_past_wait) * 1e-3);
        resident.push_back(static_cast<double>(r.first_past_wait - r.first_at_wait) * 1e-3);
        spread.push_back(static_cast<double>(r.last_past_wait - r.first_past_wait) * 1e-3);
        blocks.push_back(static_cast<double>(r.blocks));
      }
      t.kernels.push_back({.name = short_kernel_name(ls.front()->kernels[k]),
                           .chain_us = median(chain),
                           .resident_us = median(resident),
                           .spread_us = median(spread),
                           .blocks = static_cast<int64_t>(median(blocks))});
    }
    std::map<std::string, TracedSegment::ByName> by_name;
    for (const TracedKernel& k : t.kernels) {
      if (k.chain_us < 0) continue;
      TracedSegment::ByName& b = by_name[k.name];
      b.name = k.name;
      b.chain_us += k.chain_us;
      ++b.count;
    }
    for (auto& [name, b] : by_name) t.by_name.push_back(b);
    std::stable_sort(t.by_name.begin(), t.by_name.end(),
                     [](const TracedSegment::ByName& a, const TracedSegment::ByName& b) { return a.chain_us > b.chain_us; });
    out.push_back(std::move(t));
  }
  for (auto& [segment, n] : skipped)
    if (!by_segment.count(segment)) out.push_back({.segment = segment, .skipped = n});
  std::sort(out.begin(), out.end(), [](const TracedSegment& a, const TracedSegment& b) { return a.segment < b.segment; });
  return out;
}

}  // namespace sparrow::bench
