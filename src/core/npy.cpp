// .npy reader/writer. See npy.h for the accepted subset.
//
// File layout: "\x93NUMPY", major, minor, header length (u16 LE for v1, u32 LE for v2/v3), then a
// Python dict literal such as "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }" padded
// with spaces and ending in '\n' so the data starts at a multiple of 64, then the raw data.
// The dict is parsed by a small hand-written tokenizer (strings, True/False, integer tuples) rather
// than trusting a fixed layout, because other writers order and space the keys differently.
#include "core/npy.h"

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include "core/dtype.h"

namespace sparrow {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "npy codecs assume a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

std::string where(const fs::path& path) { return path.string() + ": "; }

// A parsed descr. Only simple numeric kinds are representable.
struct Descr {
  char kind = 0;     // 'f', 'i', 'u', 'b'
  size_t size = 0;   // bytes per element
  std::string canonical;  // normalised spelling ("<f4", "|u1")
};

// Parses a numpy type string. Returns Unsupported for valid-but-unhandled types (big-endian,
// complex, strings, objects, long double), InvalidArgument for junk.
Expected<Descr> parse_descr(const std::string& s) {
  if (s.size() < 2) return Status::invalid_argument("bad dtype descr '" + s + "'");
  char order = s[0];
  const char kind = s[1];
  if (order != '<' && order != '>' && order != '|' && order != '=')
    return Status::invalid_argument("bad byte order in dtype descr '" + s + "'");
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b')
    return Status::unsupported("dtype '" + s + "' (only float, int, uint and bool are handled)");
  if (s.size() < 3) return Status::invalid_argument("dtype descr '" + s + "' lacks an item size");
  size_t size = 0;
  for (size_t i = 2; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i])) || size > 1000)
      return Status::invalid_argument("bad dtype descr '" + s + "'");
    size = size * 10 + static_cast<size_t>(s[i] - '0');
  }
  bool size_ok = false;
  switch (kind) {
    case 'f': size_ok = size == 2 || size == 4 || size == 8; break;
    case 'i':
    case 'u': size_ok = size == 1 || size == 2 || size == 4 || size == 8; break;
    default: size_ok = size == 1; break;  // 'b'
  }
  if (!size_ok) return Status::unsupported("dtype '" + s + "' (unhandled item size)");
  if (order == '>' && size > 1) return Status::unsupported("big-endian dtype '" + s + "'");
  // Byte order is meaningless for 1-byte items; numpy spells those with '|'.
  if (size == 1) order = '|';
  if (order == '=' || order == '>') order = '<';
  Descr d;
  d.kind = kind;
  d.size = size;
  d.canonical = std::string(1, order) + kind + std::to_string(size);
  return d;
}

// numel(shape) * item_size with overflow and sign checks.
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, size_t item_size) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(item_size), &n)) return std::nullopt;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  // Python tuple syntax: "()", "(5,)", "(3, 5)".
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// The header dict's values: a string, a bool or a tuple of non-negative ints.
struct PyValue {
  enum Kind { kString, kBool, kIntTuple } kind = kString;
  std::string str;
  bool boolean = false;
  std::vector<int64_t> ints;
};

// Recursive-descent parser for the subset of Python literals numpy writes in the header.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  // Fills keys/values; returns an error description or empty on success.
  std::string parse(std::vector<std::pair<std::string, PyValue>>* out) {
    skip_ws();
    if (!eat('{')) return err("expected '{'");
    skip_ws();
    while (!eat('}')) {
      std::string key;
      if (!parse_string(&key)) return err("expected a quoted key");
      skip_ws();
      if (!eat(':')) return err("expected ':' after key '" + key + "'");
      skip_ws();
      PyValue value;
      if (const std::string e = parse_value(&value); !e.empty()) return e;
      out->emplace_back(std::move(key), std::move(value));
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;  // a trailing comma before '}' is legal Python and numpy writes one
      }
      skip_ws();
      if (!eat('}')) return err("expected ',' or '}'");
      break;
    }
    skip_ws();
    if (pos_ != text_.size()) return err("trailing characters after the dict");
    return {};
  }

 private:
  std::string err(const std::string& what) const {
    return "header dict: " + what + " at offset " + std::to_string(pos_);
  }
  void skip_ws() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool eat_word(std::string_view w) {
    if (text_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  // 'abc' or "abc"; escapes are not needed for the keys and descrs numpy writes.
  bool parse_string(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return false;
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return false;
    *out = std::string(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return true;
  }
  // Non-negative decimal integer; Python 2 writers may append 'L'.
  bool parse_int(int64_t* out) {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const int digit = text_[pos_] - '0';
      if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_add_overflow(v, int64_t{digit}, &v)) return false;
      ++pos_;
    }
    if (pos_ == start) return false;
    eat('L');
    *out = v;
    return true;
  }
  std::string parse_value(PyValue* v) {
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      v->kind = PyValue::kString;
      if (!parse_string(&v->str)) return err("unterminated string");
      return {};
    }
    if (eat_word("True")) {
      v->kind = PyValue::kBool;
      v->boolean = true;
      return {};
    }
    if (eat_word("False")) {
      v->kind = PyValue::kBool;
      v->boolean = false;
      return {};
    }
    if (eat('(')) {
      // "()", "(5,)", "(3, 5)", "(3, 5,)"
      v->kind = PyValue::kIntTuple;
      skip_ws();
      while (!eat(')')) {
        int64_t d = 0;
        if (!parse_int(&d)) return err("expected a non-negative integer in the shape tuple");
        v->ints.push_back(d);
        skip_ws();
        if (eat(',')) {
          skip_ws();
          continue;
        }
        if (!eat(')')) return err("expected ',' or ')' in the shape tuple");
        break;
      }
      return {};
    }
    if (pos_ < text_.size() && text_[pos_] == '[') return err("list values (structured dtypes) are not handled");
    return err("unexpected value");
  }

  std::string_view text_;
  size_t pos_ = 0;
};

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // host is little-endian (static_assert above)
  return v;
}

}  // namespace

Expected<NpyArray> npy_read(const fs::path& path) {
  std::error_code ec;
  const uintmax_t file_size = fs::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return Status::not_found(where(path) + "no such file");
    return Status::io_error(where(path) + "cannot stat: " + ec.message());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error(where(path) + "cannot open: " + std::strerror(errno));
  std::vector<uint8_t> file(static_cast<size_t>(file_size));
  in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size()));
  if (in.gcount() != static_cast<std::streamsize>(file.size())) return Status::io_error(where(path) + "short read");

  if (file.size() < kMagicLen + 4 || std::memcmp(file.data(), kMagic, kMagicLen) != 0)
    return Status::corrupt(where(path) + "not a .npy file (bad magic)");
  const int major = file[6];
  const int minor = file[7];
  size_t prefix = 0;
  uint64_t header_len = 0;
  if (major == 1) {
    prefix = 10;
    header_len = load_le<uint16_t>(&file[8]);
  } else if (major == 2 || major == 3) {
    prefix = 12;
    if (file.size() < prefix) return Status::corrupt(where(path) + "truncated before the header length");
    header_len = load_le<uint32_t>(&file[8]);
  } else {
    return Status::unsupported(where(path) + "npy format version " + std::to_string(major) + "." +
                               std::to_string(minor));
  }
  if (header_len > file.size() - prefix)
    return Status::corrupt(where(path) + "header length " + std::to_string(header_len) + " runs past the " +
                           std::to_string(file.size()) + "-byte file (truncated?)");

  const std::string_view header(reinterpret_cast<const char*>(&file[prefix]), static_cast<size_t>(header_len));
  std::vector<std::pair<std::string, PyValue>> items;
  if (std::string e = HeaderParser(header).parse(&items); !e.empty()) return Status::corrupt(where(path) + e);

  const PyValue* descr_v = nullptr;
  const PyValue* fortran_v = nullptr;
  const PyValue* shape_v = nullptr;
  for (const auto& [key, value] : items) {
    if (key == "descr") descr_v = &value;
    else if (key == "fortran_order") fortran_v = &value;
    else if (key == "shape") shape_v = &value;
  }
  if (descr_v == nullptr || descr_v->kind != PyValue::kString)
    return Status::corrupt(where(path) + "header lacks a string 'descr'");
  if (fortran_v == nullptr || fortran_v->kind != PyValue::kBool)
    return Status::corrupt(where(path) + "header lacks a boolean 'fortran_order'");
  if (shape_v == nullptr || shape_v->kind != PyValue::kIntTuple)
    return Status::corrupt(where(path) + "header lacks a tuple 'shape'");
  if (fortran_v->boolean) return Status::unsupported(where(path) + "Fortran-order arrays are not handled");

  auto descr = parse_descr(descr_v->str);
  if (!descr.is_ok()) {
    const Status& st = descr.status();
    // A junk descr is a corrupt file; an unhandled-but-valid one stays Unsupported.
    if (st.code() == StatusCode::kUnsupported) return Status::unsupported(where(path) + st.message());
    return Status::corrupt(where(path) + st.message());
  }
  const std::optional<uint64_t> need = checked_nbytes(shape_v->ints, descr->size);
  if (!need) return Status::corrupt(where(path) + "shape " + shape_string(shape_v->ints) + " overflows");
  const uint64_t have = file.size() - prefix - header_len;
  if (have != *need)
    return Status::corrupt(where(path) + "data is " + std::to_string(have) + " bytes but shape " +
                           shape_string(shape_v->ints) + " of " + descr->canonical + " needs " +
                           std::to_string(*need) + (have < *need ? " (truncated file?)" : ""));

  NpyArray out;
  out.descr = descr->canonical;
  out.shape = shape_v->ints;
  out.bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(prefix + header_len), file.end());
  return out;
}

Status npy_write(const fs::path& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
                 size_t nbytes) {
  auto d = parse_descr(descr);
  if (!d.is_ok()) return Status::invalid_argument(where(path) + d.status().message());
  const std::optional<uint64_t> need = checked_nbytes(shape, d->size);
  if (!need) return Status::invalid_argument(where(path) + "shape " + shape_string(shape) + " is negative or overflows");
  if (*need != nbytes)
    return Status::invalid_argument(where(path) + std::to_string(nbytes) + " bytes given but shape " +
                                    shape_string(shape) + " of " + d->canonical + " needs " + std::to_string(*need));
  if (nbytes > 0 && data == nullptr) return Status::invalid_argument(where(path) + "null data");

  std::string header = "{'descr': '" + d->canonical + "', 'fortran_order': False, 'shape': " + shape_string(shape) + ", }";
  // Pad with spaces and a final '\n' so the data starts at a multiple of 64 bytes (numpy's rule).
  size_t prefix = 10;
  size_t total = prefix + header.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  if (padded - prefix > 0xffff) {  // does not fit v1's u16 length: use v2
    prefix = 12;
    total = prefix + header.size() + 1;
    padded = (total + 63) / 64 * 64;
  }
  header.append(padded - total, ' ');
  header.push_back('\n');
  const uint64_t header_len = header.size();

  std::vector<uint8_t> pre(kMagic, kMagic + kMagicLen);
  pre.push_back(prefix == 10 ? 1 : 2);
  pre.push_back(0);
  const int len_bytes = prefix == 10 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) pre.push_back(static_cast<uint8_t>(header_len >> (8 * i)));

  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::io_error(where(path) + "cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(pre.data(), 1, pre.size(), f) == pre.size() &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  if (ok && nbytes > 0) ok = std::fwrite(data, 1, nbytes, f) == nbytes;
  const int write_err = errno;
  if (std::fclose(f) != 0 && ok) return Status::io_error(where(path) + "close failed: " + std::strerror(errno));
  if (!ok) return Status::io_error(where(path) + "write failed: " + std::strerror(write_err));
  return Status::ok();
}

Status npy_write_f32(const fs::path& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  return npy_write(path, "<f4", shape, data.data(), data.size() * sizeof(float));
}

namespace {

// Checks a caller-built NpyArray is self-consistent before converting it.
Expected<Descr> checked_descr(const NpyArray& a) {
  SPARROW_ASSIGN_OR_RETURN(Descr d, parse_descr(a.descr));
  const std::optional<uint64_t> need = checked_nbytes(a.shape, d.size);
  if (!need || *need != a.bytes.size())
    return Status::invalid_argument("npy array of " + a.descr + " shape " + shape_string(a.shape) + " holds " +
                                    std::to_string(a.bytes.size()) + " bytes, inconsistent with its shape");
  return d;
}

}  // namespace

Expected<std::vector<float>> npy_to_f32(const NpyArray& a) {
  SPARROW_ASSIGN_OR_RETURN(Descr d, checked_descr(a));
  if (d.kind != 'f') return Status::unsupported("npy_to_f32: dtype '" + a.descr + "' is not a float type");
  const size_t n = a.bytes.size() / d.size;
  std::vector<float> out(n);
  const uint8_t* p = a.bytes.data();
  for (size_t i = 0; i < n; ++i, p += d.size) {
    switch (d.size) {
      case 2: out[i] = f16_to_f32(load_le<uint16_t>(p)); break;
      case 4: out[i] = load_le<float>(p); break;
      default: out[i] = static_cast<float>(load_le<double>(p)); break;
    }
  }
  return out;
}

Expected<std::vector<int64_t>> npy_to_i64(const NpyArray& a) {
  SPARROW_ASSIGN_OR_RETURN(Descr d, checked_descr(a));
  if (d.kind == 'f') return Status::unsupported("npy_to_i64: dtype '" + a.descr + "' is not an integer type");
  const size_t n = a.bytes.size() / d.size;
  std::vector<int64_t> out(n);
  const uint8_t* p = a.bytes.data();
  const bool is_signed = d.kind == 'i';
  for (size_t i = 0; i < n; ++i, p += d.size) {
    switch (d.size) {
      case 1: out[i] = is_signed ? int64_t{load_le<int8_t>(p)} : int64_t{load_le<uint8_t>(p)}; break;
      case 2: out[i] = is_signed ? int64_t{load_le<int16_t>(p)} : int64_t{load_le<uint16_t>(p)}; break;
      case 4: out[i] = is_signed ? int64_t{load_le<int32_t>(p)} : int64_t{load_le<uint32_t>(p)}; break;
      default:
        if (is_signed) {
          out[i] = load_le<int64_t>(p);
        } else {
          const auto u = load_le<uint64_t>(p);
          if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return Status::invalid_argument("npy_to_i64: element " + std::to_string(i) + " = " + std::to_string(u) +
                                            " does not fit int64");
          out[i] = static_cast<int64_t>(u);
        }
        break;
    }
  }
  return out;
}

}  // namespace sparrow
