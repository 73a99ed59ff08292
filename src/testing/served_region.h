// What a process serving a test region over a transport shares with its readers (the tests'
// child servers, transport_test_child, remote_read_bench --serve): the bytes the region holds, and
// the descriptor sent back through a pipe as a u64 length followed by the bytes. Header-only and
// free of GoogleTest, so that the peer programs and the benchmarks use it too.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "sparsekv/status.h"

namespace sparsekv::testing {

// The byte a served region holds at `offset`.
inline std::byte PatternByte(uint64_t offset) {
  return static_cast<std::byte>((offset * 2654435761u) >> 13);
}

// Sends `descriptor` through `fd`. False on a failed or short write.
inline bool WriteDescriptor(int fd, const std::string& descriptor) {
  const uint64_t size = descriptor.size();
  return write(fd, &size, sizeof(size)) == static_cast<ssize_t>(sizeof(size)) &&
         write(fd, descriptor.data(), size) == static_cast<ssize_t>(size);
}

// Reads one descriptor from `fd`, waiting at most `timeout` in all. Unavailable if the writer
// closed the pipe first, DeadlineExceeded if it took longer.
inline StatusOr<std::string> ReadDescriptor(int fd, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::string data;
  uint64_t size = 0;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) return Unavailable("the server closed its pipe before sending a descriptor");
    data.append(buffer, static_cast<size_t>(n));
    if (data.size() >= sizeof(size)) {
      std::memcpy(&size, data.data(), sizeof(size));
      if (data.size() >= sizeof(size) + size) return data.substr(sizeof(size), size);
    }
  }
  return DeadlineExceeded("the server sent no descriptor in time");
}

}  // namespace sparsekv::testing
