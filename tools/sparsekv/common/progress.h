// Progress of long CLI runs: a one-line bar redrawn in place on a terminal, or plain lines in a
// log, so that a run of minutes is never silent.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace sparsekv::tools {

// On a terminal (`terminal` true): a bar that appears once a run has lasted half a second,
// redraws at most ten times a second with the elapsed seconds, and erases itself when destroyed.
// Elsewhere (a pipe, a file): a line "<label>: <phase> <done>/<total>, <s> s" once the run has
// lasted `line_every` (10 s), then at most once per `line_every`, so that short runs print
// nothing.
class ProgressBar {
 public:
  ProgressBar(std::ostream& err, bool terminal, std::string label = "sparsekv",
              std::chrono::milliseconds line_every = std::chrono::seconds(10))
      : err_(err),
        terminal_(terminal),
        label_(std::move(label)),
        line_every_(line_every),
        start_(Clock::now()),
        last_(start_) {}
  ~ProgressBar() {
    if (drawn_) err_ << "\r\033[K" << std::flush;
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(std::string_view phase, int64_t done, int64_t total) {
    if (total <= 0) return;
    const Clock::time_point now = Clock::now();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now - start_).count();
    if (!terminal_) {
      if (now - last_ < line_every_) return;
      err_ << label_ << ": " << phase << " " << done << "/" << total << ", " << seconds << " s"
           << std::endl;
      last_ = now;
      return;
    }
    if (now - start_ < std::chrono::milliseconds(500)) return;
    if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total);
    err_ << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
         << phase << " " << done << "/" << total << " (" << seconds << " s)" << std::flush;
    drawn_ = true;
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& err_;
  bool terminal_;
  std::string label_;
  std::chrono::milliseconds line_every_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace sparsekv::tools
