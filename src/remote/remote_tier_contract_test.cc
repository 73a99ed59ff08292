// Sentences of remote_tier.h held to the code, over UCX (tcp loopback) on the CPU and the CUDA
// backend (the latter skips without a GPU): each test is named after what the header promises.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "sparsekv/remote_tier.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"
#include "testing/ucx_servers.h"

namespace sparsekv {
namespace {

using testing::ThreadServer;

constexpr int32_t kLayers = 2;
constexpr int32_t kRowBytes = 32;

CacheOptions Small() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kRowBytes);
  o.top_k = 4;
  o.hot_slots = 8;
  o.window = 2;
  o.host_capacity_tokens = 512;
  o.max_requests = 4;
  o.max_context = 128;
  o.host_page_tokens = 8;
  return o;
}

class RemoteTierContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!testing::HaveUcx()) GTEST_SKIP() << "built without UCX";
    backend_ = GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
    if (backend_ == nullptr) return;
    transport_ = CreateUcxTransport(testing::LoopbackOptions("tcp")).value();
    tier_ = RemoteTier::Create(transport_.get()).value();
    manager_ = SparseKVCacheManager::Create(Small(), backend_).value();
    ASSERT_TRUE(AttachRemoteTier(*manager_, tier_.get()).ok());
    server_ = std::make_unique<ThreadServer>("tcp", 1 << 16);
    region_ = tier_->ImportRegion("pool-a", server_->descriptor()).value();
  }
  void TearDown() override {
    manager_.reset();
    tier_.reset();
  }
  bool Skipped() const { return backend_ == nullptr; }
  int32_t PagesUsed() { return manager_->ReadStats(nullptr).value().host_pages_used; }

  std::shared_ptr<Backend> backend_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<RemoteTier> tier_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<ThreadServer> server_;
  uint32_t region_ = 0;
};

// RemoteTier::Create with no transport; ImportRegion: "Importing the same descriptor again
// returns the same id; a new descriptor of the same node ... is a new region. Errors as
// Transport::ImportRegion" (InvalidArgument for a malformed descriptor).
TEST_P(RemoteTierContractTest, ImportRegionIsIdempotentPerDescriptor) {
  if (Skipped()) return;
  EXPECT_EQ(RemoteTier::Create(nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier_->ImportRegion("pool-a", server_->descriptor()).value(), region_);
  ThreadServer restarted("tcp", 1 << 16);
  const uint32_t other = tier_->ImportRegion("pool-a", restarted.descriptor()).value();
  EXPECT_NE(other, region_);
  EXPECT_EQ(tier_->ImportRegion("pool-a", "not a descriptor").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tier_->ImportRegion("pool-a", "").status().code(), StatusCode::kInvalidArgument);
}

// ReleaseRegion: "FailedPrecondition while a request is bound to it; NotFound if unknown".
TEST_P(RemoteTierContractTest, ReleaseRegionRefusesABoundRegionAndAnUnknownOne) {
  if (Skipped()) return;
  EXPECT_EQ(tier_->ReleaseRegion(region_ + 100).code(), StatusCode::kNotFound);
  const RemotePromptLayout layout = RemotePromptLayout::Dense(kLayers, 20, kRowBytes);
  ASSERT_TRUE(AdmitRemote(*manager_, 1, region_, layout, 8, nullptr).ok());
  EXPECT_EQ(tier_->ReleaseRegion(region_).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(manager_->Release(1).ok());
  EXPECT_TRUE(tier_->ReleaseRegion(region_).ok());
  EXPECT_EQ(tier_->ReleaseRegion(region_).code(), StatusCode::kNotFound);
}

// WritePromptLayer: "OutOfRange if the layout does not fit".
TEST_P(RemoteTierContractTest, WritePromptLayerRefusesALayoutThatDoesNotFit) {
  if (Skipped()) return;
  const RemotePromptLayout huge = RemotePromptLayout::Dense(kLayers, 4096, kRowBytes);
  std::vector<std::byte> rows(static_cast<size_t>(4096) * kRowBytes, std::byte{0x3C});
  const std::vector<std::byte> before = server_->memory();
  EXPECT_EQ(tier_->WritePromptLayer(region_, huge, 1, rows.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(server_->memory(), before);  // nothing was written
}

// Locate: "NotFound if the request is not bound"; node 0 for a position past the prompt.
// NodeName: "node 0: ''; NotFound if unknown".
TEST_P(RemoteTierContractTest, LocateAndNodeName) {
  if (Skipped()) return;
  EXPECT_EQ(tier_->Locate(1, 0, 0, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier_->NodeName(0).value(), "");
  EXPECT_EQ(tier_->NodeName(1).value(), "pool-a");
  EXPECT_EQ(tier_->NodeName(7).status().code(), StatusCode::kNotFound);
  const RemotePromptLayout layout = RemotePromptLayout::Dense(kLayers, 20, kRowBytes);
  ASSERT_TRUE(AdmitRemote(*manager_, 1, region_, layout, 8, nullptr).ok());
  const GlobalRowAddress prompt = tier_->Locate(1, 1, 3, 99).value();
  EXPECT_EQ(prompt.node, 1u);
  EXPECT_EQ(prompt.region, region_);
  EXPECT_EQ(prompt.offset, layout.RowOffset(1, 3));
  const GlobalRowAddress generated = tier_->Locate(1, 1, 20, 99).value();
  EXPECT_EQ(generated.node, GlobalRowAddress::kLocalNode);
  EXPECT_EQ(generated.region, 1u);  // the layer
}

// AttachRemoteTier: "FailedPrecondition if the manager has a remote tier already".
TEST_P(RemoteTierContractTest, AttachRefusesASecondTier) {
  if (Skipped()) return;
  EXPECT_EQ(AttachRemoteTier(*manager_, tier_.get()).code(), StatusCode::kFailedPrecondition);
}

// AdmitRemote: "Errors as SparseKVCacheManager::Admit, plus FailedPrecondition (no tier),
// InvalidArgument / OutOfRange for a layout that does not match the geometry or the region ...
// (nothing is admitted then)".
TEST_P(RemoteTierContractTest, AdmitRemoteLeavesNothingAdmittedOnError) {
  if (Skipped()) return;
  const int32_t used = PagesUsed();
  const RemotePromptLayout good = RemotePromptLayout::Dense(kLayers, 20, kRowBytes);
  RemotePromptLayout layers = good;
  layers.layers = kLayers + 1;
  RemotePromptLayout row_bytes = good;
  row_bytes.row_bytes = kRowBytes - 1;
  RemotePromptLayout past_region = good;
  past_region.base_offset = (1 << 16) - 10;
  const RemotePromptLayout past_context = RemotePromptLayout::Dense(kLayers, 200, kRowBytes);
  struct Case {
    RequestId id;
    uint32_t region;
    RemotePromptLayout layout;
    int32_t max_new;
    StatusCode code;
  };
  ASSERT_TRUE(manager_->Admit(9, 8, 8, nullptr).ok());
  const int32_t used_by_nine = PagesUsed();
  EXPECT_GT(used_by_nine, used);
  for (const Case& c : {Case{1, region_, layers, 8, StatusCode::kInvalidArgument},
                        Case{1, region_, row_bytes, 8, StatusCode::kInvalidArgument},
                        Case{1, region_, past_region, 8, StatusCode::kOutOfRange},
                        Case{1, region_, past_context, 8, StatusCode::kOutOfRange},
                        Case{1, region_, good, 1000, StatusCode::kOutOfRange},  // Admit's
                        Case{1, region_ + 100, good, 8, StatusCode::kNotFound},
                        Case{9, region_, good, 8, StatusCode::kAlreadyExists}}) {
    SCOPED_TRACE("request " + std::to_string(c.id) + " tokens " + std::to_string(c.layout.tokens));
    EXPECT_EQ(AdmitRemote(*manager_, c.id, c.region, c.layout, c.max_new, nullptr).code(), c.code);
    EXPECT_EQ(manager_->SequenceLength(1).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(RemoteStatus(*manager_, 1).code(), StatusCode::kNotFound);
    EXPECT_EQ(PagesUsed(), used_by_nine);
  }
  auto plain = SparseKVCacheManager::Create(Small(), backend_).value();
  EXPECT_EQ(AdmitRemote(*plain, 1, region_, good, 8, nullptr).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(plain->SequenceLength(1).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(AdmitRemote(*manager_, 1, region_, good, 8, nullptr).ok());
  EXPECT_EQ(manager_->SequenceLength(1).value(), 20);
}

// RemoteStatus: "NotFound if id is not a live remote-backed request"; "Fork refuses a
// remote-backed parent".
TEST_P(RemoteTierContractTest, RemoteStatusOfALocalRequestIsNotFoundAndForkIsRefused) {
  if (Skipped()) return;
  ASSERT_TRUE(manager_->Admit(2, 8, 8, nullptr).ok());
  EXPECT_EQ(RemoteStatus(*manager_, 2).code(), StatusCode::kNotFound);
  EXPECT_EQ(RemoteStatus(*manager_, 3).code(), StatusCode::kNotFound);
  const RemotePromptLayout layout = RemotePromptLayout::Dense(kLayers, 20, kRowBytes);
  ASSERT_TRUE(AdmitRemote(*manager_, 1, region_, layout, 8, nullptr).ok());
  EXPECT_TRUE(RemoteStatus(*manager_, 1).ok());
  EXPECT_EQ(manager_->Fork(1, 4, 8, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->SequenceLength(4).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(manager_->Release(1).ok());
  EXPECT_EQ(RemoteStatus(*manager_, 1).code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Backends, RemoteTierContractTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace sparsekv
