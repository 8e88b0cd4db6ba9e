// UTF-8 helpers for the tokenizer: validation, lossy repair, and the boundaries a stream of bytes
// can be cut at without splitting a character.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sparrow {

// Byte offset of the first byte that does not start or continue a valid UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF are invalid); nullopt if `s` is valid.
std::optional<size_t> utf8_find_invalid(std::string_view s);

// `s` with every invalid sequence replaced by U+FFFD, one replacement per maximal subpart (the
// Unicode "substitution of maximal subparts" practice, which Rust's from_utf8_lossy and the
// WHATWG TextDecoder both follow).
std::string utf8_repair(std::string_view s);

// Length of the longest prefix of `s` that does not end inside an incomplete (but so far valid)
// multi-byte sequence. Invalid bytes count as complete: they can never become valid.
size_t utf8_complete_prefix(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (REQUIRES: cp <= 0x10FFFF).
void utf8_append(std::string& out, uint32_t cp);

// Length in bytes of the valid sequence starting at s[i], or 0 if none starts there.
size_t utf8_sequence_length(std::string_view s, size_t i);

}  // namespace sparrow
