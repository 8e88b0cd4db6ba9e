#include "tools/released_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "io/config_json.h"

namespace sparrow {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kFp8Block = 128;  // 128x128 weight tiles (quantization_config.weight_block_size)
constexpr int64_t kFp4Block = 32;   // 1x32 MX blocks along the input
// Rows encoded per step: a multiple of the FP8 tile height, about 4M values (16 MB of fp32).
constexpr int64_t kChunkValues = int64_t{1} << 22;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class LayoutBuilder {
 public:
  LayoutBuilder(const ModelConfig& c, ReleaseVariant v) : c_(c), variant_(v) {}

  Expected<std::vector<ReleasedTensor>> build() {
    const int64_t D = c_.hidden_size, S = c_.hc_mult;
    add("embed.weight", TensorKind::kEmbed, Storage::kBF16, {c_.vocab_size, D});
    for (int64_t l = 0; l < c_.num_layers; ++l) SPARROW_RETURN_IF_ERROR(layer(l));
    add("norm.weight", TensorKind::kNorm, Storage::kBF16, {D});
    add("hc_head_fn", TensorKind::kHcFn, Storage::kF32, {S, S * D});
    add("hc_head_base", TensorKind::kHcBase, Storage::kF32, {S});
    add("hc_head_scale", TensorKind::kHcScale, Storage::kF32, {1});
    add("head.weight", TensorKind::kLinear, Storage::kBF16, {c_.vocab_size, D});
    return std::move(out_);
  }

 private:
  void add(std::string name, TensorKind kind, Storage storage, std::vector<int64_t> shape) {
    out_.push_back({std::move(name), kind, storage, std::move(shape)});
  }
  Storage fp8() const { return Storage::kFp8; }
  Storage expert_storage() const { return variant_ == ReleaseVariant::kFlash ? Storage::kFp4 : Storage::kFp8; }

  Status expert(const std::string& p, Storage storage) {
    const int64_t D = c_.hidden_size, F = c_.moe_intermediate;
    for (const auto& [w, out, in] : {std::tuple{"w1", F, D}, std::tuple{"w2", D, F}, std::tuple{"w3", F, D}}) {
      const std::string name = p + w + ".weight";
      if (storage == Storage::kFp4 && in % kFp4Block != 0)
        return Status::unsupported("'" + name + "' cannot be stored as MXFP4: its input size " + std::to_string(in) +
                                   " is not a multiple of " + std::to_string(kFp4Block));
      add(name, TensorKind::kLinear, storage, {out, in});
    }
    return Status::ok();
  }

  void compressor(const std::string& p, int64_t width, int64_t dim, int64_t ratio) {
    const int64_t D = c_.hidden_size;
    add(p + "wkv.weight", TensorKind::kLinear, Storage::kBF16, {width, D});
    add(p + "wgate.weight", TensorKind::kLinear, Storage::kBF16, {width, D});
    add(p + "ape", TensorKind::kApe, Storage::kF32, {ratio, width});
    add(p + "norm.weight", TensorKind::kNorm, Storage::kBF16, {dim});
  }

  Status layer(int64_t l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const int64_t D = c_.hidden_size, S = c_.hc_mult, H = c_.num_heads, Dh = c_.head_dim, mix = c_.mix_dim();
    add(p + "attn_norm.weight", TensorKind::kNorm, Storage::kBF16, {D});
    add(p + "ffn_norm.weight", TensorKind::kNorm, Storage::kBF16, {D});
    for (const char* site : {"hc_attn", "hc_ffn"}) {
      add(p + site + "_fn", TensorKind::kHcFn, Storage::kF32, {mix, S * D});
      add(p + site + "_base", TensorKind::kHcBase, Storage::kF32, {mix});
      add(p + site + "_scale", TensorKind::kHcScale, Storage::kF32, {3});
    }
    const std::string a = p + "attn.";
    add(a + "attn_sink", TensorKind::kSink, Storage::kF32, {H});
    add(a + "wq_a.weight", TensorKind::kLinear, fp8(), {c_.q_lora_rank, D});
    add(a + "q_norm.weight", TensorKind::kNorm, Storage::kBF16, {c_.q_lora_rank});
    add(a + "wq_b.weight", TensorKind::kLinear, fp8(), {H * Dh, c_.q_lora_rank});
    add(a + "wkv.weight", TensorKind::kLinear, fp8(), {Dh, D});
    add(a + "kv_norm.weight", TensorKind::kNorm, Storage::kBF16, {Dh});
    add(a + "wo_a.weight", TensorKind::kLinear, fp8(), {c_.o_groups * c_.o_lora_rank, H * Dh / c_.o_groups});
    add(a + "wo_b.weight", TensorKind::kLinear, fp8(), {D, c_.o_groups * c_.o_lora_rank});
    const int64_t m = c_.compress_ratio[l];
    if (c_.attention[l] == AttentionKind::kCsa) {
      compressor(a + "compressor.", 2 * Dh, Dh, m);
      const int64_t Hi = c_.index_heads, di = c_.index_head_dim;
      add(a + "indexer.wq_b.weight", TensorKind::kLinear, fp8(), {Hi * di, c_.q_lora_rank});
      add(a + "indexer.weights_proj.weight", TensorKind::kLinear, Storage::kBF16, {Hi, D});
      compressor(a + "indexer.compressor.", 2 * di, di, m);
    } else if (c_.attention[l] == AttentionKind::kHca) {
      compressor(a + "compressor.", Dh, Dh, m);
    }
    const std::string f = p + "ffn.";
    add(f + "gate.weight", TensorKind::kLinear, Storage::kBF16, {c_.num_experts, D});
    if (c_.moe[l] == MoeKind::kHash) {
      add(f + "gate.tid2eid", TensorKind::kTid2eid, Storage::kI64, {c_.vocab_size, c_.experts_per_token});
    } else {
      add(f + "gate.bias", TensorKind::kGateBias, Storage::kF32, {c_.num_experts});
    }
    if (c_.num_shared_experts == 1) SPARROW_RETURN_IF_ERROR(expert(f + "shared_experts.", fp8()));
    for (int64_t e = 0; e < c_.num_experts; ++e)
      SPARROW_RETURN_IF_ERROR(expert(f + "experts." + std::to_string(e) + ".", expert_storage()));
    return Status::ok();
  }

  const ModelConfig& c_;
  ReleaseVariant variant_;
  std::vector<ReleasedTensor> out_;
};

// The stored tensors of one released tensor: the data, then its scale for FP8/FP4.
void plan_stored(const ReleasedTensor& t, ReleaseVariant v, int64_t group, std::vector<PlannedTensor>& plan) {
  const int64_t R = t.rows(), C = t.cols();
  switch (t.storage) {
    case Storage::kF32: plan.push_back({t.name, DType::kF32, t.shape, group}); return;
    case Storage::kBF16: plan.push_back({t.name, DType::kBF16, t.shape, group}); return;
    case Storage::kI64: plan.push_back({t.name, DType::kI64, t.shape, group}); return;
    case Storage::kFp8:
      plan.push_back({t.name, DType::kF8E4M3, t.shape, group});
      plan.push_back({scale_name(t.name), v == ReleaseVariant::kFlash ? DType::kF8E8M0 : DType::kF32,
                      {ceil_div(R, kFp8Block), ceil_div(C, kFp8Block)}, group});
      return;
    case Storage::kFp4:
      plan.push_back({t.name, DType::kI8, {R, C / 2}, group});
      plan.push_back({scale_name(t.name), DType::kF8E8M0, {R, C / kFp4Block}, group});
      return;
  }
}

Status non_finite(const ReleasedTensor& t, int64_t r0, const float* vals, int64_t n) {
  // Fast path: an all-ones exponent field (inf or NaN) anywhere, as a vectorisable OR over the bits.
  std::atomic<bool> any{false};
  parallel_for(n, n, [&](int64_t b, int64_t e) {
    uint32_t bad = 0;
    for (int64_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, vals + i, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) any = true;
  });
  if (!any) return Status::ok();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(vals[i])) {
      const int64_t idx = r0 * t.cols() + i;
      return Status::invalid_argument("tensor '" + t.name + "' element [" + std::to_string(idx / t.cols()) + ", " +
                                      std::to_string(idx % t.cols()) + "] is " + std::to_string(vals[i]) +
                                      ": the released formats hold finite values only");
    }
  return Status::ok();
}

// x / 2^k as a multiplication by 2^-k: one correctly rounded operation, so the same float as
// ldexp(x, -k) (exact unless the result is subnormal); ldexp itself where 2^-k is not a normal float.
struct Pow2Divider {
  explicit Pow2Divider(int k) : k_(k), inv_(std::ldexp(1.0f, -k)), exact_(k >= -127 && k <= 126) {}
  float operator()(float x) const { return exact_ ? x * inv_ : std::ldexp(x, -k_); }
  int k_;
  float inv_;
  bool exact_;
};

// Encodes rows [r0, r0 + nr) of an FP8 tensor; scales of its tile rows go to `scales` (one entry
// per tile, row-major over [ceil(R/128), ceil(C/128)]). REQUIRES: r0 % 128 == 0.
void encode_fp8(const float* vals, int64_t r0, int64_t nr, int64_t C, uint8_t* out, std::vector<int>* scales) {
  const int64_t tile_rows = ceil_div(nr, kFp8Block), tile_cols = ceil_div(C, kFp8Block);
  const int64_t first_tile = r0 / kFp8Block * tile_cols;
  if (scales->size() < static_cast<size_t>(first_tile + tile_rows * tile_cols))
    scales->resize(first_tile + tile_rows * tile_cols);
  parallel_for(tile_rows * tile_cols, nr * C * 4, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t tr = tile / tile_cols, tc = tile % tile_cols;
      const int64_t rb = tr * kFp8Block, re = std::min(nr, rb + kFp8Block);
      const int64_t cb = tc * kFp8Block, ce = std::min(C, cb + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = rb; r < re; ++r)
        for (int64_t c = cb; c < ce; ++c) amax = std::max(amax, std::fabs(vals[r * C + c]));
      const int k = pow2_scale_exponent(amax, kE4m3Max);
      (*scales)[first_tile + tile] = k;
      const Pow2Divider div(k);
      for (int64_t r = rb; r < re; ++r)
        for (int64_t c = cb; c < ce; ++c) out[r * C + c] = f32_to_e4m3(div(vals[r * C + c]));
    }
  });
}

// Encodes rows of an MXFP4 tensor: out [nr, C/2] packed nibbles, scale_out [nr, C/32] e8m0 bytes.
void encode_fp4(const float* vals, int64_t nr, int64_t C, uint8_t* out, uint8_t* scale_out) {
  parallel_for(nr, nr * C * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < C / kFp4Block; ++b) {
        const float* x = vals + r * C + b * kFp4Block;
        float amax = 0.0f;
        for (int64_t i = 0; i < kFp4Block; ++i) amax = std::max(amax, std::fabs(x[i]));
        const int k = pow2_scale_exponent(amax, kE2m1Max);
        scale_out[r * (C / kFp4Block) + b] = e8m0_from_exponent(k);
        const Pow2Divider div(k);
        uint8_t* o = out + r * (C / 2) + b * (kFp4Block / 2);
        for (int64_t j = 0; j < kFp4Block / 2; ++j)
          o[j] = static_cast<uint8_t>(f32_to_e2m1(div(x[2 * j])) | f32_to_e2m1(div(x[2 * j + 1])) << 4);
      }
    }
  });
}

// Encodes `t` from the source a chunk at a time, appending its data to `w` (unless null: a pass
// for the scales only) and returning the bytes of its scale tensor (FP8/FP4) in `scale_bytes`.
Status write_tensor(const ReleasedTensor& t, ReleaseVariant variant, TensorSource& src, CheckpointWriter* w,
                    std::vector<uint8_t>* scale_bytes) {
  const int64_t R = t.rows(), C = t.cols();
  auto emit = [&](const void* data, size_t n) { return w != nullptr ? w->append(data, n) : Status::ok(); };
  scale_bytes->clear();
  if (t.storage == Storage::kI64) {
    const int64_t step = std::max<int64_t>(1, kChunkValues / std::max<int64_t>(C, 1));
    std::vector<int64_t> vals;
    for (int64_t r0 = 0; r0 < R; r0 += step) {
      const int64_t nr = std::min(step, R - r0);
      vals.assign(nr * C, 0);
      SPARROW_RETURN_IF_ERROR(src.int_rows(t, r0, r0 + nr, vals.data()));
      SPARROW_RETURN_IF_ERROR(emit(vals.data(), vals.size() * sizeof(int64_t)));  // little-endian host
    }
    return Status::ok();
  }
  const int64_t step = std::max<int64_t>(1, kChunkValues / std::max<int64_t>(C, 1) / kFp8Block) * kFp8Block;
  std::vector<float> vals;
  std::vector<uint8_t> bytes, fp4_scales;
  std::vector<int> fp8_scales;
  for (int64_t r0 = 0; r0 < R; r0 += step) {
    const int64_t nr = std::min(step, R - r0), n = nr * C;
    if (t.storage == Storage::kFp4) {
      bytes.resize(n / 2);
      const size_t s0 = fp4_scales.size();
      fp4_scales.resize(s0 + nr * (C / kFp4Block));
      if (src.fp4_rows(t, r0, r0 + nr, bytes.data(), fp4_scales.data() + s0)) {
        SPARROW_RETURN_IF_ERROR(emit(bytes.data(), bytes.size()));
        continue;
      }
      fp4_scales.resize(s0);
    }
    vals.resize(n);
    SPARROW_RETURN_IF_ERROR(src.float_rows(t, r0, r0 + nr, vals.data()));
    SPARROW_RETURN_IF_ERROR(non_finite(t, r0, vals.data(), n));
    switch (t.storage) {
      case Storage::kF32:
        SPARROW_RETURN_IF_ERROR(emit(vals.data(), n * sizeof(float)));
        break;
      case Storage::kBF16: {
        bytes.resize(n * 2);
        auto* o = reinterpret_cast<uint16_t*>(bytes.data());
        parallel_for(n, n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) o[i] = f32_to_bf16(vals[i]);
        });
        SPARROW_RETURN_IF_ERROR(emit(bytes.data(), bytes.size()));
        break;
      }
      case Storage::kFp8:
        bytes.resize(n);
        encode_fp8(vals.data(), r0, nr, C, bytes.data(), &fp8_scales);
        SPARROW_RETURN_IF_ERROR(emit(bytes.data(), bytes.size()));
        break;
      case Storage::kFp4: {
        bytes.resize(n / 2);
        const size_t s0 = fp4_scales.size();
        fp4_scales.resize(s0 + nr * (C / kFp4Block));
        encode_fp4(vals.data(), nr, C, bytes.data(), fp4_scales.data() + s0);
        SPARROW_RETURN_IF_ERROR(emit(bytes.data(), bytes.size()));
        break;
      }
      case Storage::kI64:
        break;  // handled above
    }
  }
  if (t.storage == Storage::kFp4) *scale_bytes = std::move(fp4_scales);
  if (t.storage == Storage::kFp8) {
    if (variant == ReleaseVariant::kFlash) {
      // e8m0 bytes are exponents, written as bits (never a numeric cast of the scale value).
      scale_bytes->resize(fp8_scales.size());
      for (size_t i = 0; i < fp8_scales.size(); ++i) (*scale_bytes)[i] = e8m0_from_exponent(fp8_scales[i]);
    } else {
      scale_bytes->resize(fp8_scales.size() * sizeof(float));
      for (size_t i = 0; i < fp8_scales.size(); ++i) {
        const float f = std::ldexp(1.0f, fp8_scales[i]);
        std::memcpy(scale_bytes->data() + 4 * i, &f, 4);
      }
    }
  }
  return Status::ok();
}

}  // namespace

std::string scale_name(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() > kSuffix.size() && weight_name.ends_with(kSuffix))
    return weight_name.substr(0, weight_name.size() - kSuffix.size()) + ".scale";
  return weight_name + ".scale";
}

Expected<std::vector<ReleasedTensor>> released_layout(const ModelConfig& c, ReleaseVariant variant) {
  return LayoutBuilder(c, variant).build();
}

std::string released_config_json(const ModelConfig& config, ReleaseVariant variant) {
  ModelConfig c = config;
  c.mtp_compress_ratios.clear();  // no MTP block is written
  c.fp8_weights = true;
  c.expert_dtype = variant == ReleaseVariant::kFlash ? "fp4" : "fp8";
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(model_config_to_released_json(c));
  // model_config_to_released_json cannot know the scale format; the release spells it (spec §1.1).
  // Flash-Base's F32 scales have no ue8m0 rounding, so it gets no scale_fmt.
  nlohmann::ordered_json q;
  q["activation_scheme"] = "dynamic";
  q["fmt"] = "e4m3";
  q["quant_method"] = "fp8";
  if (variant == ReleaseVariant::kFlash) q["scale_fmt"] = "ue8m0";
  q["weight_block_size"] = {kFp8Block, kFp8Block};
  j["quantization_config"] = q;
  j["num_nextn_predict_layers"] = 0;
  j["torch_dtype"] = "bfloat16";
  return j.dump(2) + "\n";
}

Status released_checkpoint_write(const fs::path& dir, const ModelConfig& c, TensorSource& source,
                                 const ReleasedWriteOptions& options) {
  SPARROW_ASSIGN_OR_RETURN(std::vector<ReleasedTensor> layout, released_layout(c, options.variant));
  std::vector<PlannedTensor> plan;
  for (size_t i = 0; i < layout.size(); ++i) plan_stored(layout[i], options.variant, static_cast<int64_t>(i), plan);
  // Which layout tensor each stored tensor comes from, and whether it is that tensor's scale.
  std::vector<std::pair<size_t, bool>> origin;
  for (const PlannedTensor& p : plan) origin.push_back({static_cast<size_t>(p.group), p.name.ends_with(".scale")});
  SPARROW_ASSIGN_OR_RETURN(auto writer, CheckpointWriter::create(dir, std::move(plan), options.max_shard_bytes));
  // The writer stores larger elements first, so an F32 scale (Flash-Base) precedes its FP8 weight:
  // it is then computed by a scales-only pass. Otherwise a weight's scales wait here until written.
  std::map<size_t, std::vector<uint8_t>> pending_scales;
  std::set<size_t> scales_written;
  std::vector<uint8_t> scales;
  for (const size_t idx : writer->file_order()) {
    const auto [ti, is_scale] = origin[idx];
    const ReleasedTensor& t = layout[ti];
    if (!is_scale) {
      SPARROW_RETURN_IF_ERROR(write_tensor(t, options.variant, source, writer.get(), &scales));
      if (!scales.empty() && !scales_written.count(ti)) pending_scales[ti] = std::move(scales);
    } else {
      if (auto it = pending_scales.find(ti); it != pending_scales.end()) {
        scales = std::move(it->second);
        pending_scales.erase(it);
      } else {
        SPARROW_RETURN_IF_ERROR(write_tensor(t, options.variant, source, nullptr, &scales));
      }
      scales_written.insert(ti);
      SPARROW_RETURN_IF_ERROR(writer->append(scales.data(), scales.size()));
    }
    if (options.progress) options.progress(writer->written_bytes(), writer->total_bytes());
  }
  SPARROW_RETURN_IF_ERROR(writer->finish());
  const fs::path config_path = dir / "config.json";
  std::ofstream out(config_path, std::ios::binary | std::ios::trunc);
  out << released_config_json(c, options.variant);
  out.close();
  if (!out) return Status::io_error(config_path.string() + ": write failed");
  return Status::ok();
}

}  // namespace sparrow
