// CheckpointWriter: the streaming, sharded safetensors writer behind `sparrow quantize` and
// `sparrow synth`. Its output must read back through SafetensorsCheckpoint (index and shards)
// byte for byte, whatever the chunking of the appends.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "io/safetensors.h"
#include "model/test_model.h"
#include "tools/checkpoint_writer.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

std::vector<PlannedTensor> plan() {
  return {{"a", DType::kF32, {3, 5}, 0},  {"a.scale", DType::kF8E8M0, {1, 1}, 0}, {"empty", DType::kBF16, {0, 4}, 1},
          {"b", DType::kI64, {7}, 2},     {"c", DType::kU8, {1000}, 3},           {"d", DType::kBF16, {2, 2}, 4}};
}

TEST(QuantWriter, ShardsReadBackWhateverTheChunking) {
  const fs::path dir = testing::make_temp_dir("writer");
  auto w = CheckpointWriter::create(dir, plan(), /*max_shard_bytes=*/64);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const uint64_t total = (*w)->total_bytes();
  EXPECT_EQ(total, 60u + 1 + 0 + 56 + 1000 + 8);
  std::vector<uint8_t> bytes(total);
  std::iota(bytes.begin(), bytes.end(), 0);
  // Odd chunk sizes that straddle tensor and shard boundaries.
  for (size_t at = 0, step = 1; at < total; at += step, step = step * 3 % 37 + 1)
    ASSERT_TRUE((*w)->append(bytes.data() + at, std::min<size_t>(step, total - at)).is_ok());
  ASSERT_TRUE((*w)->finish().is_ok());
  // 61 bytes (a + its scale: one group) fit a shard; b and c and d do not fit with them.
  EXPECT_EQ((*w)->num_shards(), 4u);
  EXPECT_EQ((*w)->written_bytes(), total);
  // Within the first shard the larger elements come first: a (F32), empty (BF16), a.scale (E8M0).
  const std::vector<size_t> order = (*w)->file_order();
  EXPECT_EQ(order, (std::vector<size_t>{0, 2, 1, 3, 4, 5}));
  w.value().reset();

  auto ckpt = SafetensorsCheckpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ((*ckpt)->num_files(), 4u);
  size_t at = 0;
  const std::vector<PlannedTensor> planned = plan();
  for (size_t i : order) {
    const PlannedTensor& p = planned[i];
    const TensorView* t = (*ckpt)->find(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    EXPECT_EQ(t->dtype, p.dtype);
    EXPECT_EQ(t->shape, p.shape);
    EXPECT_EQ(std::memcmp(t->data, bytes.data() + at, t->nbytes), 0) << p.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % dtype_size(t->dtype), 0u) << p.name << " is not aligned";
    at += t->nbytes;
  }
  // The weight and its scale share a shard; the index says where everything is.
  std::ifstream in(dir / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["a.scale"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00004-of-00004.safetensors");
  fs::remove_all(dir);
}

TEST(QuantWriter, ShortAndLongInputAreErrorsNamingTheTensor) {
  const fs::path dir = testing::make_temp_dir("writer_err");
  auto w = CheckpointWriter::create(dir, plan());
  ASSERT_TRUE(w.is_ok());
  // One shard, stored b (I64, 56 bytes), a (F32, 60), empty, d (BF16), a.scale, c: 100 bytes
  // end inside a.
  std::vector<uint8_t> bytes(100);
  ASSERT_TRUE((*w)->append(bytes.data(), 100).is_ok());
  const Status st = (*w)->finish();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'a' got 44 of its 60 bytes"), std::string::npos) << st.message();
  std::vector<uint8_t> lots(5000);
  EXPECT_EQ((*w)->append(lots.data(), lots.size()).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(CheckpointWriter::create(dir, {}).is_ok());
  EXPECT_FALSE(CheckpointWriter::create(dir, {{"x", DType::kF32, {1}, 0}, {"x", DType::kF32, {1}, 1}}).is_ok());
  EXPECT_FALSE(CheckpointWriter::create(dir, {{"x", DType::kF32, {-1}, 0}}).is_ok());
  w.value().reset();
  fs::remove_all(dir);
}

TEST(QuantWriter, UnwritableDirectoryIsAnIoError) {
  auto w = CheckpointWriter::create("/proc/sparrow_cannot_write_here", plan());
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().code(), StatusCode::kIoError) << w.status().to_string();
}

}  // namespace
}  // namespace sparrow
