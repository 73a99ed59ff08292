// Sentences of peer_tier.h held to the code, on the CPU and the CUDA backend (the latter skips
// without a GPU): each test is named after what the header promises. Descriptors come from
// elsewhere and may be stale, truncated or forged: every byte of a serialized descriptor is
// altered in turn, and each import must be refused with a clean error or, where the change is
// harmless, import the very region it names.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "sparsekv/peer_tier.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kLayers = 2;
constexpr int32_t kRowBytes = 48;
constexpr int32_t kPageTokens = 8;
constexpr int32_t kRegionRows = 64;
constexpr int32_t kPrompt = 24;

CacheOptions Small() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kRowBytes);
  o.top_k = 8;
  o.hot_slots = 16;
  o.window = 1;
  o.host_capacity_tokens = 512;
  o.max_requests = 4;
  o.max_context = 128;
  o.host_page_tokens = kPageTokens;
  return o;
}

class PeerTierContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
    if (backend_ == nullptr) return;
    manager_ = SparseKVCacheManager::Create(Small(), backend_).value();
    ASSERT_TRUE(AttachPeerTier(*manager_).ok());
    region_ = PeerRegion::Create(Small().geometry, kRegionRows, backend_).value();
    std::mt19937_64 rng(11);
    for (int32_t l = 0; l < kLayers; ++l) {
      prompt_.push_back(testing::RandomRows(rng, kPrompt, kRowBytes));
      ASSERT_TRUE(region_->WriteRows(l, 0, prompt_[l].data(), kPrompt, nullptr).ok());
    }
    ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
  }
  void TearDown() override {
    manager_.reset();  // before the region it may still map
    region_.reset();
  }

  StatusOr<int32_t> Import(std::string_view text) {
    return ImportPeerRegion(*manager_, text, nullptr);
  }
  // Admits `id` from `region` and checks that the host pool holds the lent rows, byte for byte.
  void ExpectAdmitsTheLentRows(RequestId id, int32_t region) {
    const Status s = AdmitFromPeer(*manager_, id, region, 0, kPrompt, 8, nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
    const std::vector<int32_t> pages = manager_->HostPages(id).value();
    const HostKVPool& pool = manager_->host_pool();
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t p = 0; p < kPrompt; ++p) {
        const std::byte* row = pool.row(l, pages[p / kPageTokens] * kPageTokens + p % kPageTokens);
        ASSERT_EQ(std::memcmp(row, prompt_[l].data() + int64_t{p} * kRowBytes, kRowBytes), 0)
            << "layer " << l << " position " << p;
      }
    }
    ASSERT_TRUE(manager_->Release(id).ok());
  }

  std::shared_ptr<Backend> backend_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<PeerRegion> region_;
  std::vector<Bytes> prompt_;
};

// "NotFound if ... the region no longer exists": the descriptor of a region destroyed in this
// process names freed memory, which is never read (under CUDA the runtime took the freed address
// for host memory and the read crashed the process).
TEST_P(PeerTierContractTest, ImportOfADestroyedRegionsDescriptorIsNotFound) {
  if (backend_ == nullptr) return;
  const std::string stale = region_->descriptor().Serialize();
  region_.reset();
  const StatusOr<int32_t> imported = Import(stale);
  EXPECT_EQ(imported.status().code(), StatusCode::kNotFound) << imported.status().ToString();
  // Nor is a region created since, even where it reuses the memory.
  region_ = PeerRegion::Create(Small().geometry, kRegionRows, backend_).value();
  EXPECT_EQ(Import(stale).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Import(region_->descriptor().Serialize()).value(), 0);
}

// Every byte of a descriptor flipped (three ways) and the descriptor cut at every length: a
// clean refusal, or an import of the region it names that reads its rows.
TEST_P(PeerTierContractTest, ImportOfAMutatedDescriptorIsRefusedOrHarmless) {
  if (backend_ == nullptr) return;
  const std::string text = region_->descriptor().Serialize();
  const std::set<StatusCode> refusals = {StatusCode::kInvalidArgument, StatusCode::kNotFound,
                                         StatusCode::kUnavailable};
  RequestId id = 1;
  int harmless = 0;
  const auto check = [&](const std::string& mutated, const std::string& what) {
    SCOPED_TRACE(what + ": \"" + mutated + "\"");
    const StatusOr<int32_t> imported = Import(mutated);
    if (!imported.ok()) {
      EXPECT_TRUE(refusals.count(imported.status().code()) == 1) << imported.status().ToString();
      EXPECT_FALSE(imported.status().message().empty());
      EXPECT_EQ(PeerRegionStatus(*manager_, 0).code(), StatusCode::kNotFound);
      return;
    }
    ++harmless;
    ASSERT_EQ(*imported, 0);
    ExpectAdmitsTheLentRows(id++, *imported);
    ASSERT_TRUE(DetachPeerRegion(*manager_, *imported, nullptr).ok());
  };
  for (size_t i = 0; i < text.size(); ++i) {
    check(text.substr(0, i), "cut at " + std::to_string(i));
    for (unsigned mask : {0x01u, 0x08u, 0x80u}) {
      std::string mutated = text;
      mutated[i] = static_cast<char>(static_cast<unsigned char>(mutated[i]) ^ mask);
      check(mutated, "byte " + std::to_string(i) + " ^ " + std::to_string(mask));
    }
  }
  // The original still imports (nothing changed on the refusals).
  check(text, "unchanged");
  EXPECT_GE(harmless, 1);
}

// "InvalidArgument for a descriptor ... whose rows and strides are not its region's": a forged
// row count (larger or smaller, either of which would misplace every layer past the first) is
// refused before a row is read.
TEST_P(PeerTierContractTest, ImportRefusesADescriptorWhoseShapeIsNotTheRegions) {
  if (backend_ == nullptr) return;
  for (int32_t rows : {kRegionRows - 1, kRegionRows + 1, kRegionRows * 1000, 1 << 30}) {
    PeerRegionDescriptor d = region_->descriptor();
    d.rows = rows;
    const StatusOr<int32_t> imported = Import(d.Serialize());
    EXPECT_EQ(imported.status().code(), StatusCode::kInvalidArgument)
        << rows << ": " << imported.status().ToString();
  }
  PeerRegionDescriptor d = region_->descriptor();
  d.row_strides[0] += 1;  // not the manager's
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kInvalidArgument);
  d = region_->descriptor();
  d.row_strides.push_back(kRowBytes);  // a layer more than the manager's
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kInvalidArgument);
}

// "NotFound if the lender is gone": a pid that is no process, or another process (another start
// time).
TEST_P(PeerTierContractTest, ImportOfAGoneLendersDescriptorIsNotFound) {
  if (backend_ == nullptr) return;
  PeerRegionDescriptor d = region_->descriptor();
  d.start_time += 7;
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kNotFound);
  d = region_->descriptor();
  d.pid = 0x7ffffff0;  // above any pid_max
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kNotFound);
}

// "the backend's error if it cannot map it": a handle of another backend kind.
TEST_P(PeerTierContractTest, ImportOfAnotherBackendsHandleIsTheBackendsError) {
  if (backend_ == nullptr) return;
  PeerRegionDescriptor d = region_->descriptor();
  d.handle = GetParam() == "cuda" ? "cpu 1 2" : "cuda 1 0 2 00";
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kInvalidArgument);
}

// "ResourceExhausted if max_regions regions are imported"; "FailedPrecondition without the peer
// tier".
TEST_P(PeerTierContractTest, ImportIsExhaustedAtMaxRegionsAndRefusedWithoutTheTier) {
  if (backend_ == nullptr) return;
  const std::string text = region_->descriptor().Serialize();
  ASSERT_EQ(Import(text).value(), 0);
  EXPECT_EQ(Import(text).status().code(), StatusCode::kResourceExhausted);
  auto plain = SparseKVCacheManager::Create(Small(), backend_).value();
  EXPECT_EQ(ImportPeerRegion(*plain, text, nullptr).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(DetachPeerRegion(*plain, 0, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(PeerRegionStatus(*plain, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(MapPeerRows(*plain, 1, 0, 0, 8, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(PeerRowsRead(*plain, nullptr).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(AdmitFromPeer(*plain, 1, 0, 0, 8, 8, nullptr).code(), StatusCode::kFailedPrecondition);
}

// AttachPeerTier: "FailedPrecondition if it has a peer tier already; InvalidArgument for
// max_regions out of range".
TEST_P(PeerTierContractTest, AttachRefusesASecondTierAndMaxRegionsOutOfRange) {
  if (backend_ == nullptr) return;
  EXPECT_EQ(AttachPeerTier(*manager_).code(), StatusCode::kFailedPrecondition);
  auto plain = SparseKVCacheManager::Create(Small(), backend_).value();
  for (int32_t max_regions : {0, -1, kMaxRoutePlaces}) {
    PeerTierOptions o;
    o.max_regions = max_regions;
    EXPECT_EQ(AttachPeerTier(*plain, o).code(), StatusCode::kInvalidArgument) << max_regions;
  }
  PeerTierOptions most;
  most.max_regions = kMaxRoutePlaces - 1;
  EXPECT_TRUE(AttachPeerTier(*plain, most).ok());
}

// DetachPeerRegion: "NotFound for an index that is not imported"; PeerRegionStatus: "OK while
// region is imported ...; NotFound for an index never imported or detached".
TEST_P(PeerTierContractTest, DetachAndStatusOfAnIndexNotImportedAreNotFound) {
  if (backend_ == nullptr) return;
  for (int32_t region : {-1, 0, 1, 1000}) {
    EXPECT_EQ(DetachPeerRegion(*manager_, region, nullptr).code(), StatusCode::kNotFound);
    EXPECT_EQ(PeerRegionStatus(*manager_, region).code(), StatusCode::kNotFound);
  }
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  EXPECT_TRUE(PeerRegionStatus(*manager_, region).ok());
  ASSERT_TRUE(DetachPeerRegion(*manager_, region, nullptr).ok());
  EXPECT_EQ(PeerRegionStatus(*manager_, region).code(), StatusCode::kNotFound);
  EXPECT_EQ(DetachPeerRegion(*manager_, region, nullptr).code(), StatusCode::kNotFound);
}

// MapPeerRows: "NotFound for an unknown request or region; InvalidArgument for tokens < 1 or
// beyond the request's length; OutOfRange if the rows do not fit in the region".
TEST_P(PeerTierContractTest, MapPeerRowsErrors) {
  if (backend_ == nullptr) return;
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  EXPECT_EQ(MapPeerRows(*manager_, 1, region, 0, 8, nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(manager_->Admit(1, kPrompt, 8, nullptr).ok());
  EXPECT_EQ(MapPeerRows(*manager_, 1, region + 1, 0, 8, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(MapPeerRows(*manager_, 1, -1, 0, 8, nullptr).code(), StatusCode::kNotFound);
  for (int32_t tokens : {0, -3, kPrompt + 1}) {
    EXPECT_EQ(MapPeerRows(*manager_, 1, region, 0, tokens, nullptr).code(),
              StatusCode::kInvalidArgument)
        << tokens;
  }
  EXPECT_EQ(MapPeerRows(*manager_, 1, region, kRegionRows - 8, 16, nullptr).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(MapPeerRows(*manager_, 1, region, -1, 8, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(MapPeerRows(*manager_, 1, region, 0, kPrompt, nullptr).ok());
}

// AdmitFromPeer: "Errors: those of Admit, IngestPrompt and MapPeerRows; on any, nothing is left
// admitted".
TEST_P(PeerTierContractTest, AdmitFromPeerLeavesNothingAdmittedOnError) {
  if (backend_ == nullptr) return;
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  const int32_t free_pages = manager_->host_pool().free_pages();
  struct Case {
    RequestId id;
    int32_t region, first_row, prompt_len, max_new;
    StatusCode code;
  };
  ASSERT_TRUE(manager_->Admit(9, 8, 8, nullptr).ok());
  const int32_t free_after_nine = manager_->host_pool().free_pages();
  EXPECT_LT(free_after_nine, free_pages);
  for (const Case& c :
       {Case{1, region + 1, 0, kPrompt, 8, StatusCode::kNotFound},
        Case{1, region, kRegionRows - 8, 16, 8, StatusCode::kOutOfRange},
        Case{1, region, 0, 0, 8, StatusCode::kInvalidArgument},
        Case{9, region, 0, kPrompt, 8, StatusCode::kAlreadyExists},     // Admit's
        Case{1, region, 0, kPrompt, 1000, StatusCode::kOutOfRange}}) {  // past max_context
    SCOPED_TRACE("request " + std::to_string(c.id) + " rows " + std::to_string(c.first_row) + "+" +
                 std::to_string(c.prompt_len));
    EXPECT_EQ(
        AdmitFromPeer(*manager_, c.id, c.region, c.first_row, c.prompt_len, c.max_new, nullptr)
            .code(),
        c.code);
    EXPECT_EQ(manager_->SequenceLength(1).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(manager_->host_pool().free_pages(), free_after_nine);
  }
  EXPECT_EQ(manager_->SequenceLength(9).value(), 8);
  ExpectAdmitsTheLentRows(1, region);
}

// PeerRegion::Create: "InvalidArgument for an invalid geometry or rows < 1"; WriteRows:
// "InvalidArgument for a bad layer, null rows or tokens < 1; OutOfRange if the rows do not fit".
TEST_P(PeerTierContractTest, RegionCreateAndWriteRowsErrors) {
  if (backend_ == nullptr) return;
  EXPECT_EQ(PeerRegion::Create(KVGeometry{}, 8, backend_).status().code(),
            StatusCode::kInvalidArgument);
  KVGeometry bad = Small().geometry;
  bad.layers[1].row_stride = bad.layers[1].row_bytes - 1;
  EXPECT_EQ(PeerRegion::Create(bad, 8, backend_).status().code(), StatusCode::kInvalidArgument);
  for (int32_t rows : {0, -1}) {
    EXPECT_EQ(PeerRegion::Create(Small().geometry, rows, backend_).status().code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(PeerRegion::Create(Small().geometry, 8, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  const Bytes rows(static_cast<size_t>(kRegionRows + 1) * kRowBytes, std::byte{0x5A});
  for (int32_t layer : {-1, kLayers}) {
    EXPECT_EQ(region_->WriteRows(layer, 0, rows.data(), 1, nullptr).code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(region_->WriteRows(0, 0, nullptr, 1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(region_->WriteRows(0, 0, rows.data(), 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(region_->WriteRows(0, kRegionRows - 1, rows.data(), 2, nullptr).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(region_->WriteRows(0, -1, rows.data(), 1, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(region_->WriteRows(0, 0, rows.data(), kRegionRows + 1, nullptr).code(),
            StatusCode::kOutOfRange);
  // Nothing was written: the lent rows are intact.
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  ExpectAdmitsTheLentRows(1, region);
}

INSTANTIATE_TEST_SUITE_P(Backends, PeerTierContractTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace sparsekv
