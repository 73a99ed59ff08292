#include "node_pool_bench_pool.h"

#include <spawn.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include "bench_flags.h"
#include "sparsekv/node_pool.h"

extern char** environ;

namespace sparsekv::bench {

struct RemoteNodePool::Pool {
  std::shared_ptr<HostKVPool> pool;
};

namespace {

CacheOptions PoolShape(int64_t rows, int32_t row_bytes) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(1, row_bytes);
  o.top_k = o.hot_slots = o.max_requests = 1;  // unused: only the pool's shape counts
  o.host_page_tokens = 64;
  o.host_capacity_tokens = rows;
  o.max_context = 64;
  return o;
}

}  // namespace

int RunNodePoolFill(const std::string& name, const std::string& directory, int64_t rows,
                    int32_t row_bytes, const std::function<void(std::byte*, size_t)>& fill) {
  NodePoolOptions node;
  node.name = name;
  node.directory = directory;
  auto pool = CreateNodePool(PoolShape(rows, row_bytes), 1, node, CreateCpuBackend());
  if (!pool.ok()) Fail("creating the node pool: " + pool.status().ToString());
  HostKVPool& p = **pool;
  fill(p.layer_base(0), static_cast<size_t>(p.rows()) * row_bytes);
  std::cout << "ready " << p.node_pool_path() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

std::unique_ptr<RemoteNodePool> RemoteNodePool::Start(const std::string& self,
                                                      const std::vector<std::string>& child_args,
                                                      std::shared_ptr<Backend> backend) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) Fail("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> storage = {self};
  storage.insert(storage.end(), child_args.begin(), child_args.end());
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::unique_ptr<RemoteNodePool> r(new RemoteNodePool());
  if (posix_spawn(&r->child_, self.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    Fail("cannot start " + self);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  r->to_child_ = in[1];
  r->from_child_ = fdopen(out[0], "r");
  char line[4096] = {};
  if (fgets(line, sizeof(line), r->from_child_) == nullptr ||
      std::string(line).rfind("ready ", 0) != 0) {
    Fail("the filling process did not report its node pool");
  }
  r->path_ = std::string(line).substr(6);
  r->path_.erase(r->path_.find_last_not_of('\n') + 1);
  auto pool = OpenNodePool(r->path_, NodePoolOptions(), std::move(backend));
  if (!pool.ok()) Fail("opening the node pool: " + pool.status().ToString());
  r->pool_ = std::make_unique<Pool>(Pool{*pool});
  return r;
}

RemoteNodePool::~RemoteNodePool() {
  pool_.reset();  // detaches; the child detaches last and removes the file
  if (to_child_ >= 0) close(to_child_);
  int status = 0;
  if (child_ > 0 && waitpid(child_, &status, 0) == child_) {
    child_ok_ = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (from_child_ != nullptr) fclose(from_child_);
}

const std::byte* RemoteNodePool::rows() const { return pool_->pool->layer_base(0); }
int64_t RemoteNodePool::row_count() const { return pool_->pool->rows(); }
int64_t RemoteNodePool::bytes() const { return pool_->pool->bytes(); }

std::string SegmentBacking(const std::string& directory) {
  struct statfs fs {};
  std::string kind = "unknown";
  if (statfs(directory.c_str(), &fs) == 0) {
    kind = fs.f_type == 0x01021994 ? "tmpfs" : fs.f_type == 0x958458f6 ? "hugetlbfs" : "other";
  }
  if (kind == "tmpfs") {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    std::string setting;
    std::getline(in, setting);
    kind += ", shmem_enabled: " + setting;
  }
  return kind;
}

}  // namespace sparsekv::bench
