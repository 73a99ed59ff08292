// The node pool side of node_pool_bench.cu, kept out of the CUDA source (compiled as C++17, which
// the library's public headers are not): the child process that creates and fills a node pool,
// and the parent's handle on it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sparsekv/backend.h"

namespace sparsekv::bench {

// The child: creates the node pool `name` in `directory` of `rows` rows of `row_bytes` (one
// layer), fills its rows with `fill(base, bytes)`, prints "ready PATH" on stdout and waits until
// its stdin closes. Returns the exit code.
int RunNodePoolFill(const std::string& name, const std::string& directory, int64_t rows,
                    int32_t row_bytes, const std::function<void(std::byte*, size_t)>& fill);

// A node pool created and filled by a child process (`self` run with `child_args`, which make it
// call RunNodePoolFill), attached by this process with `backend`. Fatal on any failure.
class RemoteNodePool {
 public:
  static std::unique_ptr<RemoteNodePool> Start(const std::string& self,
                                               const std::vector<std::string>& child_args,
                                               std::shared_ptr<Backend> backend);
  // Detaches, closes the child's stdin and reaps it.
  ~RemoteNodePool();
  RemoteNodePool(const RemoteNodePool&) = delete;
  RemoteNodePool& operator=(const RemoteNodePool&) = delete;

  const std::byte* rows() const;  // layer 0
  int64_t row_count() const;
  int64_t bytes() const;
  const std::string& path() const { return path_; }
  pid_t child() const { return child_; }
  // True if the child exited 0 (valid after destruction only through the destructor's check).
  bool child_ok() const { return child_ok_; }

 private:
  struct Pool;
  RemoteNodePool() = default;
  std::unique_ptr<Pool> pool_;
  std::string path_;
  pid_t child_ = -1;
  int to_child_ = -1;
  FILE* from_child_ = nullptr;
  bool child_ok_ = false;
};

// The file system of `directory` and, for a tmpfs, its transparent huge page setting.
std::string SegmentBacking(const std::string& directory);

}  // namespace sparsekv::bench
