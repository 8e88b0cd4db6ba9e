#include "tools/checkpoint_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace sparrow {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Blocks handed to the writer thread, and how many may wait: bounds the memory at about 80 MiB.
constexpr size_t kBlockBytes = size_t{16} << 20;
constexpr size_t kQueueDepth = 4;

std::string shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

std::string io_message(const fs::path& path, const char* what) {
  return path.string() + ": " + what + ": " + std::strerror(errno);
}

}  // namespace

CheckpointWriter::~CheckpointWriter() {
  (void)stop_thread();
  if (file_ != nullptr) std::fclose(file_);
}

Expected<std::unique_ptr<CheckpointWriter>> CheckpointWriter::create(const fs::path& dir, std::vector<PlannedTensor> plan,
                                                                     uint64_t max_shard_bytes) {
  if (plan.empty()) return Status::invalid_argument(dir.string() + ": no tensors to write");
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->dir_ = dir;
  std::set<std::string> names;
  for (const PlannedTensor& t : plan) {
    if (t.name.empty() || t.name == "__metadata__")
      return Status::invalid_argument(dir.string() + ": invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second)
      return Status::invalid_argument(dir.string() + ": tensor '" + t.name + "' planned twice");
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) return Status::invalid_argument(dir.string() + ": tensor '" + t.name + "' has a negative dimension");
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
        return Status::invalid_argument(dir.string() + ": tensor '" + t.name + "' is too large");
    }
    w->nbytes_.push_back(n);
    w->total_bytes_ += n;
  }
  w->plan_ = std::move(plan);

  // Shards: whole groups, filled up to max_shard_bytes.
  std::vector<std::pair<size_t, size_t>> ranges;
  uint64_t in_shard = 0;
  size_t start = 0;
  for (size_t i = 0; i < w->plan_.size();) {
    size_t j = i;
    uint64_t group_bytes = 0;
    while (j < w->plan_.size() && w->plan_[j].group == w->plan_[i].group) group_bytes += w->nbytes_[j++];
    if (i > start && in_shard + group_bytes > max_shard_bytes) {
      ranges.push_back({start, i});
      start = i;
      in_shard = 0;
    }
    in_shard += group_bytes;
    i = j;
  }
  ranges.push_back({start, w->plan_.size()});

  // Largest elements first within each shard: element sizes are powers of two and every tensor's
  // byte count is a multiple of its element size, so each tensor starts aligned to it.
  for (const auto& [first, end] : ranges) {
    const size_t at = w->order_.size();
    for (size_t i = first; i < end; ++i) w->order_.push_back(i);
    std::stable_sort(w->order_.begin() + at, w->order_.end(), [&](size_t a, size_t b) {
      return dtype_size(w->plan_[a].dtype) > dtype_size(w->plan_[b].dtype);
    });
  }

  try {  // dump() throws on names that are not valid UTF-8
    for (size_t s = 0; s < ranges.size(); ++s) {
      Shard shard;
      shard.file_name = shard_file_name(s, ranges.size());
      shard.first = ranges[s].first;
      shard.end = ranges[s].second;
      // Built entry by entry so the file keeps file order (a json object would sort the keys).
      std::string text = "{\"__metadata__\":{\"format\":\"pt\"}";
      uint64_t offset = 0;
      for (size_t pos = shard.first; pos < shard.end; ++pos) {
        const size_t i = w->order_[pos];
        const PlannedTensor& t = w->plan_[i];
        json entry = json::object();
        entry["dtype"] = dtype_name(t.dtype);
        entry["shape"] = t.shape;
        entry["data_offsets"] = json::array({offset, offset + w->nbytes_[i]});
        text += "," + json(t.name).dump() + ":" + entry.dump();
        offset += w->nbytes_[i];
      }
      text += "}";
      text.append((8 - text.size() % 8) % 8, ' ');
      const uint64_t len = text.size();
      std::string header(8, '\0');
      for (int b = 0; b < 8; ++b) header[b] = static_cast<char>(len >> (8 * b));
      shard.header = header + text;
      w->shards_.push_back(std::move(shard));
    }
  } catch (const json::exception& e) {
    return Status::invalid_argument(dir.string() + ": cannot encode a header: " + e.what());
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::io_error(dir.string() + ": cannot create directory: " + ec.message());
  SPARROW_RETURN_IF_ERROR(w->open_shard(0));
  w->block_.reserve(kBlockBytes);
  w->thread_ = std::thread([raw = w.get()] { raw->writer_loop(); });
  return w;
}

Status CheckpointWriter::open_shard(size_t s) {
  shard_ = s;
  const fs::path path = dir_ / shards_[s].file_name;
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) return Status::io_error(io_message(path, "cannot create"));
  const std::string& h = shards_[s].header;
  if (std::fwrite(h.data(), 1, h.size(), file_) != h.size()) return Status::io_error(io_message(path, "write failed"));
  return Status::ok();
}

Status CheckpointWriter::close_shard() {
  const fs::path path = dir_ / shards_[shard_].file_name;
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) return Status::io_error(io_message(path, "close failed"));
  return Status::ok();
}

Status CheckpointWriter::append(const void* data, size_t n) {
  if (appended_bytes_ + n > total_bytes_)
    return Status::invalid_argument(dir_.string() + ": " + std::to_string(appended_bytes_ + n - total_bytes_) +
                                    " bytes appended past the last tensor");
  const auto* p = static_cast<const uint8_t*>(data);
  appended_bytes_ += n;
  while (n > 0) {
    const size_t take = std::min(n, kBlockBytes - block_.size());
    block_.insert(block_.end(), p, p + take);
    p += take;
    n -= take;
    if (block_.size() == kBlockBytes) SPARROW_RETURN_IF_ERROR(push_block());
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status CheckpointWriter::push_block() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.size() < kQueueDepth || !error_.is_ok(); });
  if (!error_.is_ok()) return error_;
  queue_.push_back(std::move(block_));
  block_ = std::vector<uint8_t>();
  block_.reserve(kBlockBytes);
  cv_.notify_all();
  return Status::ok();
}

void CheckpointWriter::writer_loop() {
  for (;;) {
    std::vector<uint8_t> block;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
      if (queue_.empty()) return;  // closing and drained
      block = std::move(queue_.front());
      queue_.pop_front();
      cv_.notify_all();
      if (!error_.is_ok()) continue;  // after an error, drain without writing
    }
    const Status st = write_block(block.data(), block.size());
    if (!st.is_ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = st;
      cv_.notify_all();
    }
  }
}

Status CheckpointWriter::stop_thread() {
  if (!thread_.joinable()) return Status::ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status CheckpointWriter::write_block(const uint8_t* p, size_t n) {
  while (true) {
    // Skip finished tensors (zero-sized ones included) and move to the next shard when one is done.
    while (tensor_ < plan_.size() && tensor_done_ == nbytes_[order_[tensor_]]) {
      ++tensor_;
      tensor_done_ = 0;
      if (tensor_ < plan_.size() && tensor_ == shards_[shard_].end) {
        SPARROW_RETURN_IF_ERROR(close_shard());
        SPARROW_RETURN_IF_ERROR(open_shard(shard_ + 1));
      }
    }
    if (n == 0) return Status::ok();
    if (tensor_ == plan_.size()) return Status::internal(dir_.string() + ": data past the last tensor");
    const uint64_t take = std::min<uint64_t>(n, nbytes_[order_[tensor_]] - tensor_done_);
    if (std::fwrite(p, 1, take, file_) != take)
      return Status::io_error(io_message(dir_ / shards_[shard_].file_name, "write failed"));
    p += take;
    n -= take;
    tensor_done_ += take;
  }
}

Status CheckpointWriter::finish() {
  if (finished_) return Status::ok();
  if (appended_bytes_ < total_bytes_) {
    uint64_t before = 0;
    size_t pos = 0;
    while (before + nbytes_[order_[pos]] <= appended_bytes_) before += nbytes_[order_[pos++]];
    const size_t i = order_[pos];
    return Status::invalid_argument(dir_.string() + ": tensor '" + plan_[i].name + "' got " +
                                    std::to_string(appended_bytes_ - before) + " of its " +
                                    std::to_string(nbytes_[i]) + " bytes");
  }
  if (!block_.empty()) SPARROW_RETURN_IF_ERROR(push_block());
  SPARROW_RETURN_IF_ERROR(stop_thread());
  SPARROW_RETURN_IF_ERROR(write_block(nullptr, 0));  // steps past trailing zero-sized tensors
  SPARROW_RETURN_IF_ERROR(close_shard());
  json weight_map = json::object();
  for (const Shard& s : shards_)
    for (size_t pos = s.first; pos < s.end; ++pos) weight_map[plan_[order_[pos]].name] = s.file_name;
  const json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map}};
  const fs::path path = dir_ / "model.safetensors.index.json";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return Status::io_error(io_message(path, "write failed"));
  finished_ = true;
  return Status::ok();
}

}  // namespace sparrow
