// Node pools on the CPU backend: a segment in /dev/shm attached twice in this process (two
// HostKVPools over one segment behave as two processes do, bar liveness), and child processes
// that attach and are killed, with or without the segment's mutex.
#include "sparsekv/node_pool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "host_pool/node_segment.h"
#include "host_pool/pool_state.h"

namespace sparsekv {
namespace {

// A fresh name per test and process, so that parallel test runs never meet.
std::string UniqueName() {
  static int counter = 0;
  return "sparsekv-test-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

CacheOptions PoolOptions() {
  CacheOptions o;
  o.geometry.layers = {{24, 32}, {8, 8}};
  o.top_k = 4;
  o.hot_slots = 8;
  o.max_requests = 2;
  o.max_context = 64;
  o.host_page_tokens = 8;
  o.host_capacity_tokens = 256;  // 32 pages
  return o;
}

class NodePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_.name = UniqueName();
    path_ = node_.directory + "/" + node_.name;
  }
  void TearDown() override {
    // Whatever a failed test left behind.
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  std::shared_ptr<HostKVPool> MustCreate(int32_t max_owners = 6) {
    auto pool = CreateNodePool(PoolOptions(), max_owners, node_, backend_);
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    return pool.ok() ? *pool : nullptr;
  }
  std::shared_ptr<HostKVPool> MustOpen() {
    auto pool = OpenNodePool(path_, node_, backend_);
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    return pool.ok() ? *pool : nullptr;
  }
  // Reserves `tokens` for a new owner of `pool`, fills every row of layer l with byte l * 16 +
  // position % 16 + 1, seals them and returns {owner, seal}.
  NodePoolPrompt WriteSealed(HostKVPool& pool, int32_t tokens) {
    StatusOr<int32_t> owner = pool.AcquireOwner();
    EXPECT_TRUE(owner.ok()) << owner.status().ToString();
    if (!owner.ok()) return {};
    EXPECT_TRUE(pool.Reserve(*owner, tokens).ok());
    for (int32_t l = 0; l < pool.geometry().num_layers(); ++l) {
      const int32_t stride = pool.geometry().layers[l].row_stride;
      std::vector<std::byte> rows(static_cast<size_t>(tokens) * stride);
      for (int32_t p = 0; p < tokens; ++p) {
        std::memset(rows.data() + p * stride, l * 16 + p % 16 + 1, stride);
      }
      EXPECT_TRUE(WritePromptLayer(pool, *backend_, *owner, l, rows.data(), tokens, nullptr).ok());
    }
    StatusOr<uint64_t> seal = pool.Seal(*owner, tokens);
    EXPECT_TRUE(seal.ok()) << seal.status().ToString();
    return {*owner, seal.ok() ? *seal : 0};
  }

  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  NodePoolOptions node_;
  std::string path_;
};

TEST_F(NodePoolTest, TwoAttachesSeeOneBookkeepingAndOneSetOfRows) {
  auto writer = MustCreate();
  ASSERT_NE(writer, nullptr);
  EXPECT_TRUE(writer->is_node_pool());
  EXPECT_TRUE(FileExists(path_));
  auto reader = MustOpen();
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->node_pool_id(), writer->node_pool_id());
  EXPECT_EQ(reader->total_pages(), 32);
  EXPECT_EQ(reader->live_processes(), 2);
  EXPECT_EQ(reader->geometry().layers[0].row_stride, 32);

  const NodePoolPrompt prompt = WriteSealed(*writer, 20);  // 3 pages
  EXPECT_EQ(reader->free_pages(), 29);
  StatusOr<HostKVPool::SealedPages> shared = reader->ShareSealed(prompt.owner, prompt.seal);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared->tokens, 20);
  ASSERT_EQ(shared->pages.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(shared->pages[i], writer->page_table_row(prompt.owner)[i]);
    EXPECT_EQ(writer->RefCount(shared->pages[i]), 2);
  }
  // The reader sees the writer's bytes through its own mapping.
  const int32_t row = shared->pages[2] * 8 + 3;  // position 19
  EXPECT_NE(reader->row(0, row), writer->row(0, row));
  EXPECT_EQ(reader->row(0, row)[0], std::byte{0 * 16 + 19 % 16 + 1});
  EXPECT_EQ(reader->row(1, row)[7], std::byte{1 * 16 + 19 % 16 + 1});
  // The writer lets go: its seal ends, the reader's references keep the pages.
  writer->Release(prompt.owner);
  writer->ReleaseOwner(prompt.owner);
  EXPECT_EQ(reader->ShareSealed(prompt.owner, prompt.seal).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(writer->free_pages(), 29);
  EXPECT_EQ(reader->row(1, row)[7], std::byte{1 * 16 + 19 % 16 + 1});
  for (int32_t page : shared->pages) EXPECT_TRUE(reader->Unref(page));
  EXPECT_EQ(writer->free_pages(), 32);
}

TEST_F(NodePoolTest, SealsAreCheckedAndNeverReused) {
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const NodePoolPrompt a = WriteSealed(*pool, 9);
  EXPECT_EQ(pool->ShareSealed(a.owner, a.seal + 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->ShareSealed(a.owner, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->ShareSealed(-1, a.seal).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Seal(a.owner, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Seal(a.owner, 17).status().code(), StatusCode::kOutOfRange);  // 2 pages held
  EXPECT_EQ(pool->Seal(5, 1).status().code(), StatusCode::kInvalidArgument);    // a free owner
  // Sealing again replaces the seal; every seal is new.
  StatusOr<uint64_t> again = pool->Seal(a.owner, 16);
  ASSERT_TRUE(again.ok());
  EXPECT_GT(*again, a.seal);
  EXPECT_EQ(pool->ShareSealed(a.owner, a.seal).status().code(), StatusCode::kNotFound);
  StatusOr<HostKVPool::SealedPages> shared = pool->ShareSealed(a.owner, *again);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->tokens, 16);
  for (int32_t page : shared->pages) EXPECT_FALSE(pool->Unref(page));
  pool->Release(a.owner);
  const NodePoolPrompt b = WriteSealed(*pool, 4);
  EXPECT_EQ(b.owner, a.owner + 1);  // a's owner is still held (not ReleaseOwner'd)
  EXPECT_GT(b.seal, *again);
  EXPECT_EQ(pool->ShareSealed(a.owner, *again).status().code(), StatusCode::kNotFound);
}

TEST_F(NodePoolTest, AnOwnerOfAnotherProcessIsRefused) {
  auto writer = MustCreate();
  auto reader = MustOpen();
  ASSERT_TRUE(writer && reader);
  StatusOr<int32_t> owner = writer->AcquireOwner();
  ASSERT_TRUE(owner.ok());
  EXPECT_EQ(reader->Reserve(*owner, 8).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(writer->Reserve(*owner, 8).ok());
  EXPECT_EQ(reader->Seal(*owner, 8).status().code(), StatusCode::kFailedPrecondition);
  const std::vector<std::byte> rows(8 * 32);
  EXPECT_EQ(WritePromptLayer(*reader, *backend_, *owner, 0, rows.data(), 8, nullptr).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(WritePromptLayer(*writer, *backend_, *owner, 0, rows.data(), 9, nullptr).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(WritePromptLayer(*writer, *backend_, *owner, 2, rows.data(), 8, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(NodePoolTest, TheLastDetachRemovesTheFileAndDetachingDropsWhatWasHeld) {
  {
    auto writer = MustCreate();
    ASSERT_NE(writer, nullptr);
    {
      auto reader = MustOpen();
      ASSERT_NE(reader, nullptr);
      const NodePoolPrompt prompt = WriteSealed(*writer, 30);
      ASSERT_TRUE(reader->ShareSealed(prompt.owner, prompt.seal).ok());
      StatusOr<int32_t> page = reader->AllocatePage();
      ASSERT_TRUE(page.ok());
      EXPECT_EQ(writer->free_pages(), 32 - 4 - 1);
    }  // the reader detaches holding 5 references
    EXPECT_EQ(writer->free_pages(), 32 - 4);
    EXPECT_EQ(writer->shared_pages(), 0);
    EXPECT_EQ(writer->live_processes(), 1);
    EXPECT_TRUE(FileExists(path_));
  }
  EXPECT_FALSE(FileExists(path_));
  EXPECT_EQ(OpenNodePool(path_, node_, backend_).status().code(), StatusCode::kNotFound);
}

TEST_F(NodePoolTest, ALiveNameIsRefusedAndBadInputIsAnError) {
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const Status again = CreateNodePool(PoolOptions(), 4, node_, backend_).status();
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_NE(again.ToString().find("1 live process"), std::string::npos) << again.ToString();
  EXPECT_TRUE(FileExists(path_));
  NodePoolOptions bad = node_;
  for (const std::string& name : {std::string(""), std::string(".hidden"), std::string("a/b")}) {
    bad.name = name;
    EXPECT_EQ(CreateNodePool(PoolOptions(), 4, bad, backend_).status().code(),
              StatusCode::kInvalidArgument)
        << name;
  }
  bad.name = UniqueName();
  bad.max_processes = 0;
  EXPECT_EQ(CreateNodePool(PoolOptions(), 4, bad, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNodePool(PoolOptions(), 0, node_, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenNodePool(path_ + "-none", node_, backend_).status().code(), StatusCode::kNotFound);
  // A file that is not a segment.
  const std::string other = path_ + "-other";
  { std::ofstream(other) << std::string(8192, 'x'); }
  EXPECT_EQ(OpenNodePool(other, node_, backend_).status().code(), StatusCode::kFailedPrecondition);
  std::filesystem::remove(other);
}

TEST_F(NodePoolTest, EveryProcessSlotTakenIsResourceExhausted) {
  node_.max_processes = 2;
  auto a = MustCreate();
  auto b = MustOpen();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(OpenNodePool(path_, node_, backend_).status().code(), StatusCode::kResourceExhausted);
  b.reset();
  EXPECT_NE(MustOpen(), nullptr);
}

TEST_F(NodePoolTest, DescriptorRoundTripsAndRefusesOtherText) {
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const NodePoolDescriptor d = DescribeNodePool(*pool);
  EXPECT_EQ(d.path, path_);
  EXPECT_NE(d.id, 0u);
  StatusOr<NodePoolDescriptor> parsed = NodePoolDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->path, d.path);
  EXPECT_EQ(parsed->id, d.id);
  for (const char* text : {"", "sparsekv-node-pool/1 id=12 path=/x",
                           "sparsekv-node-pool/2 id=0123456789abcdef path=/x",
                           "sparsekv-node-pool/1 id=0123456789abcdeg path=/x",
                           "sparsekv-node-pool/1 id=0123456789abcdef path="}) {
    EXPECT_EQ(NodePoolDescriptor::Parse(text).status().code(), StatusCode::kInvalidArgument)
        << text;
  }
  CacheOptions o;
  UseNodePoolShape(*pool, o);
  EXPECT_EQ(o.host_capacity_tokens, 256);
  EXPECT_EQ(o.max_context, 64);
  EXPECT_EQ(o.host_page_tokens, 8);
  EXPECT_EQ(o.geometry.num_layers(), 2);
}

// ---- Child processes ----

// Keeps a child's pool attached until the child is killed.
void Keep(std::shared_ptr<HostKVPool> pool) {
  static std::vector<std::shared_ptr<HostKVPool>>* kept =
      new std::vector<std::shared_ptr<HostKVPool>>();
  kept->push_back(std::move(pool));
}

// Runs `body` in a child process that reports one byte on a pipe when `body` has returned and
// then waits to be killed; returns its pid once that byte came (or -1).
template <typename Body>
pid_t StartChild(Body body) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    close(fds[0]);
    const char ok = body() ? 'y' : 'n';
    [[maybe_unused]] ssize_t n = write(fds[1], &ok, 1);
    for (;;) pause();
  }
  close(fds[1]);
  char ok = 0;
  const ssize_t n = read(fds[0], &ok, 1);
  close(fds[0]);
  if (n != 1 || ok != 'y') {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return -1;
  }
  return child;
}

// SIGKILL, without reaping: a zombie counts as dead, as it does for any other process.
void KillChild(pid_t child) {
  kill(child, SIGKILL);
  siginfo_t info{};
  waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT);
}

TEST_F(NodePoolTest, AKilledProcessReferencesAndOwnersAreReclaimedOnce) {
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const NodePoolPrompt prompt = WriteSealed(*pool, 24);  // 3 pages
  const std::string path = path_;
  const pid_t child = StartChild([&] {
    auto mine = OpenNodePool(path, NodePoolOptions(), CreateCpuBackend());
    if (!mine.ok()) return false;
    Keep(*mine);
    HostKVPool& p = **mine;
    StatusOr<int32_t> owner = p.AcquireOwner();
    if (!owner.ok() || !p.Reserve(*owner, 40).ok()) return false;  // 5 pages of its own
    if (!p.ShareSealed(prompt.owner, prompt.seal).ok()) return false;
    if (!p.AllocatePage().ok()) return false;
    // And one of the parent's pages held through its own page table.
    StatusOr<int32_t> second = p.AcquireOwner();
    const std::vector<int32_t> first = {pool->page_table_row(prompt.owner)[0]};
    return second.ok() && p.Reserve(*second, 8, first).ok();
  });
  ASSERT_GT(child, 0);
  EXPECT_EQ(pool->free_pages(), 32 - 3 - 5 - 1);
  EXPECT_EQ(pool->RefCount(pool->page_table_row(prompt.owner)[0]), 3);
  EXPECT_EQ(pool->free_owners(), 6 - 3);
  EXPECT_EQ(pool->live_processes(), 2);
  EXPECT_EQ(pool->ReclaimDeadProcesses(), 0);  // alive

  KillChild(child);
  EXPECT_EQ(pool->ReclaimDeadProcesses(), 1);
  EXPECT_EQ(pool->ReclaimDeadProcesses(), 0);  // once
  waitpid(child, nullptr, 0);
  EXPECT_EQ(pool->free_pages(), 32 - 3);
  EXPECT_EQ(pool->free_owners(), 6 - 1);
  EXPECT_EQ(pool->live_processes(), 1);
  EXPECT_EQ(pool->shared_pages(), 0);
  for (int32_t i = 0; i < 3; ++i)
    EXPECT_EQ(pool->RefCount(pool->page_table_row(prompt.owner)[i]), 1);
  EXPECT_TRUE(pool->ShareSealed(prompt.owner, prompt.seal).ok());  // the survivor's seal stands
}

TEST_F(NodePoolTest, AKilledWritersSealEndsAndItsPagesAreFree) {
  auto reader = MustCreate();
  ASSERT_NE(reader, nullptr);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string path = path_;
  const pid_t child = StartChild([&] {
    auto mine = OpenNodePool(path, NodePoolOptions(), CreateCpuBackend());
    if (!mine.ok()) return false;
    Keep(*mine);
    const NodePoolPrompt prompt = WriteSealed(**mine, 17);
    return write(fds[1], &prompt, sizeof(prompt)) == sizeof(prompt);
  });
  ASSERT_GT(child, 0);
  NodePoolPrompt prompt;
  ASSERT_EQ(read(fds[0], &prompt, sizeof(prompt)), static_cast<ssize_t>(sizeof(prompt)));
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(reader->free_pages(), 29);
  KillChild(child);
  // Sharing reclaims first: a dead writer's prompt is never handed out.
  EXPECT_EQ(reader->ShareSealed(prompt.owner, prompt.seal).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reader->free_pages(), 32);
  waitpid(child, nullptr, 0);
}

TEST_F(NodePoolTest, AProcessKilledHoldingTheMutexLeavesAConsistentPool) {
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const NodePoolPrompt prompt = WriteSealed(*pool, 24);
  const std::string path = path_;
  const pid_t child = StartChild([&] {
    auto mine = OpenNodePool(path, NodePoolOptions(), CreateCpuBackend());
    if (!mine.ok() || !(*mine)->ShareSealed(prompt.owner, prompt.seal).ok()) return false;
    Keep(*mine);
    // Take the mutex through the segment and leave the derived state half-written, as a process
    // killed in the middle of an update would.
    auto segment = NodeSegment::Open(path, false);
    if (!segment.ok()) return false;
    // Mapped until the child dies: the kernel marks a dead holder's robust mutex through it.
    auto* header = reinterpret_cast<pool_state::Header*>(segment->release()->book());
    if (pthread_mutex_lock(&header->mutex) != 0) return false;
    header->free_pages = 12345;
    header->shared_pages = -7;
    header->first_free_word = 99;
    return true;  // killed while holding it
  });
  ASSERT_GT(child, 0);
  KillChild(child);
  // The next lock finds the holder dead, rebuilds the derived state, and reclaims it.
  EXPECT_EQ(pool->shared_pages(), 3);
  EXPECT_EQ(pool->free_pages(), 29);
  EXPECT_EQ(pool->ReclaimDeadProcesses(), 1);
  EXPECT_EQ(pool->shared_pages(), 0);
  StatusOr<int32_t> page = pool->AllocatePage();
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(*page, 3);  // the lowest free page: the bitmap was rebuilt too
  waitpid(child, nullptr, 0);
}

TEST_F(NodePoolTest, ASegmentWhoseProcessesAllDiedIsReplaced) {
  const std::string name = node_.name;
  const pid_t child = StartChild([&] {
    NodePoolOptions node;
    node.name = name;
    auto pool = CreateNodePool(PoolOptions(), 4, node, CreateCpuBackend());
    if (!pool.ok() || !(*pool)->AllocatePage().ok()) return false;
    Keep(*pool);
    return true;
  });
  ASSERT_GT(child, 0);
  EXPECT_TRUE(FileExists(path_));
  EXPECT_EQ(CreateNodePool(PoolOptions(), 4, node_, backend_).status().code(),
            StatusCode::kAlreadyExists);
  KillChild(child);
  waitpid(child, nullptr, 0);
  auto pool = MustCreate();  // the stale segment is replaced
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->free_pages(), 32);
  EXPECT_EQ(pool->live_processes(), 1);
}

}  // namespace
}  // namespace sparsekv
