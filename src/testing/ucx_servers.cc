#include "testing/ucx_servers.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace sparsekv::testing {

UcxTransportOptions LoopbackOptions(const std::string& transports,
                                    std::chrono::milliseconds timeout) {
  UcxTransportOptions options;
  options.transports = transports;
  if (transports == "tcp") options.net_devices = "lo";
  options.operation_timeout = timeout;
  return options;
}

bool HaveUcx() {
  return CreateUcxTransport(UcxTransportOptions{}).status().code() != StatusCode::kUnavailable;
}

ThreadServer::ThreadServer(const std::string& transports, uint64_t bytes) : memory_(bytes) {
  for (uint64_t i = 0; i < bytes; ++i) memory_[i] = PatternByte(i);
  auto transport = CreateUcxTransport(LoopbackOptions(transports));
  EXPECT_TRUE(transport.ok()) << transport.status().ToString();
  if (!transport.ok()) return;
  transport_ = std::move(*transport);
  auto region = transport_->RegisterRegion(memory_.data(), bytes);
  EXPECT_TRUE(region.ok()) << region.status().ToString();
  if (!region.ok()) return;
  region_ = *region;
  auto descriptor = transport_->ExportRegion(region_);
  EXPECT_TRUE(descriptor.ok()) << descriptor.status().ToString();
  if (descriptor.ok()) descriptor_ = *descriptor;
  thread_ = std::thread([this] {
    while (!stop_.load()) transport_->WaitForEvents(std::chrono::milliseconds(20)).IgnoreError();
  });
}

ThreadServer::~ThreadServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

ChildServer::ChildServer(const std::string& transports, uint64_t bytes) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const std::string size = std::to_string(bytes);
  const std::string fd = std::to_string(fds[1]);
  pid_ = fork();
  if (pid_ == 0) {
    close(fds[0]);
    execl(SPARSEKV_TRANSPORT_TEST_CHILD, SPARSEKV_TRANSPORT_TEST_CHILD, transports.c_str(),
          size.c_str(), fd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  StatusOr<std::string> descriptor = ReadDescriptor(fds[0], std::chrono::seconds(20));
  close(fds[0]);
  EXPECT_TRUE(descriptor.ok()) << "child server: " << descriptor.status().ToString();
  if (descriptor.ok()) descriptor_ = *descriptor;
}

void ChildServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void ChildServer::Stop() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

}  // namespace sparsekv::testing
