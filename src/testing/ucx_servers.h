// Test helpers for the tests over UCX (transport, remote tier): pattern-filled regions served by
// a thread of this process or by a child process (transport_test_child), and loopback options.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sparsekv/transport.h"
#include "testing/served_region.h"

namespace sparsekv::testing {

// `transports` over loopback (tcp on "lo"), every transfer with `timeout`.
UcxTransportOptions LoopbackOptions(const std::string& transports,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(3));

// False if the library was built without UCX.
bool HaveUcx();

// A transport serving one pattern-filled region from a thread of this process, progressed in
// wakeup mode until destruction.
class ThreadServer {
 public:
  ThreadServer(const std::string& transports, uint64_t bytes);
  ~ThreadServer();
  const std::string& descriptor() const { return descriptor_; }
  std::vector<std::byte>& memory() { return memory_; }

 private:
  std::vector<std::byte> memory_;
  std::unique_ptr<Transport> transport_;
  RegionHandle region_{};
  std::string descriptor_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A child process (transport_test_child) serving one pattern-filled region until it is killed.
// It is started by fork + exec (no UCX state crosses the fork), dies with the test process
// (PR_SET_PDEATHSIG), and is killed and reaped by the destructor.
class ChildServer {
 public:
  ChildServer(const std::string& transports, uint64_t bytes);
  ~ChildServer() { Kill(); }
  void Kill();
  void Stop();  // SIGSTOP: alive but silent (a hung peer)
  const std::string& descriptor() const { return descriptor_; }

 private:
  pid_t pid_ = -1;
  std::string descriptor_;
};

}  // namespace sparsekv::testing
