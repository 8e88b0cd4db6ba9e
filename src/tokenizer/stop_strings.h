// Stop strings over streamed text: passes text through until one of the strings appears, holding
// back any tail that could be the start of one, so no part of a stop string is ever emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sparrow {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);

  // Text safe to emit now. Once a stop string is found, returns the text before it and stopped()
  // becomes true; later calls return nothing.
  std::string push(std::string_view text);
  // End of the stream: whatever was held back.
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" if none).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace sparrow
