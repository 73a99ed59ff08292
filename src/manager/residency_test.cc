// Residency on its own, over a CPU backend's pool and hot cache: placement (resident pages or a
// block), demotion to make room, promotion with its refusals, and the rows the loads bring.
#include "manager/residency.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "manager/pool_copy.h"

namespace sparsekv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kStride = 8;

// Row of position p in layer l: kStride bytes equal to l * 50 + p + 1.
std::byte RowByte(int32_t layer, int32_t position) {
  return static_cast<std::byte>(layer * 50 + position + 1);
}

// Two layers of 8-byte rows. A block is C = 7 plus W = 1 rows: one page of R = 8 rows; the hot
// cache has 6 pages and room for 3 requests on the device. Host pages of 8 tokens, 4 owners of
// up to 32 tokens.
class ResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.geometry = KVGeometry::Uniform(kLayers, kStride);
    options_.top_k = 2;
    options_.hot_slots = 7;
    options_.window = 1;
    options_.hybrid_residency = true;
    options_.resident_page_rows = 8;
    options_.max_requests = 3;
    options_.max_context = 32;
    options_.host_page_tokens = 8;
    options_.host_capacity_tokens = 256;
    auto pool = HostKVPool::Create(options_.geometry, 256, 8, 4, 32, backend_.get());
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
    auto hot = HotCache::Create(options_.geometry, 7, 1, 3, 6, 8, backend_.get());
    ASSERT_TRUE(hot.ok()) << hot.status().ToString();
    hot_ = std::move(*hot);
    ASSERT_TRUE(
        tables_.Allocate({.max_owners = 4, .pages_per_owner = 4, .resident_pages_per_owner = 4})
            .ok());
    auto invalid = memory_.Allocate<unsigned long long>(1);
    ASSERT_TRUE(invalid.ok());
    residency_ = std::make_unique<Residency>(options_, *backend_, requests_, counters_);
    ASSERT_TRUE(residency_->Allocate(*pool_, *hot_, tables_, *invalid).ok());
    ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
  }

  // A live request `id` not yet on the device: `reserved` tokens in the pool, positions
  // [0, seq_len) with KV in every layer (RowByte).
  RequestState& Add(RequestId id, int32_t reserved, int32_t seq_len) {
    StatusOr<int32_t> owner = pool_->AcquireOwner();
    EXPECT_TRUE(owner.ok());
    EXPECT_TRUE(pool_->Reserve(*owner, reserved).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t p = 0; p < seq_len; ++p) {
        std::memset(pool_->row(l, pool_->HostRow(*owner, p)), static_cast<int>(RowByte(l, p)),
                    kStride);
      }
    }
    RequestState r{.owner = *owner,
                   .block = -1,
                   .seq_len = seq_len,
                   .reserved = reserved,
                   .ingested = std::vector<bool>(kLayers, true),
                   .ingested_layers = kLayers};
    return requests_.emplace(id, std::move(r)).first->second;
  }
  // The first byte of hot-cache row `slot` of `layer`.
  std::byte HotByte(int32_t layer, int32_t slot) {
    EXPECT_TRUE(backend_->Synchronize(nullptr).ok());
    return hot_->layer_data(layer)[static_cast<int64_t>(slot) * kStride];
  }
  Status Place(RequestState& r, std::span<const RequestId> open_batch = {}) {
    return residency_->PlaceOnDevice(r, 0, open_batch, nullptr);
  }

  CacheOptions options_;
  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  std::unique_ptr<HostKVPool> pool_;
  std::unique_ptr<HotCache> hot_;
  DeviceTables tables_{*backend_};
  DeviceMemory memory_{*backend_};
  Residency::Requests requests_;
  HostCounters counters_;
  std::unique_ptr<Residency> residency_;
};

TEST_F(ResidencyTest, AResidentRequestHoldsPagesForItsWholeReservation) {
  EXPECT_EQ(residency_->ResidentPagesFor(16), 2);
  EXPECT_EQ(residency_->ResidentPagesFor(17), 3);
  RequestState& r = Add(1, 16, 10);
  EXPECT_TRUE(residency_->CanPlace(16, true, 0, {}));
  ASSERT_TRUE(Place(r).ok());
  EXPECT_TRUE(r.resident());
  EXPECT_EQ(r.block, -1);
  ASSERT_EQ(r.resident_pages.size(), 2u);
  EXPECT_EQ(hot_->free_pages(), 4);
  EXPECT_EQ(residency_->OnDeviceRequests(), 1);
  // Its row of the residency table names its pages.
  std::vector<int32_t> row(2);
  ASSERT_TRUE(backend_
                  ->CopyAsync(row.data(), tables_.resident_table() + r.owner * 4,
                              row.size() * sizeof(int32_t), nullptr)
                  .ok());
  ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
  EXPECT_EQ(row, r.resident_pages);

  ASSERT_TRUE(residency_->LoadResident(r, 0, r.seq_len, nullptr).ok());
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t p = 0; p < r.seq_len; ++p) {
      EXPECT_EQ(HotByte(l, residency_->ResidentSlot(r, p)), RowByte(l, p)) << l << " " << p;
    }
  }
  EXPECT_EQ(residency_->ResidentSlot(r, 9), r.resident_pages[1] + 1);
  EXPECT_EQ(counters_.bytes_host_to_device, uint64_t{kLayers} * 10 * kStride);
}

TEST_F(ResidencyTest, WithoutRoomForItsPagesARequestTakesABlock) {
  RequestState& a = Add(1, 32, 8);
  ASSERT_TRUE(Place(a).ok());
  ASSERT_EQ(a.resident_pages.size(), 4u);
  RequestState& b = Add(2, 32, 8);
  ASSERT_TRUE(Place(b).ok());
  EXPECT_FALSE(b.resident());
  EXPECT_GE(b.block, 0);
  EXPECT_EQ(hot_->free_pages(), 1);
  EXPECT_EQ(counters_.demotions, 0u);

  // A request that must stay in hot-cache mode takes a block even with room for its pages.
  RequestState& c = Add(3, 8, 4);
  c.may_be_resident = false;
  ASSERT_TRUE(Place(c).ok());
  EXPECT_FALSE(c.resident());
  EXPECT_GE(c.block, 0);
}

TEST_F(ResidencyTest, ADeviceHoldsAtMostMaxRequests) {
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(Place(Add(id, 8, 4)).ok());
  EXPECT_EQ(residency_->OnDeviceRequests(), 3);
  EXPECT_FALSE(residency_->CanPlace(8, true, 0, {}));
}

TEST_F(ResidencyTest, DemotionTakesTheLargestResidentRequestOutsideTheOpenStep) {
  RequestState& big = Add(1, 32, 12);
  RequestState& small = Add(2, 16, 12);
  ASSERT_TRUE(Place(big).ok());
  ASSERT_TRUE(Place(small).ok());
  ASSERT_TRUE(big.resident() && small.resident());
  ASSERT_EQ(hot_->free_pages(), 0);

  // With the largest in the open step, the smaller one is demoted: its two pages for a block.
  RequestState& next = Add(3, 8, 4);
  next.may_be_resident = false;
  const std::vector<RequestId> open = {1};
  EXPECT_TRUE(residency_->CanPlace(8, false, 0, open));
  ASSERT_TRUE(Place(next, open).ok());
  EXPECT_EQ(counters_.demotions, 1u);
  EXPECT_TRUE(big.resident());
  EXPECT_FALSE(small.resident());
  ASSERT_GE(small.block, 0);
  // The demoted request's block holds its rows again, from the host pool: the newest in the
  // window, the seven before it in the replaceable slots, oldest first.
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(HotByte(l, hot_->WindowSlot(small.block, 11)), RowByte(l, 11));
    for (int32_t s = 0; s < 7; ++s)
      EXPECT_EQ(HotByte(l, hot_->Slot(small.block, s)), RowByte(l, 4 + s));
  }
  EXPECT_GE(next.block, 0);
}

TEST_F(ResidencyTest, MakingRoomIsRefusedWithoutChangingAnything) {
  RequestState& a = Add(1, 32, 8);
  RequestState& b = Add(2, 16, 8);
  ASSERT_TRUE(Place(a).ok());
  ASSERT_TRUE(Place(b).ok());
  RequestState& next = Add(3, 8, 4);
  next.may_be_resident = false;
  const std::vector<RequestId> open = {1, 2};
  EXPECT_FALSE(residency_->CanPlace(8, false, 0, open));
  const Status s = Place(next, open);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "device memory: 1 pages needed, 0 free, and demoting the resident requests outside "
            "the open step frees 0 more");
  EXPECT_TRUE(a.resident() && b.resident());
  EXPECT_FALSE(next.on_device());
  EXPECT_EQ(counters_.demotions, 0u);
}

TEST_F(ResidencyTest, PromoteRefusals) {
  auto expect = [](const Status& s, StatusCode code, const std::string& message) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_EQ(s.message(), message);
  };
  RequestState& resident = Add(1, 16, 8);
  ASSERT_TRUE(Place(resident).ok());
  expect(residency_->Promote(1, resident, {}, nullptr), StatusCode::kFailedPrecondition,
         "Promote: request 1 is resident");
  RequestState& retracted = Add(2, 8, 4);
  expect(residency_->Promote(2, retracted, {}, nullptr), StatusCode::kFailedPrecondition,
         "Promote: request 2 is retracted");
  RequestState& forked = Add(3, 8, 4);
  forked.may_be_resident = false;
  ASSERT_TRUE(Place(forked).ok());
  expect(residency_->Promote(3, forked, {}, nullptr), StatusCode::kFailedPrecondition,
         "Promote: request 3 stays in hot-cache mode (forked or remote-backed)");
  forked.may_be_resident = true;
  const std::vector<RequestId> open = {3};
  expect(residency_->Promote(3, forked, open, nullptr), StatusCode::kFailedPrecondition,
         "Promote: request 3 is in the open step");
  forked.ingested_layers = 1;
  expect(residency_->Promote(3, forked, {}, nullptr), StatusCode::kFailedPrecondition,
         "Promote: request 3 has layers not yet ingested");
  forked.ingested_layers = kLayers;
  forked.reserved = 64;  // more pages than the device has
  expect(residency_->Promote(3, forked, {}, nullptr), StatusCode::kResourceExhausted,
         "Promote: request 3 needs 8 resident pages, 3 free");

  options_.hybrid_residency = false;  // read through the reference the part holds
  expect(residency_->Promote(3, forked, {}, nullptr), StatusCode::kFailedPrecondition,
         "Promote: hybrid_residency is off");
}

TEST_F(ResidencyTest, PromoteMovesABlockRequestIntoResidentPages) {
  RequestState& r = Add(1, 16, 10);
  r.may_be_resident = false;
  ASSERT_TRUE(Place(r).ok());
  ASSERT_GE(r.block, 0);
  r.may_be_resident = true;
  ASSERT_TRUE(residency_->Promote(1, r, {}, nullptr).ok());
  EXPECT_TRUE(r.resident());
  EXPECT_EQ(r.block, -1);
  EXPECT_EQ(counters_.promotions, 1u);
  for (int32_t p = 0; p < r.seq_len; ++p) {
    EXPECT_EQ(HotByte(1, residency_->ResidentSlot(r, p)), RowByte(1, p));
  }
}

TEST_F(ResidencyTest, LoadWindowReadsTheCallersRowsFromFirstOnAndThePoolBefore) {
  RequestState& r = Add(1, 8, 3);
  r.may_be_resident = false;
  ASSERT_TRUE(Place(r).ok());
  // The window is one position, the newest (2); the caller's rows start at position 2.
  std::vector<std::byte> rows(kStride, std::byte{0x77});
  ASSERT_TRUE(residency_->LoadWindow(r, 0, rows.data(), 2, nullptr).ok());
  EXPECT_EQ(HotByte(0, hot_->WindowSlot(r.block, 2)), std::byte{0x77});
  ASSERT_TRUE(residency_->LoadWindow(r, 1, nullptr, 0, nullptr).ok());
  EXPECT_EQ(HotByte(1, hot_->WindowSlot(r.block, 2)), RowByte(1, 2));
}

TEST(PoolToHotCopyTest, CopiesPoolRowsIntoALayersHotRows) {
  std::shared_ptr<Backend> backend = CreateCpuBackend();
  const KVGeometry geometry = KVGeometry::Uniform(2, 16);
  auto pool = HostKVPool::Create(geometry, 64, 8, 2, 32, backend.get());
  ASSERT_TRUE(pool.ok());
  auto hot = HotCache::Create(geometry, 3, 1, 2, 2, 4, backend.get());
  ASSERT_TRUE(hot.ok());
  int32_t rows[2] = {0, 1};
  int32_t slots[2] = {2, 3};
  int32_t count = 2;
  unsigned long long invalid = 0;
  const IndexCopyView copy = PoolToHotCopy(**pool, **hot, LayerShape{12, 16}, 1,
                                           MissList{rows, slots, &count}, 2, &invalid);
  EXPECT_EQ(copy.src, (*pool)->layer_base(1));
  EXPECT_EQ(copy.dst, (*hot)->layer_data(1));
  EXPECT_EQ(copy.src_index, rows);
  EXPECT_EQ(copy.dst_index, slots);
  EXPECT_EQ(copy.count, &count);
  EXPECT_EQ(copy.capacity, 2);
  EXPECT_EQ(copy.row_bytes, 12);
  EXPECT_EQ(copy.src_stride, 16);
  EXPECT_EQ(copy.dst_stride, 16);
  EXPECT_EQ(copy.src_rows, (*pool)->rows());
  EXPECT_EQ(copy.dst_rows, (*hot)->layer_rows());
  EXPECT_EQ(copy.invalid, &invalid);
  EXPECT_EQ(copy.max_blocks, 0);
}

}  // namespace
}  // namespace sparsekv
