// Safetensors reader/writer. See safetensors.h for the format and the invariants open() establishes.
//
// Everything read from a file is untrusted: every length, offset and dimension is checked with
// overflow-checked arithmetic before it is used to form a pointer, and every problem becomes a
// Status naming the file (and tensor) rather than an exception, abort or out-of-bounds read.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

namespace sparrow {

namespace fs = std::filesystem;
// Plain json (std::map objects, O(log n) inserts). Header order, which tensors() promises, comes
// from a separate SAX pass (TopLevelKeys): ordered_json's inserts and nlohmann's callback parser
// both scan the parent object per entry, which makes a many-thousand-tensor header quadratic.
using json = nlohmann::json;

static_assert(sizeof(size_t) == 8, "offsets are 64-bit; a 32-bit build would need narrowing checks");

namespace {

// TensorView::id of every tensor of every file opened by this process: never reused.
uint64_t next_tensor_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

namespace {

constexpr const char* kIndexFileName = "model.safetensors.index.json";
constexpr const char* kMetadataKey = "__metadata__";

// Index files are plain JSON read into memory; anything this large is not an index.
constexpr uintmax_t kMaxIndexBytes = uintmax_t{256} << 20;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string range_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// "FILE: MESSAGE" or "FILE: tensor 'NAME': MESSAGE".
std::string where(const fs::path& file, std::string_view tensor = {}) {
  std::string s = file.string() + ": ";
  if (!tensor.empty()) s += "tensor " + in_quotes(tensor) + ": ";
  return s;
}

std::string supported_dtypes() {
  std::string s;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E8M0, DType::kI8,
                  DType::kU8, DType::kI32, DType::kI64}) {
    if (!s.empty()) s += ", ";
    s += dtype_name(t);
  }
  return s;
}

// numel(shape) * elem_size without overflow; numel must also fit int64_t (TensorView::numel).
bool checked_nbytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* numel_out,
                    uint64_t* nbytes_out) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) return false;
  }
  if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &nbytes)) return false;
  *numel_out = numel;
  *nbytes_out = nbytes;
  return true;
}

// SAX handler that records the top-level object's keys in order and the first duplicate one.
// nlohmann keeps the last of duplicate keys silently; a header naming a tensor twice is lying
// about one of them, so the reader rejects it.
struct TopLevelKeys : nlohmann::json_sax<json> {
  int depth = 0;
  std::vector<std::string> order;
  std::set<std::string> seen;
  std::string duplicate;
  std::string error;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1) {
      if (seen.insert(k).second) {
        order.push_back(k);
      } else if (duplicate.empty()) {
        duplicate = k;
      }
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
};

// Reads a whole small file (the index) into a string.
Expected<std::string> read_text_file(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Status::io_error(where(path) + "cannot stat: " + ec.message());
  if (size > kMaxIndexBytes)
    return Status::corrupt(where(path) + "index file is " + std::to_string(size) + " bytes, over the " +
                           std::to_string(kMaxIndexBytes) + " byte limit");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error(where(path) + "cannot open: " + std::strerror(errno));
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size))
    return Status::io_error(where(path) + "short read");
  return text;
}

// A shard name from an index must name a file inside the checkpoint directory.
bool shard_path_is_contained(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute() || p.has_root_path()) return false;
  for (const fs::path& part : p)
    if (part == "..") return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_addr_ != nullptr) ::munmap(map_addr_, map_size_);
  map_addr_ = nullptr;
  map_size_ = 0;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_addr_(std::exchange(other.map_addr_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_addr_ = std::exchange(other.map_addr_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::not_found(where(path) + "no such file");
    return Status::io_error(where(path) + "cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::io_error(where(path) + "cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::invalid_argument(where(path) + "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  // Checked before mmap: a zero-length mapping is an error, and we need 8 bytes for the length.
  if (size < 8) {
    ::close(fd);
    return Status::corrupt(where(path) + "file is " + std::to_string(size) +
                           " bytes, shorter than the 8-byte header length");
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (addr == MAP_FAILED) return Status::io_error(where(path) + "mmap failed: " + std::strerror(mmap_err));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_addr_ = addr;
  file->map_size_ = size;
  // On error the unique_ptr unmaps.
  SPARROW_RETURN_IF_ERROR(file->parse_header());
  return file;
}

Status SafetensorsFile::parse_header() {
  const auto* base = static_cast<const uint8_t*>(map_addr_);
  const uint64_t header_len = read_u64_le(base);
  if (header_len > kSafetensorsMaxHeaderBytes)
    return Status::corrupt(where(path_) + "header length " + std::to_string(header_len) +
                           " exceeds the " + std::to_string(kSafetensorsMaxHeaderBytes) +
                           " byte limit (oversized header; not a safetensors file?)");
  if (header_len > map_size_ - 8)
    return Status::corrupt(where(path_) + "header length " + std::to_string(header_len) +
                           " exceeds the " + std::to_string(map_size_ - 8) +
                           " bytes after the length field (truncated file?)");

  const char* text = reinterpret_cast<const char*>(base + 8);
  // Pass 1 (SAX): syntax check, top-level keys in file order, duplicate keys.
  TopLevelKeys keys;
  bool parsed_ok = false;
  try {
    parsed_ok = json::sax_parse(text, text + header_len, &keys);
  } catch (const json::exception& e) {
    return Status::corrupt(where(path_) + "header is not valid JSON: " + e.what());
  }
  if (!parsed_ok) return Status::corrupt(where(path_) + "header is not valid JSON: " + keys.error);
  if (!keys.duplicate.empty())
    return Status::corrupt(where(path_) + "header has key " + in_quotes(keys.duplicate) + " more than once");
  // Pass 2: the DOM. Cannot fail after pass 1 accepted the same bytes, but stay exception-safe.
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    return Status::corrupt(where(path_) + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return Status::corrupt(where(path_) + "header is not a JSON object");
  const std::vector<std::string>& key_order = keys.order;

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = map_size_ - data_start;  // >= 0 by the check above
  const auto* data_base = base + data_start;

  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  ranges.reserve(header.size());

  for (const std::string& key : key_order) {
    const auto found = header.find(key);
    if (found == header.end())  // both passes read the same bytes, so this would be a bug
      return Status::internal(where(path_) + "key " + in_quotes(key) + " seen by the SAX pass is missing");
    const json& entry = *found;
    if (key == kMetadataKey) {
      if (!entry.is_object()) return Status::corrupt(where(path_) + "__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : entry.items()) {
        if (!mv.is_string())
          return Status::corrupt(where(path_) + "__metadata__ value for " + in_quotes(mk) + " is not a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const auto bad = [&](const std::string& what) { return Status::corrupt(where(path_, key) + what); };
    if (!entry.is_object()) return bad("header entry is not a JSON object");

    // dtype
    auto it = entry.find("dtype");
    if (it == entry.end() || !it->is_string()) return bad("missing or non-string \"dtype\"");
    const std::string& dtype_str = it->get_ref<const std::string&>();
    const std::optional<DType> dtype = dtype_from_name(dtype_str);
    if (!dtype)
      return Status::unsupported(where(path_, key) + "unsupported dtype " + in_quotes(dtype_str) +
                                 " (supported: " + supported_dtypes() + ")");

    // shape: non-negative integers that fit int64_t
    it = entry.find("shape");
    if (it == entry.end() || !it->is_array()) return bad("missing or non-array \"shape\"");
    std::vector<int64_t> shape;
    shape.reserve(it->size());
    for (size_t axis = 0; axis < it->size(); ++axis) {
      const json& d = (*it)[axis];
      if (d.is_number_unsigned()) {
        const auto v = d.get<uint64_t>();
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return bad("dimension " + std::to_string(v) + " at axis " + std::to_string(axis) + " is too large");
        shape.push_back(static_cast<int64_t>(v));
      } else if (d.is_number_integer()) {  // signed and not unsigned: negative
        return bad("negative dimension " + std::to_string(d.get<int64_t>()) + " at axis " + std::to_string(axis));
      } else {
        // type_name, not dump(): dump() recurses and a hostile element can be nested arbitrarily deep.
        return bad("shape element at axis " + std::to_string(axis) + " is a JSON " + d.type_name() +
                   ", not an integer");
      }
    }
    uint64_t numel = 0, nbytes = 0;
    if (!checked_nbytes(shape, dtype_size(*dtype), &numel, &nbytes))
      return bad("shape " + shape_string(shape) + " has too many elements (overflow)");

    // data_offsets: [begin, end) inside the data section, exactly nbytes long
    it = entry.find("data_offsets");
    if (it == entry.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned())
      return bad("missing \"data_offsets\" or not two non-negative integers");
    const auto begin = (*it)[0].get<uint64_t>();
    const auto end = (*it)[1].get<uint64_t>();
    if (end < begin) return bad("data_offsets " + range_string(begin, end) + " end before they begin");
    if (end > data_size)
      return bad("data_offsets " + range_string(begin, end) + " run past the end of the " +
                 std::to_string(data_size) + "-byte data section (truncated file?)");
    if (end - begin != nbytes)
      return bad("data_offsets " + range_string(begin, end) + " hold " + std::to_string(end - begin) +
                 " bytes but shape " + shape_string(shape) + " of " + dtype_str + " needs " +
                 std::to_string(nbytes));

    TensorView view;
    view.name = key;
    view.dtype = *dtype;
    view.shape = std::move(shape);
    view.data = data_base + begin;  // in bounds: begin <= end <= data_size
    view.nbytes = static_cast<size_t>(nbytes);
    view.id = next_tensor_id();
    ranges.push_back({begin, end, tensors_.size()});
    index_.emplace(key, tensors_.size());
    tensors_.push_back(std::move(view));
  }

  // Overlap check: sorted by start, each non-empty range must begin at or after the previous
  // non-empty range's end. Empty tensors own no bytes, so they cannot overlap anything.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev != nullptr && r.begin < prev->end)
      return Status::corrupt(where(path_) + "tensors " + in_quotes(tensors_[prev->tensor].name) + " " +
                             range_string(prev->begin, prev->end) + " and " +
                             in_quotes(tensors_[r.tensor].name) + " " + range_string(r.begin, r.end) +
                             " overlap");
    prev = &r;
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

Expected<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::open(const fs::path& dir) {
  std::unique_ptr<SafetensorsCheckpoint> ckpt(new SafetensorsCheckpoint());
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    // A single file given directly.
    ckpt->dir_ = dir.parent_path();
    SPARROW_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(dir));
    SPARROW_RETURN_IF_ERROR(ckpt->add_file(std::move(file)));
    return ckpt;
  }
  if (!fs::is_directory(dir, ec)) {
    if (!fs::exists(dir, ec)) return Status::not_found(where(dir) + "no such checkpoint directory");
    return Status::invalid_argument(where(dir) + "not a directory or .safetensors file");
  }
  ckpt->dir_ = dir;
  const fs::path index_path = dir / kIndexFileName;
  if (fs::exists(index_path, ec)) {
    SPARROW_RETURN_IF_ERROR(ckpt->load_index(index_path));
  } else {
    SPARROW_RETURN_IF_ERROR(ckpt->load_all_in_dir());
  }
  return ckpt;
}

// On failure by_name_ may keep entries pointing into `file`, which is then destroyed; that is
// harmless because every caller abandons the whole checkpoint on error.
Status SafetensorsCheckpoint::add_file(std::unique_ptr<SafetensorsFile> file) {
  for (const TensorView& t : file->tensors()) {
    auto [it, inserted] = by_name_.emplace(t.name, Entry{&t, file.get()});
    if (!inserted)
      return Status::corrupt(where(file->path(), t.name) + "also present in " + it->second.file->path().string() +
                             " (duplicate tensor name across shards)");
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

Status SafetensorsCheckpoint::load_all_in_dir() {
  std::vector<fs::path> paths;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->path().extension() == ".safetensors" && it->is_regular_file(type_ec)) paths.push_back(it->path());
  }
  if (ec) return Status::io_error(where(dir_) + "cannot list directory: " + ec.message());
  if (paths.empty()) return Status::not_found(where(dir_) + "no " + kIndexFileName + " and no *.safetensors files");
  std::sort(paths.begin(), paths.end());
  for (const fs::path& p : paths) {
    SPARROW_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(p));
    SPARROW_RETURN_IF_ERROR(add_file(std::move(file)));
  }
  return Status::ok();
}

Status SafetensorsCheckpoint::load_index(const fs::path& index_path) {
  SPARROW_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    return Status::corrupt(where(index_path) + "not valid JSON: " + e.what());
  }
  if (!index.is_object()) return Status::corrupt(where(index_path) + "not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    return Status::corrupt(where(index_path) + "missing or non-object \"weight_map\"");

  // shard file name -> tensors the index places there; std::map gives a deterministic open order.
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string())
      return Status::corrupt(where(index_path, tensor) + "weight_map value is not a string");
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (!shard_path_is_contained(shard_name))
      return Status::corrupt(where(index_path, tensor) + "shard path " + in_quotes(shard_name) +
                             " is empty, absolute or contains '..' (must stay inside " + dir_.string() + ")");
    // "./a.safetensors" and "a.safetensors" are one shard; open it once.
    shards[fs::path(shard_name).lexically_normal().string()].push_back(tensor);
  }
  if (shards.empty()) return Status::corrupt(where(index_path) + "\"weight_map\" is empty");

  for (const auto& [shard_name, tensors] : shards) {
    auto opened = SafetensorsFile::open(dir_ / shard_name);
    if (!opened.is_ok()) {
      // Keep the shard's own code (NotFound for a missing file) and say which index entry wanted it.
      std::string held = in_quotes(tensors.front());
      if (tensors.size() > 1) held += " and " + std::to_string(tensors.size() - 1) + " more";
      return opened.status().with_context(index_path.string() + ": shard " + in_quotes(shard_name) +
                                          " (holding " + held + ")");
    }
    std::unique_ptr<SafetensorsFile> file = std::move(opened).value();
    for (const std::string& tensor : tensors) {
      if (file->find(tensor) == nullptr)
        return Status::not_found(where(index_path, tensor) + "listed in weight_map for shard " + file->path().string() +
                                 " but absent from that file");
    }
    SPARROW_RETURN_IF_ERROR(add_file(std::move(file)));
  }
  return Status::ok();
}

const TensorView* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.view;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, entry] : by_name_) out.push_back(name);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

Status safetensors_write(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // The header text is assembled entry by entry (each piece dumped by nlohmann for correct
  // escaping) so the file keeps the caller's tensor order; a json object would sort the keys.
  std::string text = "{";
  std::set<std::string_view> names;
  uint64_t offset = 0;
  try {  // dump() throws on invalid UTF-8 in a name or metadata string
    if (!metadata.empty()) text += json(kMetadataKey).dump() + ":" + json(metadata).dump();
    for (const TensorToWrite& t : tensors) {
      if (t.name.empty() || t.name == kMetadataKey)
        return Status::invalid_argument(where(path) + "invalid tensor name " + in_quotes(t.name));
      if (!names.insert(t.name).second)
        return Status::invalid_argument(where(path, t.name) + "tensor name given twice");
      uint64_t numel = 0, nbytes = 0;
      if (!checked_nbytes(t.shape, dtype_size(t.dtype), &numel, &nbytes))
        return Status::invalid_argument(where(path, t.name) + "shape " + shape_string(t.shape) +
                                        " has a negative dimension or overflows");
      if (nbytes != t.bytes.size())
        return Status::invalid_argument(where(path, t.name) + std::to_string(t.bytes.size()) +
                                        " bytes given but shape " + shape_string(t.shape) + " of " +
                                        dtype_name(t.dtype) + " needs " + std::to_string(nbytes));
      json entry = json::object();
      entry["dtype"] = dtype_name(t.dtype);
      entry["shape"] = t.shape;
      entry["data_offsets"] = json::array({offset, offset + nbytes});
      if (text.size() > 1) text += ",";
      text += json(t.name).dump() + ":" + entry.dump();
      offset += nbytes;
    }
  } catch (const json::exception& e) {
    return Status::invalid_argument(where(path) + "cannot encode header: " + e.what());
  }
  text += "}";
  // Pad so that 8 + N is a multiple of 8: the data section then starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t len_bytes[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(n >> (8 * i));

  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::io_error(where(path) + "cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(len_bytes, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const TensorToWrite& t : tensors) {
    if (!ok) break;
    if (!t.bytes.empty()) ok = std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  const int write_err = errno;
  if (std::fclose(f) != 0 && ok) return Status::io_error(where(path) + "close failed: " + std::strerror(errno));
  if (!ok) return Status::io_error(where(path) + "write failed: " + std::strerror(write_err));
  return Status::ok();
}

}  // namespace sparrow
