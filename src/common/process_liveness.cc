#include "common/process_liveness.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace sparsekv {
namespace {

// Field 22 of /proc/<pid>/stat, 0 for a process that exited (zombie), nullopt if unreadable.
// Read with read(2) and parsed by hand: the process may be a host (a Python interpreter, say)
// whose iostreams' global locale is not the classic one.
std::optional<uint64_t> StartTime(const std::string& stat_path) {
  const int fd = open(stat_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buffer[4096];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  close(fd);
  if (n <= 0) return std::nullopt;
  const std::string_view line(buffer, static_cast<size_t>(n));
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields after the last ')'.
  const size_t close_paren = line.rfind(')');
  if (close_paren == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(close_paren + 1);
  std::string_view field;
  const auto next = [&]() {
    const size_t begin = rest.find_first_not_of(" \n");
    if (begin == std::string_view::npos) return false;
    const size_t end = rest.find_first_of(" \n", begin);
    field =
        rest.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
    return true;
  };
  if (!next()) return std::nullopt;                            // field 3: the state
  if (field == "Z" || field == "X" || field == "x") return 0;  // exited, not yet reaped
  for (int i = 4; i <= 22; ++i) {
    if (!next()) return std::nullopt;
  }
  uint64_t start = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), start);
  if (error != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return start;
}

}  // namespace

uint64_t OwnStartTime() { return StartTime("/proc/self/stat").value_or(0); }

bool ProcessAlive(int pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  const std::optional<uint64_t> now = StartTime("/proc/" + std::to_string(pid) + "/stat");
  if (!now.has_value()) {
    // The pid exists (kill said so, or it was reaped just now): without /proc, assume the
    // registered process, unless it is gone by now.
    return !(kill(pid, 0) != 0 && errno == ESRCH);
  }
  return *now != 0 && (start_time == 0 || *now == start_time);
}

}  // namespace sparsekv
