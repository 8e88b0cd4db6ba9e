// NumPy .npy files (format versions 1.0, 2.0 and 3.0): little-endian, C-order arrays only.
//
// Used for reference activations and test fixtures. The whole file is read into memory.
// Invariants of an NpyArray returned by npy_read:
//   - descr is "<" or "|" followed by a kind in {f, i, u, b} and an item size ("<f4", "<i8", "|u1");
//     a native-order "=" in the file is normalised to "<" (Sparrow runs little-endian only);
//   - every dim is >= 0 and bytes.size() == numel(shape) * item size exactly.
// Big-endian data, Fortran order, structured/object/string dtypes are Unsupported; a header or size
// that contradicts the file is Corrupt. Messages name the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sparrow/status.h"

namespace sparrow {

struct NpyArray {
  std::string descr;           // "<f4", "<i8", "<i4", "<f2", "|u1", ...
  std::vector<int64_t> shape;  // empty for a 0-d (scalar) array
  std::vector<uint8_t> bytes;  // raw little-endian element data, C order

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

Expected<NpyArray> npy_read(const std::filesystem::path& path);

// Writes version 1.0 (2.0 if the header would not fit a 16-bit length). descr must be a
// little-endian/byte descr as above; nbytes must equal numel(shape) * item size.
Status npy_write(const std::filesystem::path& path, const std::string& descr, const std::vector<int64_t>& shape,
                 const void* data, size_t nbytes);
Status npy_write_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                     const std::vector<float>& data);

// Element conversions. npy_to_f32 accepts <f2, <f4, <f8 (f8 is rounded to float);
// npy_to_i64 accepts signed/unsigned ints of 1-8 bytes and |b1 (u8 values above INT64_MAX are
// InvalidArgument). Anything else is Unsupported.
Expected<std::vector<float>> npy_to_f32(const NpyArray& a);
Expected<std::vector<int64_t>> npy_to_i64(const NpyArray& a);

}  // namespace sparrow
