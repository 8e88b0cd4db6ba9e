// Safetensors checkpoints: a validating mmap reader, a sharded-directory view and a small writer.
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section) plus an optional "__metadata__" object of string -> string.
//
// Invariants once SafetensorsFile::open has succeeded (the header is untrusted input, so open checks
// all of them and returns a Status naming the file and tensor instead of crashing):
//   - every TensorView's [data, data + nbytes) lies inside the mapping, nbytes == numel * dtype_size,
//     all dims are >= 0 and numel fits in int64_t;
//   - no two non-empty tensors share a byte;
//   - tensor names are unique and never "__metadata__".
// Views stay valid for the life of the SafetensorsFile (moving it keeps them valid: the mapping does
// not move). Data pointers carry no alignment guarantee beyond what the file's offsets give; the
// mapping is read-only, so writing through a view faults.
// A file truncated by someone else *after* open can still raise SIGBUS on access; nothing in-process
// can prevent that short of copying the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "sparrow/status.h"

namespace sparrow {

// Headers larger than this are rejected as corrupt before any parsing (a real checkpoint shard's
// header is a few MB at most; the limit keeps a hostile length from driving a huge parse).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;

// One safetensors file, mapped read-only.
class SafetensorsFile {
 public:
  // Errors: NotFound (no such file), IoError (open/mmap failed), Corrupt (header or offsets
  // inconsistent), Unsupported (a dtype this build does not know).
  static Expected<std::unique_ptr<SafetensorsFile>> open(const std::filesystem::path& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;

  const std::filesystem::path& path() const { return path_; }
  // In header (JSON key) order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorView* find(std::string_view name) const;
  // The "__metadata__" object (empty if the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Size of the whole file in bytes.
  size_t file_size() const { return map_size_; }

 private:
  SafetensorsFile() = default;
  Status parse_header();
  void unmap();

  std::filesystem::path path_;
  void* map_addr_ = nullptr;  // owned mapping of the whole file (PROT_READ, MAP_PRIVATE)
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a directory with model.safetensors.index.json ("weight_map": tensor -> shard file),
// or without one, every *.safetensors file in the directory (sorted by name). A path to a single
// .safetensors file is accepted as a one-file checkpoint.
// Invariants after open: tensor names are unique across all shards (a duplicate is Corrupt); with an
// index, every weight_map entry is present in the shard it names, and shard paths stay inside the
// directory (no absolute paths, no ".." components). Tensors a shard holds beyond its weight_map
// entries are served too (they still count for the duplicate check).
class SafetensorsCheckpoint {
 public:
  static Expected<std::unique_ptr<SafetensorsCheckpoint>> open(const std::filesystem::path& dir);

  // nullptr if absent. The view lives as long as this checkpoint.
  const TensorView* find(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  size_t num_files() const { return files_.size(); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  SafetensorsCheckpoint() = default;
  Status load_index(const std::filesystem::path& index_path);
  Status load_all_in_dir();
  Status add_file(std::unique_ptr<SafetensorsFile> file);

  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  struct Entry {
    const TensorView* view;       // into its file's tensors(), which never change after open
    const SafetensorsFile* file;  // owner, for duplicate-name messages
  };
  std::map<std::string, Entry, std::less<>> by_name_;
};

// One tensor for safetensors_write. bytes must hold exactly numel(shape) * dtype_size(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes tensors (in the given order, packed back to back) to one file. The header is padded with
// spaces to a multiple of 8 bytes so the data section starts 8-byte aligned.
// Errors: InvalidArgument (bad name, negative dim, byte count mismatch), IoError.
Status safetensors_write(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace sparrow
