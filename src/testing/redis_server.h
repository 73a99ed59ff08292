// Test helper: a real redis-server on a free loopback port, in a temporary directory, without
// persistence. It is killed and reaped, and its directory removed, when the object is destroyed.
// Thread safety: not thread-safe.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>

#include "sparsekv/status.h"
#include "testing/subprocess.h"

namespace sparsekv::testing {

class RedisServer {
 public:
  // Starts `redis-server` (from PATH) and waits until it answers PING, at most `deadline`.
  // NotFound if redis-server is not installed; DeadlineExceeded if it never answered.
  static StatusOr<std::unique_ptr<RedisServer>> Start(
      std::chrono::milliseconds deadline = std::chrono::seconds(10));
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  // The server's directory (its log is redis.log there).
  const std::string& dir() const { return dir_; }
  // Kills the server (SIGKILL) and reaps it: clients see the connection drop.
  void Stop();
  // Starts it again on the same port (empty: nothing persists) and waits for PING.
  // REQUIRES: Stop() was called.
  Status Restart(std::chrono::milliseconds deadline = std::chrono::seconds(10));
  // Freezes (SIGSTOP) and thaws (SIGCONT) the server: while frozen, connections stay open but
  // nothing is answered. REQUIRES: running.
  void Freeze() { process_->Signal(SIGSTOP); }
  void Thaw() { process_->Signal(SIGCONT); }

 private:
  RedisServer(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}
  Status Launch(std::chrono::milliseconds deadline);

  std::string dir_;
  int port_;
  std::unique_ptr<Subprocess> process_;
};

// A loopback TCP port that was free a moment ago (bound to port 0, then closed).
StatusOr<int> FreeLoopbackPort();
// A fresh directory under $TMPDIR (or /tmp) named after `tag`.
StatusOr<std::string> MakeTempDir(const std::string& tag);

}  // namespace sparsekv::testing
