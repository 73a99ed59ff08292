// A one-line progress bar for long CLI runs, redrawn in place on a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace sparsekv::tools {

// Appears only once a run has lasted half a second, redraws at most ten times a second, and
// erases itself when destroyed. Disabled (a no-op) when `err` is not a terminal.
class ProgressBar {
 public:
  ProgressBar(std::ostream& err, bool enabled)
      : err_(err), enabled_(enabled), start_(Clock::now()), last_(start_) {}
  ~ProgressBar() {
    if (drawn_) err_ << "\r\033[K" << std::flush;
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(std::string_view phase, int64_t done, int64_t total) {
    if (!enabled_ || total <= 0) return;
    const Clock::time_point now = Clock::now();
    if (now - start_ < std::chrono::milliseconds(500)) return;
    if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total);
    err_ << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
         << phase << " " << done << "/" << total << std::flush;
    drawn_ = true;
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& err_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace sparsekv::tools
