// DeepSeek-V4 config.json parsing, validation and released-schema writing (see config_json.h).
//
// Fields are read through typed getters that treat JSON null as "absent" (transformers writes null
// for unset optional fields) and reject a wrong JSON type with the field, the value and the type
// that was expected. The schema-dependent topics (attention schedule, MoE schedule, RoPE) are
// resolved one at a time, each checking that released and transformers spellings agree when both
// are present; cross-field range checks come last. nlohmann::json stays inside this file.

#include "io/config_json.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sparrow {
namespace {

using json = nlohmann::json;

// Defaults of the transformers 5.17 config class (HF-C) for fields a config may omit.
constexpr int64_t kDefaultCsaRate = 4;
constexpr int64_t kDefaultHcaRate = 128;
constexpr int64_t kDefaultNumHashLayers = 3;
constexpr int64_t kDefaultSharedExperts = 1;
constexpr double kDefaultRoutedScaling = 1.5;
constexpr double kDefaultSwigluLimit = 10.0;
constexpr int64_t kDefaultSinkhornIters = 20;
constexpr double kDefaultHcEps = 1e-6;
constexpr double kDefaultRmsNormEps = 1e-6;
constexpr int64_t kDefaultMaxPositions = 1048576;
constexpr int64_t kDefaultBos = 0;
constexpr int64_t kDefaultEos = 1;
constexpr double kDefaultRopeTheta = 10000.0;
constexpr double kDefaultCompressRopeTheta = 160000.0;
constexpr double kDefaultPartialRotaryFactor = 64.0 / 512.0;  // qk_rope_head_dim / head_dim
constexpr double kDefaultYarnBetaFast = 32.0;
constexpr double kDefaultYarnBetaSlow = 1.0;

// The only CSA ratio: the reference makes a compressor overlapping (and gives it an indexer) exactly
// when its ratio is 4, so in the released schema 4 *means* CSA and any other positive ratio HCA.
constexpr int64_t kCsaRatio = 4;
constexpr int64_t kFp8BlockSize = 128;  // the only FP8 weight block the loaders implement

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kCsaName = "compressed_sparse_attention";
constexpr const char* kHcaName = "heavily_compressed_attention";

// A value as it appeared in the file, shortened so a 44-entry list cannot swamp the message. The
// replace handler keeps dump() from throwing on invalid UTF-8 (the parser rejects it anyway).
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// "field 'name' = value": the start of almost every error message.
std::string field(const std::string& name, const json& v) { return "field '" + name + "' = " + show(v); }

std::string num(int64_t v) { return std::to_string(v); }
std::string num(double v) { return show(json(v)); }

const char* a_type(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a fractional number";
    default: return "a binary value";
  }
}

// The error prefix ("config.json: ") and the Status constructors that use it.
class Source {
 public:
  explicit Source(std::string_view source)
      : prefix_((source.empty() ? std::string("config") : std::string(source)) + ": ") {}
  Status invalid(const std::string& msg) const { return Status::invalid_argument(prefix_ + msg); }
  Status unsupported(const std::string& msg) const { return Status::unsupported(prefix_ + msg); }
  Status corrupt(const std::string& msg) const { return Status::corrupt(prefix_ + msg); }

 private:
  std::string prefix_;
};

Status wrong_type(const Source& src, const std::string& name, const json& v, const char* expected) {
  return src.invalid(field(name, v) + " is " + a_type(v) + ", expected " + expected);
}

// An integer; 4096.0 is accepted (JSON does not distinguish it from 4096), 4096.5 and "4096" not.
Expected<int64_t> to_int(const Source& src, const json& v, const std::string& name) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return src.invalid(field(name, v) + " does not fit in a 64-bit signed integer");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 bounds the int64 range exactly in double arithmetic.
    if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9223372036854775808.0) {
      return static_cast<int64_t>(d);
    }
  }
  return wrong_type(src, name, v, "an integer");
}

// A finite number. JSON has no NaN or Infinity and nlohmann's parser rejects overflowing literals
// such as 1e999, so the finiteness check is only a guard should either ever change.
Expected<double> to_double(const Source& src, const json& v, const std::string& name) {
  if (!v.is_number()) return wrong_type(src, name, v, "a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) return src.invalid(field(name, v) + " is not a finite number");
  return d;
}

Expected<std::string> to_string(const Source& src, const json& v, const std::string& name) {
  if (!v.is_string()) return wrong_type(src, name, v, "a string");
  return v.get<std::string>();
}

Expected<bool> to_bool(const Source& src, const json& v, const std::string& name) {
  if (!v.is_boolean()) return wrong_type(src, name, v, "a boolean (true or false)");
  return v.get<bool>();
}

// Typed access to one JSON object. `path` ("" or e.g. "rope_parameters.compress.") prefixes the
// field names in messages so nested fields are named unambiguously.
class Obj {
 public:
  Obj(const Source& src, const json& obj, std::string path) : src_(src), obj_(obj), path_(std::move(path)) {}

  std::string name(std::string_view key) const { return path_ + std::string(key); }

  // The raw value, null included; nullptr when the key is absent.
  const json* raw(std::string_view key) const {
    const auto it = obj_.find(std::string(key));
    return it == obj_.end() ? nullptr : &*it;
  }
  // The value, with null counted as absent.
  const json* get(std::string_view key) const {
    const json* v = raw(key);
    return v == nullptr || v->is_null() ? nullptr : v;
  }

  Expected<std::optional<int64_t>> opt_int(std::string_view key) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<int64_t>();
    SPARROW_ASSIGN_OR_RETURN(const int64_t x, to_int(src_, *v, name(key)));
    return std::optional<int64_t>(x);
  }
  Expected<int64_t> req_int(std::string_view key, const std::string& why = "") const {
    const json* v = get(key);
    if (v == nullptr) return missing(key, why);
    return to_int(src_, *v, name(key));
  }
  Expected<int64_t> int_or(std::string_view key, int64_t fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    return to_int(src_, *v, name(key));
  }

  Expected<std::optional<double>> opt_double(std::string_view key) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<double>();
    SPARROW_ASSIGN_OR_RETURN(const double x, to_double(src_, *v, name(key)));
    return std::optional<double>(x);
  }
  Expected<double> req_double(std::string_view key, const std::string& why = "") const {
    const json* v = get(key);
    if (v == nullptr) return missing(key, why);
    return to_double(src_, *v, name(key));
  }
  Expected<double> double_or(std::string_view key, double fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    return to_double(src_, *v, name(key));
  }

  Expected<std::optional<bool>> opt_bool(std::string_view key) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<bool>();
    SPARROW_ASSIGN_OR_RETURN(const bool x, to_bool(src_, *v, name(key)));
    return std::optional<bool>(x);
  }
  Expected<bool> bool_or(std::string_view key, bool fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    return to_bool(src_, *v, name(key));
  }

  Expected<std::optional<std::string>> opt_string(std::string_view key) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<std::string>();
    SPARROW_ASSIGN_OR_RETURN(std::string x, to_string(src_, *v, name(key)));
    return std::optional<std::string>(std::move(x));
  }

  // nullptr when absent or null.
  Expected<const json*> opt_object(std::string_view key) const {
    const json* v = get(key);
    if (v != nullptr && !v->is_object()) return wrong_type(src_, name(key), *v, "an object");
    return v;
  }
  Expected<const json*> opt_array(std::string_view key) const {
    const json* v = get(key);
    if (v != nullptr && !v->is_array()) return wrong_type(src_, name(key), *v, "an array");
    return v;
  }

 private:
  Status missing(std::string_view key, const std::string& why) const {
    return src_.invalid("field '" + name(key) + "' is missing" + (why.empty() ? " (required)" : " (" + why + ")"));
  }

  const Source& src_;
  const json& obj_;
  std::string path_;
};

Status require_positive(const Source& src, const std::string& name, int64_t v) {
  if (v > 0) return Status::ok();
  return src.invalid(field(name, v) + " must be positive");
}
Status require_positive(const Source& src, const std::string& name, double v) {
  if (v > 0) return Status::ok();
  return src.invalid(field(name, v) + " must be positive");
}

AttentionKind kind_from_ratio(int64_t ratio) {
  if (ratio == 0) return AttentionKind::kSliding;
  return ratio == kCsaRatio ? AttentionKind::kCsa : AttentionKind::kHca;
}

const char* kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kSliding: return kSliding;
    case AttentionKind::kCsa: return kCsaName;
    case AttentionKind::kHca: return kHcaName;
  }
  return "?";
}

// The RoPE type of a rope dict: `rope_type` (transformers) or `type` (released/legacy), which must
// agree when both are written; "default" when neither is.
Expected<std::string> rope_type_of(const Source& src, const Obj& o) {
  SPARROW_ASSIGN_OR_RETURN(auto rope_type, o.opt_string("rope_type"));
  SPARROW_ASSIGN_OR_RETURN(auto type, o.opt_string("type"));
  if (rope_type && type && *rope_type != *type) {
    return src.invalid(field(o.name("rope_type"), *rope_type) + " disagrees with " + field(o.name("type"), *type));
  }
  if (rope_type) return *rope_type;
  if (type) return *type;
  return std::string("default");
}

// A RoPE base: finite (the getter checked) and > 1, since ln(theta) divides the YaRN ramp bounds
// and a base <= 1 gives no decaying frequencies.
Status check_theta(const Source& src, const std::string& name, double theta) {
  if (theta > 1.0) return Status::ok();
  return src.invalid(field(name, theta) + " must be greater than 1 (a RoPE base)");
}

class Parser {
 public:
  Parser(const Source& src, const json& root) : src_(src), root_(src, root, "") {}

  Expected<ModelConfig> run() {
    SPARROW_RETURN_IF_ERROR(parse_fixed_choices());
    SPARROW_RETURN_IF_ERROR(parse_sizes());
    SPARROW_RETURN_IF_ERROR(parse_attention_schedule());
    SPARROW_RETURN_IF_ERROR(parse_moe_schedule());
    SPARROW_RETURN_IF_ERROR(parse_indexer());
    SPARROW_RETURN_IF_ERROR(parse_rope());
    SPARROW_RETURN_IF_ERROR(parse_storage());
    SPARROW_RETURN_IF_ERROR(parse_token_ids());
    SPARROW_RETURN_IF_ERROR(validate());
    return std::move(c_);
  }

 private:
  // Fields whose every value but one describes a different model than the one Sparrow implements.
  Status parse_fixed_choices() {
    SPARROW_ASSIGN_OR_RETURN(auto model_type, root_.opt_string("model_type"));
    if (model_type && *model_type != "deepseek_v4") {
      return src_.unsupported(field("model_type", *model_type) + " is not \"deepseek_v4\"");
    }
    SPARROW_ASSIGN_OR_RETURN(auto kv_heads, root_.opt_int("num_key_value_heads"));
    if (kv_heads && *kv_heads != 1) {
      return src_.unsupported(field("num_key_value_heads", *kv_heads) +
                              " must be 1: DeepSeek-V4 attention has one shared K=V head");
    }
    SPARROW_ASSIGN_OR_RETURN(auto scoring, root_.opt_string("scoring_func"));
    if (scoring && *scoring != "sqrtsoftplus") {
      return src_.unsupported(field("scoring_func", *scoring) + " is not supported (only \"sqrtsoftplus\")");
    }
    SPARROW_ASSIGN_OR_RETURN(auto topk_method, root_.opt_string("topk_method"));
    if (topk_method && *topk_method != "noaux_tc") {
      return src_.unsupported(field("topk_method", *topk_method) + " is not supported (only \"noaux_tc\")");
    }
    SPARROW_ASSIGN_OR_RETURN(auto act, root_.opt_string("hidden_act"));
    if (act && *act != "silu") {
      return src_.unsupported(field("hidden_act", *act) + " is not supported (only \"silu\")");
    }
    // V4 has no projection biases; a checkpoint that had them would be silently mis-run.
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      SPARROW_ASSIGN_OR_RETURN(auto bias, root_.opt_bool(key));
      if (bias && *bias) return src_.unsupported(field(key, true) + " is not supported (DeepSeek-V4 has no biases)");
    }
    return Status::ok();
  }

  Status parse_sizes() {
    static constexpr struct {
      const char* key;
      int64_t ModelConfig::*dst;
    } kRequired[] = {
        {"vocab_size", &ModelConfig::vocab_size},
        {"hidden_size", &ModelConfig::hidden_size},
        {"num_hidden_layers", &ModelConfig::num_layers},
        {"num_attention_heads", &ModelConfig::num_heads},
        {"head_dim", &ModelConfig::head_dim},
        {"q_lora_rank", &ModelConfig::q_lora_rank},
        {"o_lora_rank", &ModelConfig::o_lora_rank},
        {"o_groups", &ModelConfig::o_groups},
        {"sliding_window", &ModelConfig::sliding_window},
        {"n_routed_experts", &ModelConfig::num_experts},
        {"num_experts_per_tok", &ModelConfig::experts_per_token},
        {"moe_intermediate_size", &ModelConfig::moe_intermediate},
        {"hc_mult", &ModelConfig::hc_mult},
    };
    for (const auto& f : kRequired) {
      SPARROW_ASSIGN_OR_RETURN(c_.*f.dst, root_.req_int(f.key));
      SPARROW_RETURN_IF_ERROR(require_positive(src_, f.key, c_.*f.dst));
    }

    SPARROW_ASSIGN_OR_RETURN(c_.num_shared_experts, root_.int_or("n_shared_experts", kDefaultSharedExperts));
    if (c_.num_shared_experts < 0) {
      return src_.invalid(field("n_shared_experts", c_.num_shared_experts) + " must be 0 or 1");
    }
    if (c_.num_shared_experts > 1) {
      return src_.unsupported(field("n_shared_experts", c_.num_shared_experts) +
                              ": more than one shared expert is unsupported (must be 0 or 1)");
    }
    SPARROW_ASSIGN_OR_RETURN(c_.routed_scaling_factor, root_.double_or("routed_scaling_factor", kDefaultRoutedScaling));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, "routed_scaling_factor", c_.routed_scaling_factor));
    SPARROW_ASSIGN_OR_RETURN(c_.swiglu_limit, root_.double_or("swiglu_limit", kDefaultSwigluLimit));
    if (c_.swiglu_limit < 0) {
      return src_.invalid(field("swiglu_limit", c_.swiglu_limit) + " must be >= 0 (0 = no clamp)");
    }
    SPARROW_ASSIGN_OR_RETURN(c_.norm_topk_prob, root_.bool_or("norm_topk_prob", true));
    SPARROW_ASSIGN_OR_RETURN(c_.hc_sinkhorn_iters, root_.int_or("hc_sinkhorn_iters", kDefaultSinkhornIters));
    if (c_.hc_sinkhorn_iters < 1) {
      return src_.invalid(field("hc_sinkhorn_iters", c_.hc_sinkhorn_iters) + " must be >= 1");
    }
    SPARROW_ASSIGN_OR_RETURN(c_.hc_eps, root_.double_or("hc_eps", kDefaultHcEps));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, "hc_eps", c_.hc_eps));
    SPARROW_ASSIGN_OR_RETURN(c_.rms_norm_eps, root_.double_or("rms_norm_eps", kDefaultRmsNormEps));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, "rms_norm_eps", c_.rms_norm_eps));
    SPARROW_ASSIGN_OR_RETURN(c_.max_position_embeddings,
                             root_.int_or("max_position_embeddings", kDefaultMaxPositions));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, "max_position_embeddings", c_.max_position_embeddings));
    SPARROW_ASSIGN_OR_RETURN(c_.tie_word_embeddings, root_.bool_or("tie_word_embeddings", false));
    return Status::ok();
  }

  // Per-layer attention kind and ratio from `compress_ratios` (released) and/or `layer_types` +
  // `compress_rates` (transformers). No default: transformers' fallback is V4-Pro's schedule.
  Status parse_attention_schedule() {
    const int64_t n = c_.num_layers;

    // compress_rates, with the legacy scalar kwargs folded in (they must agree when both given).
    std::optional<int64_t> rate_csa, rate_hca;
    std::string rate_csa_name = "compress_rates." + std::string(kCsaName) + " (default)";
    std::string rate_hca_name = "compress_rates." + std::string(kHcaName) + " (default)";
    SPARROW_ASSIGN_OR_RETURN(const json* rates, root_.opt_object("compress_rates"));
    if (rates != nullptr) {
      const Obj r(src_, *rates, "compress_rates.");
      for (const auto& item : rates->items()) {
        const std::string& key = item.key();
        if (item.value().is_null()) continue;
        SPARROW_ASSIGN_OR_RETURN(const int64_t rate, to_int(src_, item.value(), r.name(key)));
        if (key == kCsaName || key == kHcaName) {
          SPARROW_RETURN_IF_ERROR(require_positive(src_, r.name(key), rate));
          (key == kCsaName ? rate_csa : rate_hca) = rate;
          (key == kCsaName ? rate_csa_name : rate_hca_name) = r.name(key);
        } else if (key == kSliding) {
          if (rate != 0) {
            return src_.invalid(field(r.name(key), rate) + " must be 0 (window-only layers compress nothing)");
          }
        } else {
          return src_.invalid("field '" + r.name(key) + "' is not a DeepSeek-V4 layer type (expected \"" +
                              kCsaName + "\" or \"" + kHcaName + "\")");
        }
      }
    }
    for (const auto& [legacy, rate, rate_name] :
         {std::tuple{"compress_rate_csa", &rate_csa, &rate_csa_name},
          std::tuple{"compress_rate_hca", &rate_hca, &rate_hca_name}}) {
      SPARROW_ASSIGN_OR_RETURN(auto value, root_.opt_int(legacy));
      if (!value) continue;
      SPARROW_RETURN_IF_ERROR(require_positive(src_, legacy, *value));
      if (*rate && **rate != *value) {
        return src_.invalid(field(legacy, *value) + " disagrees with " + field(*rate_name, **rate));
      }
      *rate = value;
      *rate_name = legacy;
    }
    const int64_t csa = rate_csa.value_or(kDefaultCsaRate);
    const int64_t hca = rate_hca.value_or(kDefaultHcaRate);

    // compress_ratios: one entry per layer, then the MTP blocks.
    SPARROW_ASSIGN_OR_RETURN(const json* ratios_json, root_.opt_array("compress_ratios"));
    std::vector<int64_t> ratios;
    if (ratios_json != nullptr) {
      for (size_t i = 0; i < ratios_json->size(); ++i) {
        const std::string name = "compress_ratios[" + std::to_string(i) + "]";
        SPARROW_ASSIGN_OR_RETURN(const int64_t r, to_int(src_, (*ratios_json)[i], name));
        if (r < 0) return src_.invalid(field(name, r) + " must be >= 0 (0 = sliding window only)");
        ratios.push_back(r);
      }
      if (static_cast<int64_t>(ratios.size()) < n) {
        return src_.invalid("field 'compress_ratios' has " + num(static_cast<int64_t>(ratios.size())) +
                            " entries, fewer than num_hidden_layers = " + num(n) +
                            " (one per layer, then one per MTP block)");
      }
    }

    SPARROW_ASSIGN_OR_RETURN(const json* types_json, root_.opt_array("layer_types"));
    if (types_json == nullptr && ratios_json == nullptr) {
      return src_.invalid(
          "neither 'compress_ratios' (released schema) nor 'layer_types' (transformers schema) is present; "
          "the attention schedule has no safe default");
    }
    if (types_json != nullptr) {
      // transformers truncates longer lists to num_hidden_layers; shorter ones cannot be completed.
      if (static_cast<int64_t>(types_json->size()) < n) {
        return src_.invalid("field 'layer_types' has " + num(static_cast<int64_t>(types_json->size())) +
                            " entries, fewer than num_hidden_layers = " + num(n));
      }
      for (int64_t i = 0; i < n; ++i) {
        const std::string name = "layer_types[" + num(i) + "]";
        SPARROW_ASSIGN_OR_RETURN(const std::string type, to_string(src_, (*types_json)[i], name));
        AttentionKind kind;
        int64_t ratio = 0;
        if (type == kSliding) {
          kind = AttentionKind::kSliding;
        } else if (type == kCsaName) {
          kind = AttentionKind::kCsa;
          ratio = csa;
          if (csa != kCsaRatio) {
            return src_.unsupported(field(rate_csa_name, csa) + " (used by " + name +
                                    "): only ratio 4 is supported for compressed sparse attention (the reference "
                                    "ties the overlapping compressor and the indexer to ratio 4)");
          }
        } else if (type == kHcaName) {
          kind = AttentionKind::kHca;
          ratio = hca;
          if (hca == kCsaRatio) {
            return src_.unsupported(field(rate_hca_name, hca) + " (used by " + name +
                                    "): ratio 4 is reserved for compressed sparse attention (in the released "
                                    "schema and the reference, ratio 4 means CSA)");
          }
        } else {
          return src_.invalid(field(name, type) + " is not a DeepSeek-V4 layer type (expected \"" + kSliding +
                              "\", \"" + kCsaName + "\" or \"" + kHcaName + "\")");
        }
        if (ratios_json != nullptr) {
          const int64_t r = ratios[static_cast<size_t>(i)];
          if (kind_from_ratio(r) != kind || r != ratio) {
            return src_.invalid(field(name, type) + " (ratio " + num(ratio) + ") disagrees with " +
                                field("compress_ratios[" + num(i) + "]", r) + " (" + kind_name(kind_from_ratio(r)) +
                                ")");
          }
        }
        c_.attention.push_back(kind);
        c_.compress_ratio.push_back(ratio);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = ratios[static_cast<size_t>(i)];
        c_.attention.push_back(kind_from_ratio(r));
        c_.compress_ratio.push_back(r);
      }
    }
    if (ratios_json != nullptr) c_.mtp_compress_ratios.assign(ratios.begin() + n, ratios.end());
    return Status::ok();
  }

  // Per-layer router kind from `mlp_layer_types` (transformers) and/or `num_hash_layers` (released).
  Status parse_moe_schedule() {
    const int64_t n = c_.num_layers;
    SPARROW_ASSIGN_OR_RETURN(auto num_hash, root_.opt_int("num_hash_layers"));
    if (num_hash && *num_hash < 0) return src_.invalid(field("num_hash_layers", *num_hash) + " must be >= 0");
    SPARROW_ASSIGN_OR_RETURN(const json* types_json, root_.opt_array("mlp_layer_types"));
    int64_t leading_hash = 0;
    if (types_json != nullptr) {
      if (static_cast<int64_t>(types_json->size()) < n) {
        return src_.invalid("field 'mlp_layer_types' has " + num(static_cast<int64_t>(types_json->size())) +
                            " entries, fewer than num_hidden_layers = " + num(n));
      }
      bool seen_scored = false;
      for (int64_t i = 0; i < n; ++i) {
        const std::string name = "mlp_layer_types[" + num(i) + "]";
        SPARROW_ASSIGN_OR_RETURN(const std::string type, to_string(src_, (*types_json)[i], name));
        if (type == "hash_moe") {
          // The reference (and the released schema) hash-route exactly the layers < num_hash_layers.
          if (seen_scored) {
            return src_.unsupported(field(name, type) +
                                    " follows a \"moe\" layer: only a leading run of hash-routed layers is supported");
          }
          ++leading_hash;
        } else if (type == "moe") {
          seen_scored = true;
        } else {
          return src_.invalid(field(name, type) + " is not a DeepSeek-V4 MLP type (expected \"hash_moe\" or \"moe\")");
        }
      }
      if (num_hash && std::min(*num_hash, n) != leading_hash) {
        return src_.invalid(field("num_hash_layers", *num_hash) + " disagrees with field 'mlp_layer_types' (" +
                            num(leading_hash) + " \"hash_moe\" entries)");
      }
    } else {
      // As transformers: more hash layers than layers means every layer.
      leading_hash = std::min(num_hash.value_or(kDefaultNumHashLayers), n);
    }
    c_.moe.assign(static_cast<size_t>(n), MoeKind::kScored);
    std::fill_n(c_.moe.begin(), leading_hash, MoeKind::kHash);
    return Status::ok();
  }

  // The Lightning Indexer sizes: required only when some layer is CSA (the only user).
  Status parse_indexer() {
    const auto csa = std::find(c_.attention.begin(), c_.attention.end(), AttentionKind::kCsa);
    const bool any_csa = csa != c_.attention.end();
    const std::string why =
        any_csa ? "required because layer " + num(static_cast<int64_t>(csa - c_.attention.begin())) +
                      " is compressed sparse attention"
                : "";
    static constexpr struct {
      const char* key;
      int64_t ModelConfig::*dst;
    } kIndexer[] = {
        {"index_n_heads", &ModelConfig::index_heads},
        {"index_head_dim", &ModelConfig::index_head_dim},
        {"index_topk", &ModelConfig::index_topk},
    };
    for (const auto& f : kIndexer) {
      if (any_csa) {
        SPARROW_ASSIGN_OR_RETURN(c_.*f.dst, root_.req_int(f.key, why));
        SPARROW_RETURN_IF_ERROR(require_positive(src_, f.key, c_.*f.dst));
      } else {
        SPARROW_ASSIGN_OR_RETURN(auto v, root_.opt_int(f.key));
        if (v) SPARROW_RETURN_IF_ERROR(require_positive(src_, f.key, *v));
        c_.*f.dst = v.value_or(0);
      }
    }
    return Status::ok();
  }

  Status parse_rope() {
    SPARROW_ASSIGN_OR_RETURN(auto rope_theta, root_.opt_double("rope_theta"));
    SPARROW_ASSIGN_OR_RETURN(auto compress_theta, root_.opt_double("compress_rope_theta"));
    SPARROW_ASSIGN_OR_RETURN(const json* params, root_.opt_object("rope_parameters"));
    SPARROW_ASSIGN_OR_RETURN(const json* scaling, root_.opt_object("rope_scaling"));

    // rope_parameters is either nested ({"main": ..., "compress": ...}, what transformers writes)
    // or flat (a single YaRN dict, which transformers applies to the compressed layers only).
    const json* main_json = nullptr;
    const json* compress_json = nullptr;
    const json* flat = nullptr;
    if (params != nullptr) {
      const Obj p(src_, *params, "rope_parameters.");
      if (p.get("main") != nullptr || p.get("compress") != nullptr) {
        SPARROW_ASSIGN_OR_RETURN(main_json, p.opt_object("main"));
        SPARROW_ASSIGN_OR_RETURN(compress_json, p.opt_object("compress"));
      } else {
        flat = params;
      }
    }

    SPARROW_RETURN_IF_ERROR(parse_rope_dim(main_json, compress_json));

    // Window-only layers: plain RoPE, never YaRN.
    if (main_json != nullptr) {
      const Obj m(src_, *main_json, "rope_parameters.main.");
      SPARROW_ASSIGN_OR_RETURN(const std::string type, rope_type_of(src_, m));
      if (type != "default") {
        return src_.unsupported(field(m.name("rope_type"), type) +
                                " is not supported: DeepSeek-V4's window-only layers use plain RoPE (\"default\")");
      }
      SPARROW_ASSIGN_OR_RETURN(auto theta, m.opt_double("rope_theta"));
      SPARROW_RETURN_IF_ERROR(set_theta(&c_.rope_main, theta, m.name("rope_theta"), rope_theta, kDefaultRopeTheta,
                                        "rope_theta"));
    } else {
      SPARROW_RETURN_IF_ERROR(
          set_theta(&c_.rope_main, std::nullopt, "", rope_theta, kDefaultRopeTheta, "rope_theta"));
    }

    // Compressed layers: compress_rope_theta, YaRN when the dict says so.
    if (compress_json != nullptr) {
      const Obj cp(src_, *compress_json, "rope_parameters.compress.");
      SPARROW_ASSIGN_OR_RETURN(auto theta, cp.opt_double("rope_theta"));
      SPARROW_RETURN_IF_ERROR(set_theta(&c_.rope_compress, theta, cp.name("rope_theta"), compress_theta,
                                        kDefaultCompressRopeTheta, "compress_rope_theta"));
      return parse_compress_scaling(cp);
    }
    // A flat dict's own rope_theta is the main one (transformers overrides it with
    // compress_rope_theta for the compressed layers), so the base comes from compress_rope_theta.
    SPARROW_RETURN_IF_ERROR(set_theta(&c_.rope_compress, std::nullopt, "", compress_theta,
                                      kDefaultCompressRopeTheta, "compress_rope_theta"));
    if (flat != nullptr) return parse_compress_scaling(Obj(src_, *flat, "rope_parameters."));
    if (scaling != nullptr) return parse_compress_scaling(Obj(src_, *scaling, "rope_scaling."));
    return Status::ok();
  }

  // theta from the rope dict if given, else from the top-level field, else the default.
  Status set_theta(RopeConfig* rope, std::optional<double> own, const std::string& own_name,
                   std::optional<double> top, double fallback, const char* top_name) {
    if (own) {
      SPARROW_RETURN_IF_ERROR(check_theta(src_, own_name, *own));
      rope->theta = *own;
    } else if (top) {
      SPARROW_RETURN_IF_ERROR(check_theta(src_, top_name, *top));
      rope->theta = *top;
    } else {
      rope->theta = fallback;
    }
    return Status::ok();
  }

  // YaRN (or none) for the compressed layers from a rope dict: rope_scaling, a flat rope_parameters
  // or rope_parameters.compress.
  Status parse_compress_scaling(const Obj& o) {
    RopeConfig& rope = c_.rope_compress;
    SPARROW_ASSIGN_OR_RETURN(const std::string type, rope_type_of(src_, o));
    if (type == "default") {
      rope.yarn = false;
      return Status::ok();
    }
    if (type != "yarn") {
      const std::string key = o.get("rope_type") != nullptr ? "rope_type" : "type";
      return src_.unsupported(field(o.name(key), type) + " is not supported (only \"yarn\" or \"default\")");
    }
    rope.yarn = true;
    SPARROW_ASSIGN_OR_RETURN(rope.yarn_factor, o.req_double("factor", "required for YaRN"));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, o.name("factor"), rope.yarn_factor));
    SPARROW_ASSIGN_OR_RETURN(rope.yarn_original_max_position,
                             o.req_int("original_max_position_embeddings", "required for YaRN"));
    SPARROW_RETURN_IF_ERROR(
        require_positive(src_, o.name("original_max_position_embeddings"), rope.yarn_original_max_position));
    SPARROW_ASSIGN_OR_RETURN(rope.yarn_beta_fast, o.double_or("beta_fast", kDefaultYarnBetaFast));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, o.name("beta_fast"), rope.yarn_beta_fast));
    SPARROW_ASSIGN_OR_RETURN(rope.yarn_beta_slow, o.double_or("beta_slow", kDefaultYarnBetaSlow));
    SPARROW_RETURN_IF_ERROR(require_positive(src_, o.name("beta_slow"), rope.yarn_beta_slow));
    if (rope.yarn_beta_fast <= rope.yarn_beta_slow) {
      return src_.invalid(field(o.name("beta_fast"), rope.yarn_beta_fast) + " must exceed " +
                          field(o.name("beta_slow"), rope.yarn_beta_slow));
    }
    // V4 changes frequencies only. transformers would otherwise scale cos/sin by
    // 0.1*ln(factor)+1 (1.277 at factor 16), which is why its V4 config pins 1.0.
    SPARROW_ASSIGN_OR_RETURN(auto attention_factor, o.opt_double("attention_factor"));
    if (attention_factor && *attention_factor != 1.0) {
      return src_.unsupported(field(o.name("attention_factor"), *attention_factor) +
                              " is not supported: DeepSeek-V4 applies no YaRN attention factor (mscale); "
                              "only 1.0 is accepted");
    }
    // The reference rounds the ramp bounds outward (floor/ceil), which is transformers' truncate.
    SPARROW_ASSIGN_OR_RETURN(auto truncate, o.opt_bool("truncate"));
    if (truncate && !*truncate) {
      return src_.unsupported(field(o.name("truncate"), false) +
                              " is not supported: DeepSeek-V4's YaRN rounds the ramp bounds (truncate = true)");
    }
    return Status::ok();
  }

  // rope_dim from qk_rope_head_dim (released) and/or partial_rotary_factor (transformers, top-level
  // or inside rope_parameters.main/compress); every spelling given must agree.
  Status parse_rope_dim(const json* main_json, const json* compress_json) {
    struct Spelling {
      std::string desc;  // "field 'x' = v", for messages
      int64_t dim;
    };
    std::vector<Spelling> found;
    auto add_factor = [&](const Obj& o, const char* key) -> Status {
      SPARROW_ASSIGN_OR_RETURN(auto f, o.opt_double(key));
      if (!f) return Status::ok();
      SPARROW_ASSIGN_OR_RETURN(const int64_t dim, factor_to_dim(o.name(key), *f));
      found.push_back({field(o.name(key), *f), dim});
      return Status::ok();
    };
    SPARROW_RETURN_IF_ERROR(add_factor(root_, "partial_rotary_factor"));
    if (main_json != nullptr) {
      SPARROW_RETURN_IF_ERROR(add_factor(Obj(src_, *main_json, "rope_parameters.main."), "partial_rotary_factor"));
    }
    if (compress_json != nullptr) {
      SPARROW_RETURN_IF_ERROR(
          add_factor(Obj(src_, *compress_json, "rope_parameters.compress."), "partial_rotary_factor"));
    }
    SPARROW_ASSIGN_OR_RETURN(auto qk, root_.opt_int("qk_rope_head_dim"));
    if (qk) found.push_back({field("qk_rope_head_dim", *qk), *qk});

    if (found.empty()) {
      SPARROW_ASSIGN_OR_RETURN(c_.rope_dim,
                               factor_to_dim("partial_rotary_factor (default)", kDefaultPartialRotaryFactor));
      rope_dim_desc_ = "the default partial_rotary_factor 0.125 (head_dim = " + num(c_.head_dim) + ")";
    } else {
      for (size_t i = 1; i < found.size(); ++i) {
        if (found[i].dim != found[0].dim) {
          return src_.invalid(found[i].desc + " gives rope dim " + num(found[i].dim) + ", but " + found[0].desc +
                              " gives " + num(found[0].dim) + " (head_dim = " + num(c_.head_dim) + ")");
        }
      }
      c_.rope_dim = found[0].dim;
      rope_dim_desc_ = found[0].desc;
      if (found[0].desc.find("factor") != std::string::npos) {
        rope_dim_desc_ += " (rope dim " + num(c_.rope_dim) + ")";
      }
    }
    return Status::ok();
  }

  // round(head_dim * factor), which must be a whole number of dims.
  Expected<int64_t> factor_to_dim(const std::string& name, double factor) {
    if (!(factor > 0.0 && factor <= 1.0)) return src_.invalid(field(name, factor) + " must be in (0, 1]");
    const double dims = static_cast<double>(c_.head_dim) * factor;
    const double rounded = std::round(dims);
    if (std::fabs(dims - rounded) > 1e-6 * std::max(1.0, dims)) {
      return src_.invalid(field(name, factor) + " times head_dim = " + num(c_.head_dim) + " is " + num(dims) +
                          ", not a whole number of dims");
    }
    return static_cast<int64_t>(rounded);
  }

  // Weight storage: fp8 block-quantised linears and the routed experts' dtype.
  Status parse_storage() {
    SPARROW_ASSIGN_OR_RETURN(const json* quant, root_.opt_object("quantization_config"));
    if (quant != nullptr) {
      const Obj q(src_, *quant, "quantization_config.");
      SPARROW_ASSIGN_OR_RETURN(auto method, q.opt_string("quant_method"));
      if (method && *method != "fp8") {
        return src_.unsupported(field(q.name("quant_method"), *method) + " is not supported (only \"fp8\")");
      }
      SPARROW_ASSIGN_OR_RETURN(auto fmt, q.opt_string("fmt"));
      if (fmt && *fmt != "e4m3") {
        return src_.unsupported(field(q.name("fmt"), *fmt) + " is not supported (only \"e4m3\")");
      }
      SPARROW_ASSIGN_OR_RETURN(const json* block, q.opt_array("weight_block_size"));
      if (block != nullptr) {
        const bool ok = block->size() == 2 && (*block)[0] == kFp8BlockSize && (*block)[1] == kFp8BlockSize;
        if (!ok) {
          return src_.unsupported(field(q.name("weight_block_size"), *block) +
                                  " is not supported (only [128, 128])");
        }
      }
      c_.fp8_weights = true;  // fmt absent means e4m3, transformers' FP8 default
    }
    SPARROW_ASSIGN_OR_RETURN(auto expert_dtype, root_.opt_string("expert_dtype"));
    if (expert_dtype) {
      if (*expert_dtype != "fp4" && *expert_dtype != "fp8") {
        return src_.unsupported(field("expert_dtype", *expert_dtype) + " is not supported (\"fp4\" or \"fp8\")");
      }
      c_.expert_dtype = *expert_dtype;
    }
    return Status::ok();
  }

  // bos/eos: absent -> transformers defaults 0/1; null -> -1 (none); eos may be a list (first wins).
  Status parse_token_ids() {
    const json* bos = root_.raw("bos_token_id");
    if (bos == nullptr) {
      c_.bos_token_id = kDefaultBos;
    } else if (bos->is_null()) {
      c_.bos_token_id = -1;
    } else {
      SPARROW_ASSIGN_OR_RETURN(c_.bos_token_id, to_int(src_, *bos, "bos_token_id"));
      SPARROW_RETURN_IF_ERROR(check_token_id("bos_token_id", c_.bos_token_id));
    }

    const json* eos = root_.raw("eos_token_id");
    if (eos == nullptr) {
      c_.eos_token_id = kDefaultEos;
    } else if (eos->is_null()) {
      c_.eos_token_id = -1;
    } else if (eos->is_array()) {
      c_.eos_token_id = -1;
      for (size_t i = 0; i < eos->size(); ++i) {
        const std::string name = "eos_token_id[" + std::to_string(i) + "]";
        SPARROW_ASSIGN_OR_RETURN(const int64_t id, to_int(src_, (*eos)[i], name));
        SPARROW_RETURN_IF_ERROR(check_token_id(name, id));
        if (i == 0) c_.eos_token_id = id;
      }
    } else if (eos->is_number()) {
      SPARROW_ASSIGN_OR_RETURN(c_.eos_token_id, to_int(src_, *eos, "eos_token_id"));
      SPARROW_RETURN_IF_ERROR(check_token_id("eos_token_id", c_.eos_token_id));
    } else {
      return wrong_type(src_, "eos_token_id", *eos, "an integer, a list of integers or null");
    }
    return Status::ok();
  }

  Status check_token_id(const std::string& name, int64_t id) {
    if (id >= 0 && id < c_.vocab_size) return Status::ok();
    return src_.invalid(field(name, id) + " is outside the vocabulary [0, vocab_size = " + num(c_.vocab_size) + ")");
  }

  // Cross-field checks.
  Status validate() {
    if (c_.num_heads % c_.o_groups != 0) {
      return src_.invalid(field("o_groups", c_.o_groups) + " must divide num_attention_heads = " + num(c_.num_heads));
    }
    if (c_.experts_per_token > c_.num_experts) {
      return src_.invalid(field("num_experts_per_tok", c_.experts_per_token) +
                          " must not exceed n_routed_experts = " + num(c_.num_experts));
    }
    // RoPE rotates (even, odd) pairs of the trailing rope_dim dims of each head.
    if (c_.rope_dim <= 0 || c_.rope_dim > c_.head_dim) {
      return src_.invalid(rope_dim_desc_ + " must be in (0, head_dim = " + num(c_.head_dim) + "]");
    }
    if (c_.rope_dim % 2 != 0) return src_.invalid(rope_dim_desc_ + " must be even (RoPE rotates pairs)");
    const bool any_csa = std::find(c_.attention.begin(), c_.attention.end(), AttentionKind::kCsa) != c_.attention.end();
    if (any_csa && c_.rope_dim > c_.index_head_dim) {
      return src_.invalid(rope_dim_desc_ + " must not exceed index_head_dim = " + num(c_.index_head_dim) +
                          " (the indexer ropes its last rope_dim dims)");
    }
    return Status::ok();
  }

  const Source& src_;
  Obj root_;
  ModelConfig c_;
  std::string rope_dim_desc_;  // where rope_dim came from, for messages
};

}  // namespace

Expected<ModelConfig> model_config_from_json(std::string_view json_text, std::string_view source) {
  const Source src(source);
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return src.corrupt(std::string("malformed JSON: ") + e.what());
  }
  if (!root.is_object()) return src.corrupt(std::string("the top level is ") + a_type(root) + ", expected an object");
  return Parser(src, root).run();
}

Expected<ModelConfig> model_config_load(const std::filesystem::path& dir_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = dir_or_file;
  if (fs::is_directory(file, ec)) file /= "config.json";
  if (!fs::exists(file, ec)) return Status::not_found(file.string() + ": not found");
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::io_error(file.string() + ": cannot open: " + std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::io_error(file.string() + ": read failed: " + std::strerror(errno));
  return model_config_from_json(text, file.string());
}

std::string model_config_to_released_json(const ModelConfig& c) {
  // ordered_json keeps the released file's field order, which makes diffs against it readable.
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.rope_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_lora_rank"] = c.o_lora_rank;
  j["o_groups"] = c.o_groups;
  j["sliding_window"] = c.sliding_window;
  std::vector<int64_t> ratios = c.compress_ratio;
  ratios.insert(ratios.end(), c.mtp_compress_ratios.begin(), c.mtp_compress_ratios.end());
  j["compress_ratios"] = ratios;
  j["compress_rope_theta"] = c.rope_compress.theta;
  j["rope_theta"] = c.rope_main.theta;
  if (c.rope_compress.yarn) {
    j["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", c.rope_compress.yarn_factor},
        {"original_max_position_embeddings", c.rope_compress.yarn_original_max_position},
        {"beta_fast", c.rope_compress.yarn_beta_fast},
        {"beta_slow", c.rope_compress.yarn_beta_slow},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  // Zero means "not given" (no CSA layer); writing 0 would fail the positivity check on re-read.
  if (c.index_heads > 0) j["index_n_heads"] = c.index_heads;
  if (c.index_head_dim > 0) j["index_head_dim"] = c.index_head_dim;
  if (c.index_topk > 0) j["index_topk"] = c.index_topk;
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = c.num_shared_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["moe_intermediate_size"] = c.moe_intermediate;
  // The parser only accepts a leading run of hash layers, so the run length says it all.
  const auto first_scored = std::find(c.moe.begin(), c.moe.end(), MoeKind::kScored);
  j["num_hash_layers"] = static_cast<int64_t>(first_scored - c.moe.begin());
  j["scoring_func"] = "sqrtsoftplus";
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["swiglu_limit"] = c.swiglu_limit;
  j["hidden_act"] = "silu";
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (!c.expert_dtype.empty()) j["expert_dtype"] = c.expert_dtype;
  if (c.fp8_weights) {
    j["quantization_config"] = {
        {"activation_scheme", "dynamic"},
        {"fmt", "e4m3"},
        {"quant_method", "fp8"},
        {"weight_block_size", {kFp8BlockSize, kFp8BlockSize}},
    };
  }
  j["bos_token_id"] = c.bos_token_id >= 0 ? nlohmann::ordered_json(c.bos_token_id) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = c.eos_token_id >= 0 ? nlohmann::ordered_json(c.eos_token_id) : nlohmann::ordered_json(nullptr);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  return j.dump(2) + "\n";
}

}  // namespace sparrow
