#include "tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace sparrow {

namespace {

constexpr int kBarWidth = 40;
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

// A "Name:   123 kB" line of /proc/self/status, in bytes.
int64_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::stoll(line.substr(n + 1)) * 1024;
  }
  return -1;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(double done, double total, const char* unit, double show_scale) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total;
  if (drawn_ && !last && now - last_ < kRedrawInterval) return;
  last_ = now;
  const double frac = total > 0 ? std::min(1.0, done / total) : 1.0;
  const int filled = static_cast<int>(frac * kBarWidth);
  std::string bar(filled, '#');
  bar.append(kBarWidth - filled, '.');
  const int decimals = show_scale == 1.0 ? 0 : 2;  // counts, or scaled sizes such as GB
  std::fprintf(stderr, "\r%s [%s] %3d%%  %.*f/%.*f %s", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
               decimals, done * show_scale, decimals, total * show_scale, unit);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(stderr, "\r\033[K");  // carriage return, clear to end of line
  std::fflush(stderr);
  drawn_ = false;
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

int64_t process_peak_rss_bytes() { return proc_status_kb("VmHWM"); }
int64_t process_rss_bytes() { return proc_status_kb("VmRSS"); }

}  // namespace sparrow
