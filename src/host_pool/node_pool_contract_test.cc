// Sentences of node_pool.h held to the code, on the CPU and the CUDA backend (the latter skips
// without a GPU): each test is named after what the header promises. A descriptor comes from the
// control plane and a segment from a file any process of the machine may have altered: every byte
// of a serialized descriptor and of a segment's header is altered in turn, and each open must be
// refused with a clean error or, where the change is harmless, attach to the very pool described.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"
#include "testing/cuda_test_util.h"

namespace sparsekv {
namespace {

std::string UniqueName() {
  static int counter = 0;
  return "sparsekv-contract-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

CacheOptions PoolOptions() {
  CacheOptions o;
  o.geometry.layers = {{24, 32}, {8, 8}};
  o.top_k = 4;
  o.hot_slots = 8;
  o.max_requests = 2;
  o.max_context = 64;
  o.host_page_tokens = 8;
  o.host_capacity_tokens = 256;
  return o;
}

class NodePoolContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
    node_.name = UniqueName();
    path_ = node_.directory + "/" + node_.name;
  }
  void TearDown() override {
    std::error_code ignored;
    for (const std::string& p : {path_, path_ + "-copy"}) std::filesystem::remove(p, ignored);
  }
  std::shared_ptr<HostKVPool> MustCreate(int32_t max_owners = 4) {
    auto pool = CreateNodePool(PoolOptions(), max_owners, node_, backend_);
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    return pool.ok() ? *pool : nullptr;
  }

  std::shared_ptr<Backend> backend_;
  NodePoolOptions node_;
  std::string path_;
};

const std::set<StatusCode> kRefusals = {StatusCode::kInvalidArgument, StatusCode::kNotFound,
                                        StatusCode::kUnavailable, StatusCode::kFailedPrecondition};

// OpenDescribedNodePool: "refused before this process attaches unless the segment at its path is
// the one described" -- every byte of the descriptor flipped, and the descriptor cut at every
// length.
TEST_P(NodePoolContractTest, OpenOfAMutatedDescriptorIsRefusedOrTheSamePool) {
  if (backend_ == nullptr) return;
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const std::string text = DescribeNodePool(*pool).Serialize();
  int same = 0;
  const auto check = [&](const std::string& mutated, const std::string& what) {
    SCOPED_TRACE(what + ": \"" + mutated + "\"");
    auto opened = OpenDescribedNodePool(mutated, node_, backend_);
    if (!opened.ok()) {
      EXPECT_EQ(kRefusals.count(opened.status().code()), 1u) << opened.status().ToString();
      EXPECT_EQ(pool->live_processes(), 1);  // refused before it attached
      return;
    }
    ++same;
    EXPECT_EQ((*opened)->node_pool_id(), pool->node_pool_id());
    EXPECT_EQ(pool->live_processes(), 2);
  };
  for (size_t i = 0; i < text.size(); ++i) {
    check(text.substr(0, i), "cut at " + std::to_string(i));
    for (unsigned mask : {0x01u, 0x08u, 0x80u}) {
      std::string mutated = text;
      mutated[i] = static_cast<char>(static_cast<unsigned char>(mutated[i]) ^ mask);
      check(mutated, "byte " + std::to_string(i) + " ^ " + std::to_string(mask));
    }
  }
  check(text, "unchanged");
  EXPECT_EQ(same, 1);
}

// OpenNodePool: "The segment's header is checked ... before anything it describes is read ...
// FailedPrecondition if it is not a node pool (... a header that fails its checks)" -- every
// byte of the header and the layer shapes flipped in a copy of the segment, and the copy cut.
TEST_P(NodePoolContractTest, OpenOfASegmentWithAMutatedHeaderIsRefusedOrTheSameShape) {
  if (backend_ == nullptr) return;
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const std::string copy = path_ + "-copy";
  const auto make_copy = [&] {
    std::filesystem::copy_file(path_, copy, std::filesystem::copy_options::overwrite_existing);
  };
  make_copy();
  const size_t header_bytes = 256 + 8 * PoolOptions().geometry.layers.size();
  const auto poke = [&](size_t at, unsigned char byte) {
    if (!std::filesystem::exists(copy)) make_copy();  // the last detach removed it
    const int fd = open(copy.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(at)), 1);
    close(fd);
  };
  const auto original = [&](size_t at) {
    unsigned char byte = 0;
    const int fd = open(path_.c_str(), O_RDONLY);
    EXPECT_EQ(pread(fd, &byte, 1, static_cast<off_t>(at)), 1);
    close(fd);
    return byte;
  };
  int harmless = 0;
  for (size_t at = 0; at < header_bytes; ++at) {
    for (unsigned mask : {0x01u, 0x40u, 0x80u}) {
      SCOPED_TRACE("byte " + std::to_string(at) + " ^ " + std::to_string(mask));
      poke(at, static_cast<unsigned char>(original(at) ^ mask));
      {  // the opened pool (if any) detaches at the end of this block, before the byte is restored
        auto opened = OpenNodePool(copy, node_, backend_);
        if (opened.ok()) {
          ++harmless;  // padding: the same shape
          EXPECT_EQ((*opened)->geometry().num_layers(), 2);
          EXPECT_EQ((*opened)->rows(), pool->rows());
          EXPECT_EQ((*opened)->page_tokens(), pool->page_tokens());
          EXPECT_EQ((*opened)->max_owners(), pool->max_owners());
        } else {
          EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition)
              << opened.status().ToString();
        }
      }
      poke(at, original(at));
    }
  }
  EXPECT_GT(harmless, 0);
  const size_t file_bytes = std::filesystem::file_size(path_);
  for (size_t length :
       {size_t{0}, size_t{100}, size_t{4095}, size_t{4096}, file_bytes / 2, file_bytes - 1}) {
    make_copy();
    std::filesystem::resize_file(copy, length);
    const Status s = OpenNodePool(copy, node_, backend_).status();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << length << ": " << s.ToString();
  }
}

// OpenDescribedNodePool: "NotFound if ... the segment there has another id (the pool was created
// again since)"; "InvalidArgument for a descriptor that does not parse or has id 0".
TEST_P(NodePoolContractTest, OpenOfAStaleDescriptorIsNotFound) {
  if (backend_ == nullptr) return;
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const std::string stale = DescribeNodePool(*pool).Serialize();
  pool.reset();  // the last process: the file is removed
  EXPECT_EQ(OpenDescribedNodePool(stale, node_, backend_).status().code(), StatusCode::kNotFound);
  pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  const Status s = OpenDescribedNodePool(stale, node_, backend_).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("created again"), std::string::npos) << s.ToString();
  EXPECT_EQ(pool->live_processes(), 1);
  NodePoolDescriptor zero = DescribeNodePool(*pool);
  zero.id = 0;
  EXPECT_EQ(OpenDescribedNodePool(zero.Serialize(), node_, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDescribedNodePool("not a descriptor", node_, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(OpenDescribedNodePool(DescribeNodePool(*pool).Serialize(), node_, backend_).ok());
}

// OpenNodePool: "NotFound if there is none; Unavailable if the path cannot be opened;
// FailedPrecondition if it is not a node pool (not a regular file, too small ...);
// ResourceExhausted if max_processes live processes are attached".
TEST_P(NodePoolContractTest, OpenErrors) {
  if (backend_ == nullptr) return;
  EXPECT_EQ(OpenNodePool(path_, node_, backend_).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(OpenNodePool(node_.directory, node_, backend_).status().code(),
            StatusCode::kUnavailable);
  const std::string fifo = path_ + "-copy";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(OpenNodePool(fifo, node_, backend_).status().code(), StatusCode::kFailedPrecondition);
  std::filesystem::remove(fifo);
  node_.max_processes = 1;
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(OpenNodePool(path_, node_, backend_).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(OpenNodePool(path_, node_, nullptr).status().code(), StatusCode::kInvalidArgument);
}

// CreateNodePool: "AlreadyExists if a live node pool has that name; ... InvalidArgument for
// invalid options, a bad name or max_processes, or max_owners < 1".
TEST_P(NodePoolContractTest, CreateErrors) {
  if (backend_ == nullptr) return;
  CacheOptions invalid = PoolOptions();
  invalid.host_page_tokens = 0;
  EXPECT_EQ(CreateNodePool(invalid, 4, node_, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNodePool(PoolOptions(), 0, node_, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNodePool(PoolOptions(), 4, node_, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  NodePoolOptions bad = node_;
  for (int32_t processes : {0, 4097}) {
    bad.max_processes = processes;
    EXPECT_EQ(CreateNodePool(PoolOptions(), 4, bad, backend_).status().code(),
              StatusCode::kInvalidArgument)
        << processes;
  }
  bad = node_;
  for (const std::string& name : {std::string(""), std::string(".x"), std::string("a/b"),
                                  std::string(201, 'a'), std::string("a b")}) {
    bad.name = name;
    EXPECT_EQ(CreateNodePool(PoolOptions(), 4, bad, backend_).status().code(),
              StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_FALSE(std::filesystem::exists(path_));  // nothing was created on error
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(CreateNodePool(PoolOptions(), 4, node_, backend_).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(pool->live_processes(), 1);
}

// WritePromptLayer: "InvalidArgument for a bad layer, an owner out of range, null rows or
// tokens < 1; OutOfRange if tokens exceeds the owner's reserved tokens; FailedPrecondition in a
// node pool for an owner this process does not hold".
TEST_P(NodePoolContractTest, WritePromptLayerErrors) {
  if (backend_ == nullptr) return;
  auto pool = MustCreate();
  ASSERT_NE(pool, nullptr);
  auto other = OpenNodePool(path_, node_, backend_).value();  // another "process"
  const int32_t owner = pool->AcquireOwner().value();
  ASSERT_TRUE(pool->Reserve(owner, 16).ok());
  std::vector<std::byte> rows(64 * 32, std::byte{0x5A});
  EXPECT_EQ(WritePromptLayer(*pool, *backend_, owner, 2, rows.data(), 16, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WritePromptLayer(*pool, *backend_, owner, -1, rows.data(), 16, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WritePromptLayer(*pool, *backend_, owner, 0, nullptr, 16, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WritePromptLayer(*pool, *backend_, owner, 0, rows.data(), 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  for (int32_t bad_owner : {-1, pool->max_owners()}) {
    EXPECT_EQ(WritePromptLayer(*pool, *backend_, bad_owner, 0, rows.data(), 8, nullptr).code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(WritePromptLayer(*pool, *backend_, owner, 0, rows.data(), 17, nullptr).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(WritePromptLayer(*other, *backend_, owner, 0, rows.data(), 8, nullptr).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(WritePromptLayer(*pool, *backend_, owner, 0, rows.data(), 16, nullptr).ok());
}

// AdmitFromNodePool: "NotFound if the seal has ended (released ...): recompute the request".
TEST_P(NodePoolContractTest, AdmitFromAnEndedSealIsNotFound) {
  if (backend_ == nullptr) return;
  auto writer = MustCreate();
  ASSERT_NE(writer, nullptr);
  auto reader = OpenNodePool(path_, node_, backend_).value();
  CacheOptions o = PoolOptions();
  UseNodePoolShape(*reader, o);
  auto manager = SparseKVCacheManager::Create(o, backend_, reader).value();
  const int32_t owner = writer->AcquireOwner().value();
  ASSERT_TRUE(writer->Reserve(owner, 16).ok());
  std::vector<std::byte> rows(16 * 32, std::byte{0x21});
  for (int32_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(WritePromptLayer(*writer, *backend_, owner, l, rows.data(), 16, nullptr).ok());
  }
  ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
  const uint64_t seal = writer->Seal(owner, 16).value();
  EXPECT_EQ(AdmitFromNodePool(*manager, 1, {owner, seal + 1}, 8, nullptr).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(manager->SequenceLength(1).status().code(), StatusCode::kNotFound);
  writer->Release(owner);
  writer->ReleaseOwner(owner);
  EXPECT_EQ(AdmitFromNodePool(*manager, 1, {owner, seal}, 8, nullptr).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(manager->SequenceLength(1).status().code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Backends, NodePoolContractTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace sparsekv
