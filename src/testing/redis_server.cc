#include "testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace sparsekv::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds Left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// One PING on a fresh connection to 127.0.0.1:port: true if the answer is +PONG before deadline.
bool Ping(int port, Clock::time_point deadline) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  constexpr char kPing[] = "PING\r\n";
  ok = ok && send(fd, kPing, sizeof(kPing) - 1, MSG_NOSIGNAL) == sizeof(kPing) - 1;
  std::string reply;
  while (ok && reply.find("\r\n") == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    char buffer[64];
    ok = poll(&p, 1, static_cast<int>(Left(deadline).count())) == 1;
    const ssize_t n = ok ? recv(fd, buffer, sizeof(buffer), 0) : -1;
    ok = n > 0;
    if (ok) reply.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return ok && reply.starts_with("+PONG");
}

}  // namespace

StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(std::string("socket: ") + strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  const int error = errno;
  close(fd);
  if (!ok) return Internal(std::string("bind to a free port: ") + strerror(error));
  return static_cast<int>(ntohs(addr.sin_port));
}

StatusOr<std::string> MakeTempDir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/sparsekv-" + tag + "-XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    return Internal("mkdtemp " + path + ": " + strerror(errno));
  }
  return path;
}

StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(std::chrono::milliseconds deadline) {
  SPARSEKV_ASSIGN_OR_RETURN(std::string dir, MakeTempDir("redis"));
  // The port may be taken between FreeLoopbackPort and the server's bind: then the server exits
  // and another port is tried.
  Status last = Internal("RedisServer: no attempt");
  for (int attempt = 0; attempt < 5; ++attempt) {
    SPARSEKV_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
    std::unique_ptr<RedisServer> server(new RedisServer(dir, port));
    last = server->Launch(deadline);
    if (last.ok()) return server;
    if (last.code() == StatusCode::kNotFound) break;
  }
  std::filesystem::remove_all(dir);
  return last;
}

RedisServer::~RedisServer() {
  Stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void RedisServer::Stop() { process_.reset(); }

Status RedisServer::Restart(std::chrono::milliseconds deadline) { return Launch(deadline); }

Status RedisServer::Launch(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  SPARSEKV_ASSIGN_OR_RETURN(
      process_,
      Subprocess::Start({"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                         "--save", "", "--appendonly", "no", "--dir", dir_, "--daemonize", "no",
                         "--protected-mode", "no", "--logfile", dir_ + "/redis.log"}));
  // Between attempts, wait on the server's exit (a failed start), never longer than 10 ms.
  while (!Ping(port_, deadline)) {
    const auto left = Left(deadline);
    if (left.count() == 0) {
      process_.reset();
      return DeadlineExceeded("redis-server on port " + std::to_string(port_) +
                              " did not answer PING in time (log: " + dir_ + "/redis.log)");
    }
    if (process_->WaitFor(std::min(left, std::chrono::milliseconds(10))).ok()) {
      process_.reset();
      return Unavailable("redis-server on port " + std::to_string(port_) +
                         " exited at start (log: " + dir_ + "/redis.log)");
    }
  }
  return Status::Ok();
}

}  // namespace sparsekv::testing
