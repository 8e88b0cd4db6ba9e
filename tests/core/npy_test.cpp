// Tests for the .npy reader/writer: round trips, header dialects other writers produce (hand-built
// here byte by byte), and rejection of Fortran order, big-endian, truncated and malformed files.
#include "core/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("sparrow_npy_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// A .npy file with an arbitrary header dict (v1 unless major says otherwise) and raw data.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  std::string s = "\x93NUMPY";
  s.push_back(static_cast<char>(major));
  s.push_back(0);
  const std::string header = dict + "\n";
  const uint32_t len = static_cast<uint32_t>(header.size());
  const int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) s.push_back(static_cast<char>(len >> (8 * i)));
  return s + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void expect_error(const Status& st, StatusCode code, const std::vector<std::string>& fragments) {
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const std::string& f : fragments)
    EXPECT_NE(st.message().find(f), std::string::npos) << "missing '" << f << "' in: " << st.to_string();
}

Status read_status(const fs::path& p) {
  auto r = npy_read(p);
  return r.is_ok() ? Status::ok() : r.status();
}

TEST(Npy, RoundTripF32Matrix) {
  TempDir dir;
  const fs::path p = dir / "m.npy";
  std::vector<float> data(15);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i) * 0.5f - 3.0f;
  ASSERT_TRUE(npy_write_f32(p, {3, 5}, data).is_ok());

  // numpy's layout: magic, v1.0, header padded with spaces to a 64-byte boundary, ending in '\n'.
  const std::string bytes = read_all(p);
  ASSERT_GT(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(bytes[10 + header_len - 1], '\n');
  EXPECT_NE(bytes.find("'shape': (3, 5)"), std::string::npos);

  auto a = npy_read(p);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->descr, "<f4");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a->numel(), 15);
  auto f = npy_to_f32(*a);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(*f, data);
}

TEST(Npy, RoundTripI64Vector) {
  TempDir dir;
  const fs::path p = dir / "ids.npy";
  const std::vector<int64_t> ids = {0, 1, -1, 42, int64_t{1} << 50, -(int64_t{1} << 62), 7};
  ASSERT_TRUE(npy_write(p, "<i8", {7}, ids.data(), ids.size() * sizeof(int64_t)).is_ok());
  EXPECT_NE(read_all(p).find("'shape': (7,)"), std::string::npos);
  auto a = npy_read(p);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->descr, "<i8");
  EXPECT_EQ(a->shape, std::vector<int64_t>{7});
  auto v = npy_to_i64(*a);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(*v, ids);
  // Floats are not silently accepted as ints.
  expect_error(npy_to_f32(*a).status(), StatusCode::kUnsupported, {"<i8"});
}

TEST(Npy, ScalarAndEmptyArrays) {
  TempDir dir;
  const fs::path p = dir / "s.npy";
  ASSERT_TRUE(npy_write_f32(p, {}, {2.5f}).is_ok());
  EXPECT_NE(read_all(p).find("'shape': ()"), std::string::npos);
  auto a = npy_read(p);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(*npy_to_f32(*a), std::vector<float>{2.5f});

  ASSERT_TRUE(npy_write_f32(p, {0, 4}, {}).is_ok());
  auto e = npy_read(p);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ(e->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(e->bytes.empty());
}

TEST(Npy, ParsesHeaderDialects) {
  TempDir dir;
  const fs::path p = dir / "d.npy";
  const std::string five = raw(std::vector<float>{1, 2, 3, 4, 5});
  // numpy's own spelling, tight spacing, double quotes, reordered keys, no trailing comma, "5L".
  for (const std::string& dict : {
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }      "),
           std::string("{'descr':'<f4','fortran_order':False,'shape':(5,)}"),
           std::string("{\"shape\": ( 5 , ), \"fortran_order\": False, \"descr\": \"<f4\"}"),
           std::string("{'descr': '=f4', 'fortran_order': False, 'shape': (5L,)}"),
       }) {
    write_all(p, make_npy(dict, five));
    auto a = npy_read(p);
    ASSERT_TRUE(a.is_ok()) << dict << ": " << a.status().to_string();
    EXPECT_EQ(a->shape, std::vector<int64_t>{5}) << dict;
    EXPECT_EQ(a->descr, "<f4") << dict;
    EXPECT_EQ(*npy_to_f32(*a), (std::vector<float>{1, 2, 3, 4, 5})) << dict;
  }
  // Version 2.0 header (u32 length), 2-d shape with a trailing comma.
  write_all(p, make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2,), }",
                        raw(std::vector<int32_t>{-1, 2, -3, 4}), 2));
  auto b = npy_read(p);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(*npy_to_i64(*b), (std::vector<int64_t>{-1, 2, -3, 4}));
  // "()" is a 0-d array of one element.
  write_all(p, make_npy("{'descr': '<i8', 'fortran_order': False, 'shape': ()}", raw(std::vector<int64_t>{9})));
  auto c = npy_read(p);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->shape.empty());
  EXPECT_EQ(*npy_to_i64(*c), std::vector<int64_t>{9});
}

TEST(Npy, ConvertsOtherElementTypes) {
  TempDir dir;
  const fs::path p = dir / "c.npy";
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x3800};  // 1, -2, 0.5
  ASSERT_TRUE(npy_write(p, "<f2", {3}, halves.data(), 6).is_ok());
  EXPECT_EQ(*npy_to_f32(*npy_read(p)), (std::vector<float>{1.0f, -2.0f, 0.5f}));

  const std::vector<double> doubles = {0.25, -8.0};
  ASSERT_TRUE(npy_write(p, "<f8", {2}, doubles.data(), 16).is_ok());
  EXPECT_EQ(*npy_to_f32(*npy_read(p)), (std::vector<float>{0.25f, -8.0f}));

  const std::vector<uint8_t> bytes = {0, 200, 255};
  ASSERT_TRUE(npy_write(p, "|u1", {3}, bytes.data(), 3).is_ok());
  EXPECT_EQ(*npy_to_i64(*npy_read(p)), (std::vector<int64_t>{0, 200, 255}));

  const std::vector<uint32_t> u32 = {4000000000u};
  ASSERT_TRUE(npy_write(p, "<u4", {1}, u32.data(), 4).is_ok());
  EXPECT_EQ(*npy_to_i64(*npy_read(p)), (std::vector<int64_t>{4000000000}));

  // A caller-built array whose bytes contradict its shape is refused, not over-read.
  NpyArray bad{"<f4", {4}, std::vector<uint8_t>(8)};
  EXPECT_EQ(npy_to_f32(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(Npy, RejectsFortranOrder) {
  TempDir dir;
  const fs::path p = dir / "fortran.npy";
  write_all(p, make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", raw(std::vector<float>(4))));
  expect_error(read_status(p), StatusCode::kUnsupported, {"fortran.npy", "Fortran"});
}

TEST(Npy, RejectsBigEndianAndExoticTypes) {
  TempDir dir;
  const fs::path p = dir / "be.npy";
  write_all(p, make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", raw(std::vector<float>(2))));
  expect_error(read_status(p), StatusCode::kUnsupported, {"be.npy", ">f4"});
  write_all(p, make_npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0')));
  expect_error(read_status(p), StatusCode::kUnsupported, {"be.npy"});
  write_all(p, make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0')));
  expect_error(read_status(p), StatusCode::kCorrupt, {"be.npy"});
}

TEST(Npy, RejectsTruncatedData) {
  TempDir dir;
  const fs::path p = dir / "trunc.npy";
  ASSERT_TRUE(npy_write_f32(p, {3, 5}, std::vector<float>(15, 1.0f)).is_ok());
  fs::resize_file(p, fs::file_size(p) - 4);
  expect_error(read_status(p), StatusCode::kCorrupt, {"trunc.npy", "(3, 5)"});
}

TEST(Npy, EveryPrefixIsRejectedCleanly) {
  TempDir dir;
  const fs::path good = dir / "good.npy";
  ASSERT_TRUE(npy_write_f32(good, {2, 3}, std::vector<float>(6, 1.0f)).is_ok());
  const std::string bytes = read_all(good);
  const fs::path p = dir / "cut.npy";
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_all(p, bytes.substr(0, len));
    expect_error(read_status(p), StatusCode::kCorrupt, {"cut.npy"});
  }
}

TEST(Npy, RejectsMalformedHeaders) {
  TempDir dir;
  const fs::path p = dir / "bad.npy";
  write_all(p, "NOTNUMPYATALL");
  expect_error(read_status(p), StatusCode::kCorrupt, {"bad.npy", "magic"});
  for (const std::string& dict : {
           std::string("{'descr': '<f4', 'fortran_order': False}"),                // no shape
           std::string("{'descr': '<f4', 'shape': (1,)}"),                         // no fortran_order
           std::string("{'fortran_order': False, 'shape': (1,)}"),                 // no descr
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"),  // negative dim
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (1,"),     // unterminated
           std::string("{'descr': 'f4', 'fortran_order': False, 'shape': (1,)}"),    // junk descr
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"),
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"),
       }) {
    write_all(p, make_npy(dict, raw(std::vector<float>{1})));
    expect_error(read_status(p), StatusCode::kCorrupt, {"bad.npy"});
  }
  // Extra bytes after the data contradict the shape too.
  write_all(p, make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", raw(std::vector<float>{1, 2})));
  expect_error(read_status(p), StatusCode::kCorrupt, {"bad.npy"});
  // An unknown format version.
  std::string v9 = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", raw(std::vector<float>{1}));
  v9[6] = 9;
  write_all(p, v9);
  expect_error(read_status(p), StatusCode::kUnsupported, {"bad.npy"});
}

TEST(Npy, MissingFileIsNotFound) {
  TempDir dir;
  expect_error(read_status(dir / "none.npy"), StatusCode::kNotFound, {"none.npy"});
}

TEST(Npy, WriteRejectsSizeMismatch) {
  TempDir dir;
  const std::vector<float> three = {1, 2, 3};
  expect_error(npy_write(dir / "w.npy", "<f4", {2, 2}, three.data(), 12), StatusCode::kInvalidArgument,
               {"w.npy"});
  expect_error(npy_write(dir / "w.npy", ">f4", {3}, three.data(), 12), StatusCode::kInvalidArgument, {"w.npy"});
}

}  // namespace
}  // namespace sparrow
