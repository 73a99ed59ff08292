// Test helper: a child process in its own process group, never left behind.
//
// The child is killed (SIGKILL to its whole process group) and reaped when the Subprocess is
// destroyed, and it gets SIGKILL from the kernel if the thread that started it dies first (a
// crashed test binary leaves no process behind either).
// Thread safety: not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv::testing {

class Subprocess {
 public:
  // Starts argv[0] (looked up in PATH if it has no '/') with arguments argv[1...], the current
  // environment plus `env` ("NAME=value", overriding), and stdout and stderr appended to
  // `log_path` (inherited if empty). NotFound if the program does not exist.
  static StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                     const std::vector<std::string>& env = {},
                                                     const std::string& log_path = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `signal` to the child's process group. No-op once it has been reaped.
  void Signal(int signal);
  // Waits at most `timeout` for the child to exit and reaps it. Returns its exit code, or 128 +
  // the signal that killed it; DeadlineExceeded if it is still running.
  StatusOr<int> WaitFor(std::chrono::milliseconds timeout);
  // True until the child has exited (reaps it if it has).
  bool Running();
  // SIGKILL to the process group, then reaps the child. Idempotent.
  void Kill();

 private:
  Subprocess(pid_t pid, int pid_fd) : pid_(pid), pid_fd_(pid_fd) {}

  pid_t pid_;
  int pid_fd_;                    // pidfd of the child: readable once it has exited
  std::optional<int> exit_code_;  // set once reaped
};

// A child's log: the whole file at `path` ("" if it cannot be read), and how often `what` occurs
// in `text` (overlapping occurrences counted).
std::string ReadFile(const std::string& path);
int Count(const std::string& text, const std::string& what);

}  // namespace sparsekv::testing
