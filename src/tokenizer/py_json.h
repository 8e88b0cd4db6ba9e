// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it, which is how
// DeepSeek's chat encoder embeds tool schemas and non-string tool arguments in the prompt:
// ", " and ": " separators, keys in their original order, non-ASCII characters as they are,
// control characters as \u00XX, floats as Python's repr (shortest round trip: 1.0, 1e-05, 1e+16).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace sparrow {

std::string py_json_dumps(const nlohmann::ordered_json& value);
// A JSON string literal of `s` (with the quotes).
std::string py_json_quote(const std::string& s);

}  // namespace sparrow
