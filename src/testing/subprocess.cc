#include "testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace sparsekv::testing {
namespace {

// argv[0] as execve wants it: a path, found in PATH when it has no '/'. Empty if not found.
std::string ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return access(program.c_str(), X_OK) == 0 ? program : std::string();
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                        const std::vector<std::string>& env,
                                                        const std::string& log_path) {
  if (argv.empty()) return InvalidArgument("Subprocess: empty argv");
  const std::string program = ResolveProgram(argv[0]);
  if (program.empty()) return NotFound("Subprocess: no executable " + argv[0]);

  // Everything the child needs is built before fork: between fork and exec it only makes
  // async-signal-safe calls (the test binary may have threads).
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const std::string& o : env) overridden |= o.substr(0, o.find('=')) == name;
    if (!overridden) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> c_argv, c_env;
  for (const std::string& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const std::string& e : environment) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return Internal("Subprocess: cannot open " + log_path + ": " + strerror(errno));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    execve(program.c_str(), c_argv.data(), c_env.data());
    _exit(127);
  }
  const int fork_errno = errno;
  if (log_fd >= 0) close(log_fd);
  if (pid < 0) return Internal(std::string("Subprocess: fork failed: ") + strerror(fork_errno));
  setpgid(pid, pid);  // also here, so that the group exists before Signal can be called
  const int pid_fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pid_fd < 0) {
    const int open_errno = errno;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return Internal(std::string("Subprocess: pidfd_open failed: ") + strerror(open_errno));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, pid_fd));
}

Subprocess::~Subprocess() {
  Kill();
  close(pid_fd_);
}

void Subprocess::Signal(int signal) {
  if (!exit_code_) kill(-pid_, signal);
}

StatusOr<int> Subprocess::WaitFor(std::chrono::milliseconds timeout) {
  if (exit_code_) return *exit_code_;
  pollfd fd{pid_fd_, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int ready = poll(&fd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready > 0) break;
    if (ready == 0) {
      return DeadlineExceeded("Subprocess " + std::to_string(pid_) + " still running after " +
                              std::to_string(timeout.count()) + " ms");
    }
    if (errno != EINTR) return Internal(std::string("Subprocess: poll: ") + strerror(errno));
  }
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) return Internal(std::string("Subprocess: waitpid: ") + strerror(errno));
  }
  exit_code_ = DecodeWaitStatus(status);
  return *exit_code_;
}

bool Subprocess::Running() {
  if (exit_code_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ = DecodeWaitStatus(status);
    return false;
  }
  return true;
}

void Subprocess::Kill() {
  if (exit_code_) return;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_code_ = DecodeWaitStatus(status);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace sparsekv::testing
