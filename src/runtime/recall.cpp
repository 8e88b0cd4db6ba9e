#include "runtime/recall.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "model/model.h"
#include "runtime/taps.h"

namespace sparrow {

Expected<std::vector<RecallRow>> indexer_recall(const std::filesystem::path& model_dir, Backend& backend,
                                                const std::vector<int32_t>& ids, const RecallOptions& options) {
  ModelOverrides base;
  if (options.topk > 0) base.index_topk = options.topk;
  SPARROW_ASSIGN_OR_RETURN(auto reference_model, Model::load(model_dir, base));
  const ModelConfig& c = reference_model->config();
  SPARROW_ASSIGN_OR_RETURN(auto reference, taps_run(*reference_model, backend, ids, "*.indexer.topk"));
  ForcedDecisions forced;
  for (const TapRecord& r : reference) forced[r.name] = r.i32;

  std::vector<RecallRow> rows;
  for (KeyPrecision keys : options.keys) {
    ModelOverrides ov = base;
    ov.index_keys = keys;
    ov.precision = options.precision;
    SPARROW_ASSIGN_OR_RETURN(auto model, Model::load(model_dir, ov));
    SPARROW_ASSIGN_OR_RETURN(auto own, taps_run(*model, backend, ids, "*.indexer.topk_own", &forced));
    for (const TapRecord& r : own) {
      const int64_t layer = tap_layer(r.name);
      const std::vector<int32_t>& ref = forced.at("L" + std::to_string(layer) + ".attn.indexer.topk");
      const int64_t T = r.shape[0], k = r.shape[1];
      RecallRow row{.layer = layer, .keys = key_precision_name(keys), .topk = c.index_topk};
      double sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        if ((t + 1) / c.compress_ratio[layer] <= k) continue;  // every entry is kept: nothing to lose
        std::set<int32_t> mine(r.i32.begin() + t * k, r.i32.begin() + (t + 1) * k);
        int64_t common = 0, total = 0;
        for (int64_t i = 0; i < k; ++i) {
          const int32_t w = ref[t * k + i];
          if (w < 0) continue;
          ++total;
          common += mine.count(w);
        }
        const double ov = total ? static_cast<double>(common) / static_cast<double>(total) : 1.0;
        sum += ov;
        row.min_overlap = std::min(row.min_overlap, ov);
        ++row.contested;
      }
      row.mean_overlap = row.contested ? sum / static_cast<double>(row.contested) : 1.0;
      rows.push_back(row);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const RecallRow& a, const RecallRow& b) { return a.layer < b.layer; });
  if (rows.empty())
    return Status::invalid_argument(model_dir.string() + ": the model has no CSA layer, so no indexer to measure");
  return rows;
}

std::string recall_table_text(const std::vector<RecallRow>& rows, int64_t num_tokens) {
  std::ostringstream o;
  char line[160];
  std::snprintf(line, sizeof line, "tokens %lld\n%-6s %-5s %6s %10s %13s %12s\n", static_cast<long long>(num_tokens),
                "layer", "keys", "topk", "contested", "mean overlap", "min overlap");
  o << line;
  for (const RecallRow& r : rows) {
    std::snprintf(line, sizeof line, "%-6lld %-5s %6lld %10lld %13.4f %12.4f\n", static_cast<long long>(r.layer),
                  r.keys.c_str(), static_cast<long long>(r.topk), static_cast<long long>(r.contested),
                  r.mean_overlap, r.min_overlap);
    o << line;
  }
  return o.str();
}

std::string recall_table_json(const std::vector<RecallRow>& rows, int64_t num_tokens) {
  std::ostringstream o;
  o << "{\"tokens\": " << num_tokens << ", \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const RecallRow& r = rows[i];
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "{\"layer\": %lld, \"keys\": \"%s\", \"topk\": %lld, \"contested\": %lld, \"mean_overlap\": %.6g, "
                  "\"min_overlap\": %.6g}",
                  static_cast<long long>(r.layer), r.keys.c_str(), static_cast<long long>(r.topk),
                  static_cast<long long>(r.contested), r.mean_overlap, r.min_overlap);
    o << (i ? ", " : "") << buf;
  }
  o << "]}";
  return o.str();
}

}  // namespace sparrow
