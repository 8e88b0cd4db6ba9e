// A streaming writer for sharded safetensors checkpoints whose tensor list is known up front.
//
// The headers are computed from the plan before any data exists, so a checkpoint far larger than
// memory (a 43-layer V4-Flash is about 160 GB) is written by appending each tensor's bytes in plan
// order, a chunk at a time. Layout as the release ships it: `model-00001-of-0000N.safetensors`
// shards of at most `max_shard_bytes` of data each (a group larger than that gets a shard of its
// own) and `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}). Each
// shard's header is `{"__metadata__": {"format": "pt"}, name: {dtype, shape, data_offsets}, ...}`
// padded with spaces so the data section starts 8-byte aligned. Within a shard the tensors are
// stored by element size, largest first, in plan order otherwise (as the safetensors library
// orders them), so every tensor's data is aligned to its element size with no gaps between
// tensors; append() therefore takes the bytes in file_order(), not in plan order.
// append() copies into 16 MiB blocks that a background thread writes, so producing the next chunk
// overlaps the disk; at most a few blocks wait (bounded memory). A write error surfaces at the next
// append() or at finish(). Not thread-safe; one writer per checkpoint, used from one thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "sparrow/status.h"

namespace sparrow {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Consecutive tensors with the same group are never split across shards (a weight and its scale).
  int64_t group = 0;
};

// The release's shards hold about 3.5 GB each (48 shards for 166.9 GB, spec §2.1).
inline constexpr uint64_t kReleaseShardBytes = uint64_t{3'500'000'000};

class CheckpointWriter {
 public:
  // Creates `dir` if needed and plans the shards. Files of the same names there are overwritten;
  // other files are left alone (the index names exactly the shards written).
  // Errors: InvalidArgument (empty plan, bad name, duplicate name, negative dim), IoError.
  static Expected<std::unique_ptr<CheckpointWriter>> create(const std::filesystem::path& dir,
                                                            std::vector<PlannedTensor> plan,
                                                            uint64_t max_shard_bytes = kReleaseShardBytes);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Plan indices in the order their data is stored: shard by shard, by element size within one.
  const std::vector<size_t>& file_order() const { return order_; }

  // Appends the next `n` bytes of data, continuing the current tensor and moving on to the next
  // tensor (and shard) in file_order(). Errors: InvalidArgument (more bytes than planned), IoError.
  Status append(const void* data, size_t n);

  // REQUIRES: every planned byte appended (else InvalidArgument naming the tensor that is short).
  // Closes the last shard and writes the index.
  Status finish();

  uint64_t total_bytes() const { return total_bytes_; }
  // Bytes appended so far (some may still be on their way to the disk).
  uint64_t written_bytes() const { return appended_bytes_; }
  size_t num_shards() const { return shards_.size(); }

 private:
  struct Shard {
    std::string file_name;
    size_t first = 0, end = 0;  // positions [first, end) of order_
    std::string header;         // length-prefixed, padded header bytes
  };
  CheckpointWriter() = default;
  Status open_shard(size_t s);
  Status close_shard();
  Status write_block(const uint8_t* p, size_t n);  // writer thread: data into tensors and shards
  void writer_loop();
  Status push_block();                             // hands block_ to the writer thread
  Status stop_thread();                            // drains the queue, joins, returns its error

  std::filesystem::path dir_;
  std::vector<PlannedTensor> plan_;
  std::vector<uint64_t> nbytes_;  // per planned tensor
  std::vector<size_t> order_;     // file order: position -> plan index
  std::vector<Shard> shards_;
  uint64_t total_bytes_ = 0, appended_bytes_ = 0;
  std::vector<uint8_t> block_;    // being filled by append()

  // Owned by the writer thread while it runs.
  size_t shard_ = 0;              // shard being written
  size_t tensor_ = 0;             // position in order_ of the tensor being written
  uint64_t tensor_done_ = 0;      // bytes of it already written
  std::FILE* file_ = nullptr;

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;  // guarded by mu_
  bool closing_ = false;                    // guarded by mu_
  Status error_;                            // guarded by mu_: the writer thread's first error
  bool finished_ = false;
};

}  // namespace sparrow
