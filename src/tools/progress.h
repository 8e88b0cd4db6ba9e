// Terminal progress bars and process memory figures for the command-line tools.
//
// A ProgressBar draws one self-overwriting line on stderr, and only when stderr is a terminal
// (isatty), so logs and CI output stay clean; redraws are throttled to about ten per second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace sparrow {

class ProgressBar {
 public:
  // `enabled` false makes every call a no-op (pass stderr_is_terminal()).
  explicit ProgressBar(std::string label, bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Redraws with done/total; the numbers are shown times `show_scale` followed by `unit` (e.g. bytes
  // with 1e-9 and "GB").
  void update(double done, double total, const char* unit = "", double show_scale = 1.0);
  // Clears the line (the caller prints its own summary).
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// True when stderr is a terminal.
bool stderr_is_terminal();

// Peak resident set size of this process so far (VmHWM), in bytes; -1 if unknown.
int64_t process_peak_rss_bytes();
// Current resident set size (VmRSS), in bytes; -1 if unknown.
int64_t process_rss_bytes();

}  // namespace sparrow
