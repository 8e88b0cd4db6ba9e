// Tests for the safetensors reader, checkpoint directories and writer.
//
// Good files come from safetensors_write; bad files are assembled byte by byte (write_raw) so each
// test controls exactly which part of the format lies. Every rejection must carry the expected
// StatusCode and name the file (and the tensor, where one is involved).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <set>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sparrow {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const std::string name = "sparrow_st_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> from_view(const TensorView& t) {
  std::vector<T> out(t.nbytes / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.data, t.nbytes);
  return out;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file with the given header text, claimed header length and data bytes.
void write_raw(const fs::path& p, uint64_t claimed_len, const std::string& header, size_t data_bytes) {
  write_bytes(p, le64(claimed_len) + header + std::string(data_bytes, '\x01'));
}
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  write_raw(p, header.size(), header, data_bytes);
}

// Asserts the failure code and that every fragment (file name, tensor name, ...) is in the message.
void expect_error(const Status& st, StatusCode code, const std::vector<std::string>& fragments) {
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const std::string& f : fragments)
    EXPECT_NE(st.message().find(f), std::string::npos) << "missing '" << f << "' in: " << st.to_string();
}

Status open_status(const fs::path& p) {
  auto r = SafetensorsFile::open(p);
  return r.is_ok() ? Status::ok() : r.status();
}

Status open_ckpt_status(const fs::path& p) {
  auto r = SafetensorsCheckpoint::open(p);
  return r.is_ok() ? Status::ok() : r.status();
}

std::vector<TensorToWrite> sample_tensors() {
  std::vector<TensorToWrite> t;
  t.push_back({"w.f32", DType::kF32, {2, 3}, to_bytes(std::vector<float>{1, 2, 3, 4, 5, -6.5f})});
  t.push_back({"w.bf16", DType::kBF16, {4},
               to_bytes(std::vector<uint16_t>{f32_to_bf16(1.0f), f32_to_bf16(-2.0f), f32_to_bf16(0.5f), 0})});
  t.push_back({"idx.i64", DType::kI64, {3}, to_bytes(std::vector<int64_t>{-1, 0, int64_t{1} << 40})});
  t.push_back({"q.e4m3", DType::kF8E4M3, {5}, {0x38, 0xb8, 0x00, 0x7e, 0x01}});
  t.push_back({"s.e8m0", DType::kF8E8M0, {1, 2}, {127, 128}});
  t.push_back({"u8", DType::kU8, {2, 2}, {0, 1, 254, 255}});
  t.push_back({"i32", DType::kI32, {2}, to_bytes(std::vector<int32_t>{-7, 7})});
  t.push_back({"f16", DType::kF16, {1}, to_bytes(std::vector<uint16_t>{0x3c00})});
  return t;
}

// ------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripSeveralDtypes) {
  TempDir dir;
  const fs::path p = dir / "model.safetensors";
  const auto tensors = sample_tensors();
  ASSERT_TRUE(safetensors_write(p, tensors, {{"format", "pt"}, {"note", "hello"}}).is_ok());

  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.path(), p);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& v = f.tensors()[i];  // header order == write order
    EXPECT_EQ(v.name, tensors[i].name);
    EXPECT_EQ(v.dtype, tensors[i].dtype) << v.name;
    EXPECT_EQ(v.shape, tensors[i].shape) << v.name;
    ASSERT_EQ(v.nbytes, tensors[i].bytes.size()) << v.name;
    EXPECT_EQ(std::memcmp(v.data, tensors[i].bytes.data(), v.nbytes), 0) << v.name;
    EXPECT_EQ(f.find(v.name), &v);
  }
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "hello");

  const TensorView* w = f.find("w.f32");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->numel(), 6);
  EXPECT_EQ(from_view<float>(*w), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  EXPECT_EQ(from_view<int64_t>(*f.find("idx.i64")), (std::vector<int64_t>{-1, 0, int64_t{1} << 40}));
  const auto bf = from_view<uint16_t>(*f.find("w.bf16"));
  EXPECT_EQ(bf16_to_f32(bf[1]), -2.0f);
  EXPECT_EQ(e4m3_to_f32(static_cast<const uint8_t*>(f.find("q.e4m3")->data)[0]), 1.0f);
}

TEST(Safetensors, HeaderIsPaddedSoDataIsEightByteAligned) {
  TempDir dir;
  const fs::path p = dir / "a.safetensors";
  ASSERT_TRUE(safetensors_write(p, {{"x", DType::kF32, {1}, to_bytes(std::vector<float>{3.0f})}}).is_ok());
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4);
  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->tensors()[0].data) % 8, 0u);
}

TEST(Safetensors, ScalarAndZeroSizedTensors) {
  TempDir dir;
  const fs::path p = dir / "a.safetensors";
  ASSERT_TRUE(safetensors_write(p, {{"scalar", DType::kF32, {}, to_bytes(std::vector<float>{7.0f})},
                                    {"empty", DType::kBF16, {0, 3}, {}},
                                    {"after", DType::kI32, {1}, to_bytes(std::vector<int32_t>{9})}})
                  .is_ok());
  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const TensorView* s = (*file)->find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(from_view<float>(*s), std::vector<float>{7.0f});
  EXPECT_EQ((*file)->find("empty")->nbytes, 0u);
  EXPECT_EQ((*file)->find("empty")->numel(), 0);
  EXPECT_EQ(from_view<int32_t>(*(*file)->find("after")), std::vector<int32_t>{9});
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(Safetensors, MoveKeepsViewsValid) {
  TempDir dir;
  const fs::path p = dir / "a.safetensors";
  ASSERT_TRUE(safetensors_write(p, sample_tensors()).is_ok());
  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(file.is_ok());
  SafetensorsFile moved(std::move(**file));
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_EQ(from_view<int32_t>(*moved.find("i32")), (std::vector<int32_t>{-7, 7}));
  SafetensorsFile assigned = std::move(moved);
  EXPECT_EQ(from_view<int32_t>(*assigned.find("i32")), (std::vector<int32_t>{-7, 7}));
  EXPECT_EQ(assigned.path(), p);
}

// TensorView::id: every tensor of every opened file gets its own nonzero id, never reused, even when
// the same file is opened again (device caches key on it instead of the host address).
TEST(Safetensors, EveryOpenedTensorHasItsOwnId) {
  TempDir dir;
  const fs::path p = dir / "ids.safetensors";
  ASSERT_TRUE(safetensors_write(p, sample_tensors()).is_ok());
  std::set<uint64_t> seen;
  for (int pass = 0; pass < 2; ++pass) {
    auto file = SafetensorsFile::open(p);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    for (const TensorView& v : (*file)->tensors()) {
      EXPECT_NE(v.id, 0u) << v.name;
      EXPECT_TRUE(seen.insert(v.id).second) << v.name << ": id " << v.id << " given twice";
    }
  }
  EXPECT_EQ(seen.size(), 2 * sample_tensors().size());
}

TEST(Safetensors, ManyTensorsKeepHeaderOrder) {
  // Names written in reverse lexical order: tensors() must follow the file, not sort by name.
  TempDir dir;
  const fs::path p = dir / "many.safetensors";
  std::vector<TensorToWrite> tensors;
  for (int i = 4999; i >= 0; --i)
    tensors.push_back({"layers." + std::to_string(i) + ".w", DType::kI32, {1}, to_bytes(std::vector<int32_t>{i})});
  ASSERT_TRUE(safetensors_write(p, tensors).is_ok());
  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_EQ((*file)->tensors()[i].name, tensors[i].name);
    ASSERT_EQ(from_view<int32_t>((*file)->tensors()[i]), std::vector<int32_t>{static_cast<int32_t>(4999 - i)});
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const fs::path p = dir / "w.safetensors";
  expect_error(safetensors_write(p, {{"t", DType::kF32, {2}, {0, 0, 0}}}), StatusCode::kInvalidArgument,
               {"w.safetensors", "'t'"});
  expect_error(safetensors_write(p, {{"t", DType::kF32, {-1}, {}}}), StatusCode::kInvalidArgument, {"'t'"});
  expect_error(safetensors_write(p, {{"t", DType::kU8, {1}, {1}}, {"t", DType::kU8, {1}, {2}}}),
               StatusCode::kInvalidArgument, {"'t'"});
  expect_error(safetensors_write(p, {{"__metadata__", DType::kU8, {1}, {1}}}), StatusCode::kInvalidArgument,
               {"__metadata__"});
}

// ------------------------------------------------------------------------------------------
// Checkpoint directories

TEST(SafetensorsCheckpoint, ShardedIndexWithTwoShards) {
  TempDir dir;
  ASSERT_TRUE(safetensors_write(dir / "model-00001-of-00002.safetensors",
                                {{"embed", DType::kF32, {2}, to_bytes(std::vector<float>{1, 2})},
                                 {"layers.0.w", DType::kU8, {3}, {4, 5, 6}}})
                  .is_ok());
  ASSERT_TRUE(safetensors_write(dir / "model-00002-of-00002.safetensors",
                                {{"head", DType::kI64, {1}, to_bytes(std::vector<int64_t>{42})}})
                  .is_ok());
  write_bytes(dir / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 13},
    "weight_map": {
      "embed": "model-00001-of-00002.safetensors",
      "layers.0.w": "model-00001-of-00002.safetensors",
      "head": "model-00002-of-00002.safetensors"
    }})");
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ((*ckpt)->num_files(), 2u);
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"embed", "head", "layers.0.w"}));
  ASSERT_NE((*ckpt)->find("head"), nullptr);
  EXPECT_EQ(from_view<int64_t>(*(*ckpt)->find("head")), std::vector<int64_t>{42});
  EXPECT_EQ(from_view<float>(*(*ckpt)->find("embed")), (std::vector<float>{1, 2}));
  EXPECT_EQ(from_view<uint8_t>(*(*ckpt)->find("layers.0.w")), (std::vector<uint8_t>{4, 5, 6}));
  EXPECT_EQ((*ckpt)->find("nope"), nullptr);
}

TEST(SafetensorsCheckpoint, WithoutIndexLoadsAllFilesSorted) {
  TempDir dir;
  ASSERT_TRUE(safetensors_write(dir / "b.safetensors", {{"y", DType::kU8, {1}, {2}}}).is_ok());
  ASSERT_TRUE(safetensors_write(dir / "a.safetensors", {{"x", DType::kU8, {1}, {1}}}).is_ok());
  write_bytes(dir / "notes.txt", "ignored");
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  ASSERT_EQ((*ckpt)->num_files(), 2u);
  EXPECT_EQ((*ckpt)->files()[0]->path().filename(), "a.safetensors");
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"x", "y"}));

  // A single file path works as a one-file checkpoint.
  auto single = SafetensorsCheckpoint::open(dir / "b.safetensors");
  ASSERT_TRUE(single.is_ok()) << single.status().to_string();
  EXPECT_EQ((*single)->names(), std::vector<std::string>{"y"});
}

TEST(SafetensorsCheckpoint, DuplicateTensorAcrossShardsIsCorrupt) {
  TempDir dir;
  ASSERT_TRUE(safetensors_write(dir / "a.safetensors", {{"dup", DType::kU8, {1}, {1}}}).is_ok());
  ASSERT_TRUE(safetensors_write(dir / "b.safetensors", {{"dup", DType::kU8, {1}, {2}}}).is_ok());
  expect_error(open_ckpt_status(dir.path()), StatusCode::kCorrupt, {"a.safetensors", "b.safetensors", "'dup'"});
}

TEST(SafetensorsCheckpoint, EmptyOrMissingDirectoryIsNotFound) {
  TempDir dir;
  expect_error(open_ckpt_status(dir.path()), StatusCode::kNotFound, {dir.path().string()});
  expect_error(open_ckpt_status(dir / "nope"), StatusCode::kNotFound, {"nope"});
}

TEST(SafetensorsCheckpoint, MissingShardIsNotFound) {
  TempDir dir;
  ASSERT_TRUE(safetensors_write(dir / "s1.safetensors", {{"a", DType::kU8, {1}, {1}}}).is_ok());
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error(open_ckpt_status(dir.path()), StatusCode::kNotFound, {"s2.safetensors", "'b'"});
}

TEST(SafetensorsCheckpoint, TensorInWeightMapButNotInShardIsNotFound) {
  TempDir dir;
  ASSERT_TRUE(safetensors_write(dir / "s1.safetensors", {{"a", DType::kU8, {1}, {1}}}).is_ok());
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  expect_error(open_ckpt_status(dir.path()), StatusCode::kNotFound,
               {"s1.safetensors", "'ghost'", "model.safetensors.index.json"});
}

TEST(SafetensorsCheckpoint, ShardPathMayNotEscapeDirectory) {
  TempDir dir;
  fs::create_directories(dir / "ckpt");
  ASSERT_TRUE(safetensors_write(dir / "x.safetensors", {{"a", DType::kU8, {1}, {1}}}).is_ok());
  write_bytes(dir / "ckpt" / "model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
  expect_error(open_ckpt_status(dir / "ckpt"), StatusCode::kCorrupt,
               {"model.safetensors.index.json", "../x.safetensors", "'a'"});

  const std::string abs = (dir / "x.safetensors").string();
  write_bytes(dir / "ckpt" / "model.safetensors.index.json", R"({"weight_map": {"a": ")" + abs + R"("}})");
  expect_error(open_ckpt_status(dir / "ckpt"), StatusCode::kCorrupt, {abs, "'a'"});

  write_bytes(dir / "ckpt" / "model.safetensors.index.json", R"({"weight_map": {"a": "sub/../../x.safetensors"}})");
  expect_error(open_ckpt_status(dir / "ckpt"), StatusCode::kCorrupt, {"sub/../../x.safetensors"});
}

TEST(SafetensorsCheckpoint, BadIndexJsonIsCorrupt) {
  TempDir dir;
  write_bytes(dir / "model.safetensors.index.json", "{\"weight_map\": ");
  expect_error(open_ckpt_status(dir.path()), StatusCode::kCorrupt, {"model.safetensors.index.json"});
  write_bytes(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error(open_ckpt_status(dir.path()), StatusCode::kCorrupt, {"weight_map"});
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  expect_error(open_ckpt_status(dir.path()), StatusCode::kCorrupt, {"'a'"});
}

// ------------------------------------------------------------------------------------------
// Malformed single files

TEST(SafetensorsBad, MissingFileIsNotFound) {
  TempDir dir;
  expect_error(open_status(dir / "none.safetensors"), StatusCode::kNotFound, {"none.safetensors"});
}

TEST(SafetensorsBad, ShorterThanLengthField) {
  TempDir dir;
  write_bytes(dir / "tiny.safetensors", "abc");
  expect_error(open_status(dir / "tiny.safetensors"), StatusCode::kCorrupt, {"tiny.safetensors"});
  write_bytes(dir / "empty.safetensors", "");
  expect_error(open_status(dir / "empty.safetensors"), StatusCode::kCorrupt, {"empty.safetensors"});
}

TEST(SafetensorsBad, TruncatedFile) {
  TempDir dir;
  const fs::path p = dir / "trunc.safetensors";
  ASSERT_TRUE(safetensors_write(p, {{"first", DType::kF32, {2}, to_bytes(std::vector<float>{1, 2})},
                                    {"last", DType::kF32, {4}, to_bytes(std::vector<float>{1, 2, 3, 4})}})
                  .is_ok());
  fs::resize_file(p, fs::file_size(p) - 3);
  expect_error(open_status(p), StatusCode::kCorrupt, {"trunc.safetensors", "'last'"});
}

TEST(SafetensorsBad, TruncatedAtEveryLengthNeverCrashes) {
  // Every prefix of a valid file must be rejected cleanly (sanitizers catch any stray read).
  TempDir dir;
  const fs::path good = dir / "good.safetensors";
  ASSERT_TRUE(safetensors_write(good, sample_tensors(), {{"k", "v"}}).is_ok());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path p = dir / "cut.safetensors";
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(p, bytes.substr(0, len));
    const Status st = open_status(p);
    ASSERT_FALSE(st.is_ok()) << "length " << len;
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << len << ": " << st.to_string();
    EXPECT_NE(st.message().find("cut.safetensors"), std::string::npos) << st.to_string();
  }
}

TEST(SafetensorsBad, HeaderBytesFlippedNeverCrash) {
  // Overwrite each header byte with a few characters that are meaningful to JSON or numbers.
  TempDir dir;
  const fs::path good = dir / "good.safetensors";
  ASSERT_TRUE(safetensors_write(good,
                                {{"a", DType::kF32, {2}, to_bytes(std::vector<float>{1, 2})},
                                 {"b", DType::kU8, {1, 3}, {1, 2, 3}},
                                 {"c", DType::kI64, {1}, to_bytes(std::vector<int64_t>{5})}},
                                {{"k", "v"}})
                  .is_ok());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  const fs::path p = dir / "flip.safetensors";
  for (size_t i = 0; i < 8 + n; ++i) {
    for (char c : {'9', '-', '"', '}', '\xff'}) {
      std::string mutated = bytes;
      mutated[i] = c;
      write_bytes(p, mutated);
      auto r = SafetensorsFile::open(p);
      if (r.is_ok()) {
        // Any accepted view must lie inside the mapping: touch every byte (ASan/segfault otherwise).
        unsigned sum = 0;
        for (const TensorView& t : (*r)->tensors())
          for (size_t b = 0; b < t.nbytes; ++b) sum += static_cast<const uint8_t*>(t.data)[b];
        EXPECT_GE(sum, 0u);
      } else {
        EXPECT_NE(r.status().message().find("flip.safetensors"), std::string::npos) << r.status().to_string();
      }
    }
  }
}

TEST(SafetensorsBad, HeaderLengthLargerThanFile) {
  TempDir dir;
  const fs::path p = dir / "liar.safetensors";
  const std::string header = R"({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})";
  write_raw(p, header.size() + 1000, header, 4);
  expect_error(open_status(p), StatusCode::kCorrupt, {"liar.safetensors", "header length"});
}

TEST(SafetensorsBad, OversizedHeaderLength) {
  TempDir dir;
  const fs::path p = dir / "huge.safetensors";
  write_raw(p, uint64_t{1} << 40, "{}", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"huge.safetensors", "1099511627776"});
  write_raw(p, ~uint64_t{0}, "{}", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"huge.safetensors"});
}

TEST(SafetensorsBad, NonJsonHeader) {
  TempDir dir;
  const fs::path p = dir / "nojson.safetensors";
  write_raw(p, "this is not json", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"nojson.safetensors", "JSON"});
  write_raw(p, R"({"t": {"dtype": "U8", )", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"nojson.safetensors"});
}

TEST(SafetensorsBad, HeaderNotAnObject) {
  TempDir dir;
  const fs::path p = dir / "array.safetensors";
  write_raw(p, "[1, 2, 3]", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"array.safetensors", "object"});
}

TEST(SafetensorsBad, EntryMissingFieldsOrWrongTypes) {
  TempDir dir;
  const fs::path p = dir / "fields.safetensors";
  const std::vector<std::string> headers = {
      R"({"t": {"dtype": "U8", "shape": [4]}})",                                // no data_offsets
      R"({"t": {"shape": [4], "data_offsets": [0, 4]}})",                       // no dtype
      R"({"t": {"dtype": "U8", "data_offsets": [0, 4]}})",                      // no shape
      R"({"t": {"dtype": 8, "shape": [4], "data_offsets": [0, 4]}})",           // dtype not a string
      R"({"t": {"dtype": "U8", "shape": "4", "data_offsets": [0, 4]}})",        // shape not an array
      R"({"t": {"dtype": "U8", "shape": [4.0], "data_offsets": [0, 4]}})",      // float dim
      R"({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0]}})",           // one offset
      R"({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, "4"]}})",      // string offset
      R"({"t": {"dtype": "U8", "shape": [4], "data_offsets": [-1, 3]}})",       // negative offset
      R"({"t": [1, 2]})",                                                       // entry not an object
  };
  for (const std::string& h : headers) {
    write_raw(p, h, 4);
    expect_error(open_status(p), StatusCode::kCorrupt, {"fields.safetensors", "'t'"});
  }
}

TEST(SafetensorsBad, UnknownDtype) {
  TempDir dir;
  const fs::path p = dir / "dtype.safetensors";
  write_raw(p, R"({"weird": {"dtype": "F9", "shape": [1], "data_offsets": [0, 4]}})", 4);
  expect_error(open_status(p), StatusCode::kUnsupported, {"dtype.safetensors", "'weird'", "F9"});
}

TEST(SafetensorsBad, OffsetsDoNotMatchShapeTimesDtype) {
  TempDir dir;
  const fs::path p = dir / "size.safetensors";
  // [2, 3] F32 needs 24 bytes; the header claims 20.
  write_raw(p, R"({"m": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
  expect_error(open_status(p), StatusCode::kCorrupt, {"size.safetensors", "'m'", "24"});
}

TEST(SafetensorsBad, EndBeforeBegin) {
  TempDir dir;
  const fs::path p = dir / "order.safetensors";
  write_raw(p, R"({"r": {"dtype": "U8", "shape": [0], "data_offsets": [4, 2]}})", 8);
  expect_error(open_status(p), StatusCode::kCorrupt, {"order.safetensors", "'r'"});
}

TEST(SafetensorsBad, OffsetsPastEndOfData) {
  TempDir dir;
  const fs::path p = dir / "past.safetensors";
  write_raw(p, R"({"big": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}})", 8);
  expect_error(open_status(p), StatusCode::kCorrupt, {"past.safetensors", "'big'"});
  // Offsets near 2^64 must not wrap around.
  write_raw(p, R"({"big": {"dtype": "U8", "shape": [2], "data_offsets": [18446744073709551615, 1]}})", 8);
  expect_error(open_status(p), StatusCode::kCorrupt, {"past.safetensors", "'big'"});
}

TEST(SafetensorsBad, OverlappingTensors) {
  TempDir dir;
  const fs::path p = dir / "overlap.safetensors";
  write_raw(p,
            R"({"alpha": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "beta": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            16);
  expect_error(open_status(p), StatusCode::kCorrupt, {"overlap.safetensors", "'alpha'", "'beta'"});
  // Listed out of order in the header, still caught.
  write_raw(p,
            R"({"beta": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]},
                "alpha": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
            16);
  expect_error(open_status(p), StatusCode::kCorrupt, {"overlap.safetensors", "'alpha'", "'beta'"});
}

TEST(SafetensorsBad, NegativeDimension) {
  TempDir dir;
  const fs::path p = dir / "neg.safetensors";
  write_raw(p, R"({"n": {"dtype": "U8", "shape": [-2, -2], "data_offsets": [0, 4]}})", 4);
  expect_error(open_status(p), StatusCode::kCorrupt, {"neg.safetensors", "'n'", "negative"});
}

TEST(SafetensorsBad, NumelOverflow) {
  TempDir dir;
  const fs::path p = dir / "ovf.safetensors";
  write_raw(p, R"({"o": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 0]}})", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"ovf.safetensors", "'o'"});
  // numel fits in u64 but numel * 8 bytes does not.
  write_raw(p, R"({"o": {"dtype": "I64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"ovf.safetensors", "'o'"});
  write_raw(p, R"({"o": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"ovf.safetensors", "'o'"});
}

TEST(SafetensorsBad, MetadataMustBeStrings) {
  TempDir dir;
  const fs::path p = dir / "meta.safetensors";
  write_raw(p, R"({"__metadata__": {"n": 3}})", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"meta.safetensors", "'n'"});
  write_raw(p, R"({"__metadata__": "text"})", 0);
  expect_error(open_status(p), StatusCode::kCorrupt, {"meta.safetensors", "__metadata__"});
}

TEST(SafetensorsBad, DuplicateKeyInHeader) {
  TempDir dir;
  const fs::path p = dir / "dupkey.safetensors";
  write_raw(p,
            R"({"d": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "d": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
            4);
  expect_error(open_status(p), StatusCode::kCorrupt, {"dupkey.safetensors", "'d'"});
}

TEST(SafetensorsBad, PaddedHeaderAndEmptyObjectAreFine) {
  // Trailing spaces are the format's padding, and a file with no tensors is valid.
  TempDir dir;
  const fs::path p = dir / "pad.safetensors";
  write_raw(p, "{}      ", 0);
  auto r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE((*r)->tensors().empty());
}

}  // namespace
}  // namespace sparrow
