#include "tokenizer/stop_strings.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace sparrow {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // The earliest occurrence of any stop string (the longest at the same position).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t p = held_.find(s);
    if (p < first || (p == first && p != std::string::npos && s.size() > matched_.size())) {
      first = p;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t len = std::min(held_.size(), s.size() - 1); len > hold; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  const size_t emit = utf8_complete_prefix(std::string_view(held_).substr(0, held_.size() - hold));
  std::string out = held_.substr(0, emit);
  held_.erase(0, emit);
  return out;
}

std::string StopStringFilter::finish() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace sparrow
