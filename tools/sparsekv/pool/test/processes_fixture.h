// The fixture of the multi-process tests (scale_out_test, node_pool_test): a redis-server, a
// control plane connected to it under the test's key prefix, a temporary folder for the logs, and
// the child processes a test starts. After each test every child is killed and reaped, the logs
// are printed if the test failed, and the folder is removed. Parameterized by a string (a
// transport or a backend) for the tests' own use.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "sparsekv/control_plane.h"
#include "testing/harness.h"
#include "testing/redis_server.h"
#include "testing/subprocess.h"
#include "testing/wait_until.h"

namespace sparsekv::testing {

class ProcessesTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr std::chrono::milliseconds kDeadline{20000};

  explicit ProcessesTest(std::string key_prefix) : key_prefix_(std::move(key_prefix)) {}

  void SetUp() override {
    auto server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    redis_ = std::move(server).value();
    auto dir = MakeTempDir(key_prefix_);
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
    ControlPlaneOptions options;
    options.port = redis_->port();
    options.key_prefix = key_prefix_;
    auto plane = ControlPlane::Connect(options);
    ASSERT_TRUE(plane.ok()) << plane.status().ToString();
    plane_ = std::move(plane).value();
  }
  void TearDown() override {
    processes_.clear();  // kills and reaps whatever is still running
    if (HasFailure()) {
      for (const std::string& log : logs_) std::cerr << "---- " << log << "\n" << ReadFile(log);
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string ControlPlaneAddress() const { return "127.0.0.1:" + std::to_string(redis_->port()); }
  std::string LogPath(const std::string& name) const { return dir_ + "/" + name + ".log"; }
  std::string Log(const std::string& name) const { return ReadFile(LogPath(name)); }

  // Starts `argv` with its output in LogPath(name); the test owns the process.
  Subprocess* Start(const std::string& name, const std::vector<std::string>& argv) {
    auto process = Subprocess::Start(argv, {}, LogPath(name));
    EXPECT_TRUE(process.ok()) << process.status().ToString();
    if (!process.ok()) return nullptr;
    logs_.push_back(LogPath(name));
    processes_.push_back(std::move(process).value());
    return processes_.back().get();
  }

  // Waits until `name`'s log holds `what` at least `times` times.
  bool WaitForLog(const std::string& name, const std::string& what, int times = 1) {
    return WaitUntil([&] { return Count(Log(name), what) >= times; }, kDeadline);
  }

  // Sends SIGTERM and returns the exit code (-1 if it did not exit in time).
  static int Terminate(Subprocess* process) {
    process->Signal(SIGTERM);
    auto code = process->WaitFor(kDeadline);
    return code.ok() ? *code : -1;
  }

  const std::string key_prefix_;
  std::unique_ptr<RedisServer> redis_;
  std::string dir_;
  std::unique_ptr<ControlPlane> plane_;
  std::vector<std::unique_ptr<Subprocess>> processes_;
  std::vector<std::string> logs_;
};

}  // namespace sparsekv::testing
