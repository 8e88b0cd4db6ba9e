// Indexer recall (`sparrow recall`): how much of the exact fp32 top-k selection each CSA layer
// keeps when its indexer keys are stored in a lower precision or index_topk changes.
//
// Method: one fp32 run records every CSA layer's selection; each variant then runs with those
// selections imposed (so every layer sees exactly the reference inputs) and records what its own
// indexer would have picked. Overlap = |own ∩ ref| / |ref| per query, over the queries that see
// more entries than k (the others keep everything whatever the precision).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/quant_sim.h"
#include "model/model.h"
#include "ops/backend.h"
#include "sparrow/status.h"

namespace sparrow {

struct RecallRow {
  int64_t layer = 0;
  std::string keys;         // key precision of the variant
  int64_t topk = 0;         // index_topk of the variant
  int64_t contested = 0;    // queries that see more than topk entries
  double mean_overlap = 1;  // over contested queries (1 when there are none)
  double min_overlap = 1;
};

struct RecallOptions {
  std::vector<KeyPrecision> keys = {KeyPrecision::kBf16, KeyPrecision::kFp8, KeyPrecision::kFp4};
  int64_t topk = 0;  // 0: the config's index_topk
  // Numerics of the measured side; the reference selections are always fp32's (forced upstream, so
  // each layer's indexer is measured on the same inputs it would see in the reference run).
  Precision precision = Precision::kFp32;
};

Expected<std::vector<RecallRow>> indexer_recall(const std::filesystem::path& model_dir, Backend& backend,
                                                const std::vector<int32_t>& ids, const RecallOptions& options);

std::string recall_table_text(const std::vector<RecallRow>& rows, int64_t num_tokens);
std::string recall_table_json(const std::vector<RecallRow>& rows, int64_t num_tokens);

}  // namespace sparrow
