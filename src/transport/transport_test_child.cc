// transport_test_child: the child process of the transport tests (and of every test that starts a
// testing::ChildServer): serves one region over UCX until it is killed.
//
// Usage: transport_test_child TRANSPORTS BYTES FD
// Fills BYTES bytes with testing::PatternByte, registers and exports them, writes the descriptor
// to FD (testing::WriteDescriptor), closes FD, and then progresses its
// transport in wakeup mode until a signal ends it. It dies with its parent (PR_SET_PDEATHSIG).
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "sparsekv/transport.h"
#include "testing/served_region.h"

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TRANSPORTS BYTES FD\n", argv[0]);
    return 2;
  }
  const std::string transports = argv[1];
  const uint64_t bytes = std::stoull(argv[2]);
  const int fd = std::stoi(argv[3]);
  std::vector<std::byte> memory(bytes);
  for (uint64_t i = 0; i < bytes; ++i) memory[i] = sparsekv::testing::PatternByte(i);
  sparsekv::UcxTransportOptions options;
  options.transports = transports;
  if (transports == "tcp") options.net_devices = "lo";
  auto transport = sparsekv::CreateUcxTransport(options);
  if (!transport.ok()) {
    std::fprintf(stderr, "%s\n", transport.status().ToString().c_str());
    return 1;
  }
  auto region = (*transport)->RegisterRegion(memory.data(), bytes);
  auto descriptor = region.ok() ? (*transport)->ExportRegion(*region)
                                : sparsekv::StatusOr<std::string>(region.status());
  if (!descriptor.ok()) {
    std::fprintf(stderr, "%s\n", descriptor.status().ToString().c_str());
    return 1;
  }
  if (!sparsekv::testing::WriteDescriptor(fd, *descriptor)) return 1;
  close(fd);
  for (;;) (*transport)->WaitForEvents(std::chrono::milliseconds(1000)).IgnoreError();
}
