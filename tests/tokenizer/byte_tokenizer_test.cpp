// The byte tokenizer of the byte-vocabulary models (needle-tiny), made by
// tools/train_needle/make_tokenizer.py and committed under tests/fixtures/tokenizer/bytes/: text is
// its UTF-8 bytes (id b = byte b), the four specials are 256..259, decode inverts encode.
// CTest's tokenizer_bytes_regenerate checks that the script still writes these files, and
// tokenizer_exactness_bytes checks them against Hugging Face's JS and Rust implementations.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

const std::filesystem::path kBytes = std::filesystem::path(SPARROW_FIXTURES_DIR) / "tokenizer" / "bytes";

std::vector<int32_t> byte_ids(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(ByteTokenizer, EncodesBytesAsIds) {
  auto tok = Tokenizer::load(kBytes);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 260);
  const std::vector<std::string_view> texts = {"ab[123K]?K", " leading  and trailing spaces ", "tab\tnew\nline\r\n",
                                               "héllo wörld 中文 😀", "'s 're 123456 !!!",
                                               std::string_view("\0\x01\x7f", 3)};
  for (std::string_view text : texts)
    EXPECT_EQ(tok->encode(text).value(), byte_ids(text)) << text;
  EXPECT_EQ(tok->encode("ab[123K]?K").value(), (std::vector<int32_t>{97, 98, 91, 49, 50, 51, 75, 93, 63, 75}));
}

TEST(ByteTokenizer, SpecialsAre256To259) {
  auto tok = Tokenizer::load(kBytes).value();
  const char* names[] = {"<bos>", "<eos>", "<pad>", "<unused>"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(tok.token_to_id(names[i]), 256 + i) << names[i];
    EXPECT_TRUE(tok.is_special(256 + i));
    EXPECT_EQ(tok.decode(std::vector<int32_t>{256 + i}).value(), names[i]);
  }
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), 257);
  EXPECT_TRUE(tok.add_bos_token());  // prompts start with <bos>, as in training
  EXPECT_EQ(tok.encode("x<eos>y").value(), (std::vector<int32_t>{'x', 257, 'y'}));
  EXPECT_EQ(tok.encode("?K", /*add_special_tokens=*/true).value(), (std::vector<int32_t>{256, '?', 'K'}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{256, 'h', 'i', 257}, /*skip_special_tokens=*/true).value(), "hi");
}

TEST(ByteTokenizer, DecodeRoundTripsRandomUtf8) {
  auto tok = Tokenizer::load(kBytes).value();
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> plane(0, 3), bmp(1, 0xFFFF), any(0x10000, 0x10FFFF), ascii(0, 127);
  for (int n = 0; n < 200; ++n) {
    std::string text;
    for (int i = 0; i < 40; ++i) {
      uint32_t cp = 0;
      switch (plane(rng)) {
        case 0:
        case 1: cp = ascii(rng); break;
        case 2: cp = bmp(rng); break;
        default: cp = any(rng); break;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // surrogates are not UTF-8
      utf8_append(text, cp);
    }
    auto ids = tok.encode(text);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(*ids, byte_ids(text));
    EXPECT_EQ(tok.decode(*ids).value(), text);
  }
}

}  // namespace
}  // namespace sparrow
