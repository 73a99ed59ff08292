// The run-phase orders the manager refuses (manager.h): each refusal returns its code, names the
// problem, and changes nothing, so that the next legal call works and every row is right.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "sparsekv/manager_extension.h"
#include "testing/forwarding_backend.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kLayers = 6;
constexpr int32_t kPrompt = 10;

// Row of position p in layer l: eight bytes equal to l * 40 + p + 1.
std::byte RowByte(int32_t layer, int32_t position) {
  return static_cast<std::byte>(layer * 40 + position + 1);
}
Bytes Rows(int32_t layer, int32_t first, int32_t n) {
  Bytes b(static_cast<size_t>(n) * 8);
  for (int32_t i = 0; i < n; ++i) {
    std::memset(b.data() + i * 8, static_cast<int>(RowByte(layer, first + i)), 8);
  }
  return b;
}

// Six layers of 8-byte rows in index groups of two: groups 0 (layers 0, 1), 1 (2, 3), 2 (4, 5);
// groups 0 and 2 share a miss list. One request of kPrompt tokens; K = 2.
class ManagerRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CacheOptions o = testing::SmallOptions();
    o.geometry = KVGeometry::Uniform(kLayers, 8);
    o.layers_per_index = 2;
    o.max_prefetch = 2;
    auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
    ASSERT_TRUE(m_->Admit(1, kPrompt, 8, nullptr).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes rows = Rows(l, 0, kPrompt);
      ASSERT_TRUE(m_->IngestPrompt(1, l, rows.data(), nullptr).ok());
    }
    for (int32_t l = 0; l < kLayers; ++l) new_rows_.push_back(Rows(l, kPrompt, 1));
  }
  void Plan() { ASSERT_TRUE(m_->PlanStep(std::vector<RequestId>{1}, nullptr).ok()); }
  void Append(int32_t layer) {
    const Status s = m_->AppendToken(layer, new_rows_[layer].data(), nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void AppendAll() {
    for (int32_t l = 0; l < kLayers; ++l) Append(l);
  }
  // Group g selects positions {2g, 2g + 1}, so that groups sharing a miss list miss on other
  // rows.
  Status Resolve(int32_t group) {
    topk_[group] = {2 * group, 2 * group + 1};
    return m_->ResolveLayer(group * 2, topk_[group].data(), slots_[group].data(), nullptr, nullptr);
  }
  Status Copy(int32_t layer) { return m_->CopyMisses(layer, nullptr); }
  // Every selected row of `layer` holds its position's bytes in the hot cache.
  void ExpectRows(int32_t layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    ASSERT_TRUE(m_->backend().Synchronize(nullptr).ok());
    const int32_t g = layer / 2;
    for (int32_t k = 0; k < 2; ++k) {
      const int32_t slot = slots_[g][k];
      ASSERT_GE(slot, 0);
      EXPECT_EQ(m_->HotLayer(layer)[int64_t{slot} * 8], RowByte(layer, topk_[g][k]))
          << "position " << topk_[g][k];
    }
  }
  // Resolves and copies groups [from_group, 3) in order, checks their rows, finishes the step.
  void CompleteStep(int32_t from_group) {
    for (int32_t g = from_group; g < 3; ++g) {
      ASSERT_TRUE(Resolve(g).ok());
      ASSERT_TRUE(Copy(2 * g).ok());
      ASSERT_TRUE(Copy(2 * g + 1).ok());
    }
    for (int32_t l = 2 * from_group; l < kLayers; ++l) ExpectRows(l);
    const Status s = m_->FinishStep(nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  uint64_t Misses() { return m_->ReadStats(nullptr)->total.misses; }

  std::unique_ptr<SparseKVCacheManager> m_;
  std::vector<Bytes> new_rows_;
  std::vector<int32_t> topk_[3];
  std::vector<int32_t> slots_[3] = {std::vector<int32_t>(2), std::vector<int32_t>(2),
                                    std::vector<int32_t>(2)};
};

void ExpectRefused(const Status& s, StatusCode code, const std::string& names) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.ToString().find(names), std::string::npos) << s.ToString();
}

TEST_F(ManagerRefusalTest, ResolveIsRefusedUntilTheGroupTwoBackIsCopied) {
  Plan();
  AppendAll();
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(0).ok());
  ASSERT_TRUE(Resolve(1).ok());
  const uint64_t misses = Misses();
  // Group 2 would overwrite the miss list that layer 1 has yet to copy.
  ExpectRefused(Resolve(2), StatusCode::kFailedPrecondition,
                "reuses the miss list of index group 0, whose layer 1 has no CopyMisses");
  EXPECT_EQ(Misses(), misses);  // nothing was resolved
  ASSERT_TRUE(Copy(1).ok());
  ExpectRows(1);  // group 0's misses, not group 2's
  ASSERT_TRUE(Copy(2).ok());
  ASSERT_TRUE(Copy(3).ok());
  CompleteStep(2);
  EXPECT_EQ(Misses(), misses + 2 * 2);  // group 2's two misses, in each of its two layers
}

TEST_F(ManagerRefusalTest, IndexGroupsResolveInOrder) {
  Plan();
  AppendAll();
  ExpectRefused(Resolve(1), StatusCode::kFailedPrecondition,
                "before index group 0: index groups resolve in order");
  EXPECT_EQ(Misses(), 0u);
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(0).ok());
  ASSERT_TRUE(Copy(1).ok());
  ExpectRows(0);
  ExpectRows(1);
  ExpectRefused(Resolve(2), StatusCode::kFailedPrecondition, "before index group 1");
  CompleteStep(1);
}

TEST_F(ManagerRefusalTest, ASecondResolveOfAGroupIsRefused) {
  Plan();
  AppendAll();
  ASSERT_TRUE(Resolve(0).ok());
  const uint64_t misses = Misses();
  const std::vector<int32_t> slots = slots_[0];
  std::vector<int32_t> other(2, -5);
  ExpectRefused(m_->ResolveLayer(0, topk_[0].data(), other.data(), nullptr, nullptr),
                StatusCode::kFailedPrecondition, "layer 0 (index group 0) was already resolved");
  EXPECT_EQ(other, std::vector<int32_t>(2, -5));
  EXPECT_EQ(Misses(), misses);
  EXPECT_EQ(slots_[0], slots);
  ASSERT_TRUE(Copy(0).ok());
  ASSERT_TRUE(Copy(1).ok());
  ExpectRows(0);
  ExpectRows(1);
  CompleteStep(1);
}

TEST_F(ManagerRefusalTest, CopyMissesIsRefusedBeforeTheResolveAndTwiceForALayer) {
  Plan();
  AppendAll();
  ExpectRefused(Copy(1), StatusCode::kFailedPrecondition,
                "layer 1 (index group 0) was not resolved in this step");
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(1).ok());
  ExpectRefused(Copy(1), StatusCode::kFailedPrecondition,
                "layer 1 (index group 0) was already copied");
  ASSERT_TRUE(Copy(0).ok());
  ExpectRows(0);
  ExpectRows(1);
  CompleteStep(1);
}

TEST_F(ManagerRefusalTest, AssembleIsRefusedBeforeTheResolveAndBeforeTheAppend) {
  Plan();
  Append(0);
  Bytes assembled(2 * 8, std::byte{0x77});
  ExpectRefused(m_->AssembleLayer(0, slots_[0].data(), assembled.data(), nullptr),
                StatusCode::kFailedPrecondition, "layer 0 (index group 0) was not resolved");
  EXPECT_EQ(assembled, Bytes(2 * 8, std::byte{0x77}));
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(1).ok());  // a copy may run ahead of its layer's append
  ExpectRefused(m_->AssembleLayer(1, slots_[0].data(), assembled.data(), nullptr),
                StatusCode::kFailedPrecondition, "AppendToken(1) must come first");
  EXPECT_EQ(assembled, Bytes(2 * 8, std::byte{0x77}));
  Append(1);
  ASSERT_TRUE(Copy(0).ok());
  ASSERT_TRUE(m_->AssembleLayer(1, slots_[0].data(), assembled.data(), nullptr).ok());
  EXPECT_EQ(assembled[0], RowByte(1, 0));
  EXPECT_EQ(assembled[8], RowByte(1, 1));
  for (int32_t l = 2; l < kLayers; ++l) Append(l);
  CompleteStep(1);
}

TEST_F(ManagerRefusalTest, PrefetchBetweenAResolveAndItsCopiesIsRefused) {
  Plan();
  AppendAll();
  const std::vector<int32_t> positions = {5, 6};
  // Before the group's resolve: legal (the StepDriver's order).
  ASSERT_TRUE(m_->PrefetchLayer(0, positions.data(), 2, nullptr).ok());
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(0).ok());
  const uint64_t lookups = m_->ReadStats(nullptr)->prefetch_lookups;
  ExpectRefused(m_->PrefetchLayer(0, positions.data(), 2, nullptr), StatusCode::kFailedPrecondition,
                "index group 0 was resolved in this step and its layer 1 has no CopyMisses");
  EXPECT_EQ(m_->ReadStats(nullptr)->prefetch_lookups, lookups);
  ASSERT_TRUE(Copy(1).ok());
  ExpectRows(0);
  ExpectRows(1);
  // After the group's copies: legal (the benchmark's order, after the group's attention).
  ASSERT_TRUE(m_->PrefetchLayer(0, positions.data(), 2, nullptr).ok());
  EXPECT_EQ(m_->ReadStats(nullptr)->prefetch_lookups, lookups + 2);
  CompleteStep(1);
}

TEST(ManagerChunkTest, ChunksAreCopiedOnceAndTheLayerOnlyWhenEveryChunkOfTheBatchIs) {
  CacheOptions o = testing::SmallOptions();
  o.max_requests = 5;
  o.host_capacity_tokens = 5 * 32;
  o.copy_chunk_rows = 2;  // chunks {0, 1}, {2, 3}, {4}
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok());
  std::vector<RequestId> batch;
  for (RequestId id = 1; id <= 3; ++id) {
    ASSERT_TRUE((*m)->Admit(id, 4, 4, nullptr).ok());
    const Bytes rows = Bytes(4 * 8, std::byte(id));
    ASSERT_TRUE((*m)->IngestPrompt(id, 0, rows.data(), nullptr).ok());
    batch.push_back(id);
  }
  ASSERT_TRUE((*m)->PlanStep(batch, nullptr).ok());
  const Bytes new_rows(5 * 8, std::byte{9});
  ASSERT_TRUE((*m)->AppendToken(0, new_rows.data(), nullptr).ok());
  const std::vector<int32_t> topk(5 * 2, 0);
  std::vector<int32_t> slots(5 * 2);
  ExpectRefused((*m)->CopyMissChunk(0, 0, nullptr), StatusCode::kFailedPrecondition,
                "was not resolved");
  ASSERT_TRUE((*m)->ResolveLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
  ExpectRefused((*m)->CopyMissChunk(0, 3, nullptr), StatusCode::kInvalidArgument,
                "chunk 3 outside [0, 3)");
  ASSERT_TRUE((*m)->CopyMissChunk(0, 1, nullptr).ok());
  ExpectRefused((*m)->CopyMissChunk(0, 1, nullptr), StatusCode::kFailedPrecondition,
                "chunk 1 of layer 0 (index group 0) was already copied");
  ExpectRefused((*m)->CopyMisses(0, nullptr), StatusCode::kFailedPrecondition,
                "chunk 1 of layer 0 (index group 0) was already copied");
  // Rows 0-2 are chunks 0 and 1: the layer is not copied until chunk 0 is.
  ExpectRefused((*m)->FinishStep(nullptr), StatusCode::kFailedPrecondition, "no CopyMisses");
  ASSERT_TRUE((*m)->CopyMissChunk(0, 0, nullptr).ok());
  ASSERT_TRUE((*m)->FinishStep(nullptr).ok());

  CacheOptions plain = testing::SmallOptions();
  auto unchunked = SparseKVCacheManager::Create(plain, CreateCpuBackend());
  ASSERT_TRUE(unchunked.ok());
  ExpectRefused((*unchunked)->CopyMissChunk(0, 0, nullptr), StatusCode::kFailedPrecondition,
                "no step is planned");
}

TEST_F(ManagerRefusalTest, OnePrefetchIsPendingAtATime) {
  Plan();
  AppendAll();
  const std::vector<int32_t> positions = {5, 6};
  ExpectRefused(m_->CopyPrefetch(2, nullptr), StatusCode::kFailedPrecondition,
                "no prefetch of layer 2 (index group 1) is pending");
  ASSERT_TRUE(m_->ResolvePrefetch(2, positions.data(), 2, nullptr).ok());
  ExpectRefused(m_->ResolvePrefetch(0, positions.data(), 2, nullptr),
                StatusCode::kFailedPrecondition,
                "the prefetch of index group 1 has no CopyPrefetch");
  ExpectRefused(m_->CopyPrefetch(0, nullptr), StatusCode::kFailedPrecondition,
                "no prefetch of layer 0 (index group 0) is pending");
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(0).ok());
  ASSERT_TRUE(Copy(1).ok());
  ASSERT_TRUE(Resolve(1).ok());
  ASSERT_TRUE(Copy(2).ok());
  ASSERT_TRUE(Copy(3).ok());
  ASSERT_TRUE(Resolve(2).ok());
  ASSERT_TRUE(Copy(4).ok());
  ASSERT_TRUE(Copy(5).ok());
  ExpectRefused(m_->FinishStep(nullptr), StatusCode::kFailedPrecondition,
                "the prefetch of index group 1 has no CopyPrefetch");
  // A grid of its own for the copy: never below 0 (and a refusal leaves the prefetch pending).
  ExpectRefused(m_->CopyPrefetch(3, nullptr, -1), StatusCode::kInvalidArgument,
                "copy_blocks -1 is negative");
  ASSERT_TRUE(m_->CopyPrefetch(3, nullptr, 16).ok());
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
  EXPECT_EQ(m_->ReadStats(nullptr)->prefetch_lookups, 2u);
}

TEST_F(ManagerRefusalTest, FinishStepIsRefusedUntilEveryGroupIsResolvedAndEveryLayerCopied) {
  Plan();
  AppendAll();
  ASSERT_TRUE(Resolve(0).ok());
  ASSERT_TRUE(Copy(0).ok());
  ASSERT_TRUE(Copy(1).ok());
  ExpectRefused(m_->FinishStep(nullptr), StatusCode::kFailedPrecondition,
                "index group 1 was not resolved in this step");
  ASSERT_TRUE(Resolve(1).ok());
  ASSERT_TRUE(Copy(2).ok());
  ASSERT_TRUE(Copy(3).ok());
  ASSERT_TRUE(Resolve(2).ok());
  ASSERT_TRUE(Copy(4).ok());
  ExpectRefused(m_->FinishStep(nullptr), StatusCode::kFailedPrecondition,
                "layer 5 (index group 2) has no CopyMisses in this step");
  EXPECT_EQ(m_->batch_size(), 1);  // the step is still open
  ASSERT_TRUE(Copy(5).ok());
  for (int32_t l = 0; l < kLayers; ++l) ExpectRows(l);
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
  EXPECT_EQ(*m_->SequenceLength(1), kPrompt + 1);
}

TEST_F(ManagerRefusalTest, FinishReplayedStepIsRefusedAfterAHostRunPhase) {
  Plan();
  AppendAll();
  CompleteStep(0);  // records a complete run phase
  for (int32_t l = 0; l < kLayers; ++l) new_rows_[l] = Rows(l, kPrompt + 1, 1);
  Plan();
  Append(0);
  const uint64_t to_host = m_->ReadStats(nullptr)->bytes_device_to_host;
  ExpectRefused(m_->FinishReplayedStep(), StatusCode::kFailedPrecondition,
                "AppendToken ran on the host in this step");
  EXPECT_EQ(m_->ReadStats(nullptr)->bytes_device_to_host, to_host);  // nothing was counted twice
  for (int32_t l = 1; l < kLayers; ++l) Append(l);
  CompleteStep(0);
}

// A prefetch resolved on the host and not copied would outlive the replayed step: refused, and
// the refusal counts nothing and keeps the step open.
TEST_F(ManagerRefusalTest, FinishReplayedStepIsRefusedWithAPrefetchPending) {
  Plan();
  AppendAll();
  CompleteStep(0);  // records a complete run phase
  Plan();
  const std::vector<int32_t> positions = {3, 4};
  ASSERT_TRUE(m_->ResolvePrefetch(2, positions.data(), 2, nullptr).ok());
  const CacheStats before = *m_->ReadStats(nullptr);
  ExpectRefused(m_->FinishReplayedStep(), StatusCode::kFailedPrecondition,
                "the prefetch of index group 1 has no CopyPrefetch");
  const CacheStats after = *m_->ReadStats(nullptr);
  EXPECT_EQ(after.bytes_device_to_host, before.bytes_device_to_host);
  EXPECT_EQ(after.bytes_assembled, before.bytes_assembled);
  EXPECT_EQ(m_->batch_size(), 1);  // the step is still open
  EXPECT_EQ(m_->PlanStep(std::vector<RequestId>{1}, nullptr).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m_->CopyPrefetch(2, nullptr).ok());
  ASSERT_TRUE(m_->FinishReplayedStep().ok());
  EXPECT_EQ(*m_->SequenceLength(1), kPrompt + 2);
  EXPECT_GT(m_->ReadStats(nullptr)->bytes_device_to_host, before.bytes_device_to_host);
}

// A miss copy that fails on the device after some of its chunks were enqueued leaves the layer
// uncopied: CopyMisses may be called again, and the step finishes with every row right.
TEST(ManagerCopyFailureTest, CopyMissesFailingPartWayMayBeCalledAgain) {
  CacheOptions o = testing::SmallOptions();
  o.max_batch = 2;
  o.copy_chunk_rows = 1;
  auto backend = std::make_shared<testing::FaultyBackend>();
  auto created = SparseKVCacheManager::Create(o, backend);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  SparseKVCacheManager& m = **created;
  for (RequestId id : {1, 2}) {
    ASSERT_TRUE(m.Admit(id, kPrompt, 8, nullptr).ok());
    const Bytes rows = Rows(id, 0, kPrompt);
    ASSERT_TRUE(m.IngestPrompt(id, 0, rows.data(), nullptr).ok());
  }
  const std::vector<RequestId> batch = {1, 2};
  ASSERT_TRUE(m.PlanStep(batch, nullptr).ok());
  const Bytes new_rows(2 * 8);
  ASSERT_TRUE(m.AppendToken(0, new_rows.data(), nullptr).ok());
  const std::vector<int32_t> topk = {0, 1, 2, 3};  // misses in both rows: both chunks copy
  std::vector<int32_t> slots(4);
  ASSERT_TRUE(m.ResolveLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
  backend->FailIndexCopy(1);  // chunk 0 is copied, chunk 1 fails
  ExpectRefused(m.CopyMisses(0, nullptr), StatusCode::kInternal, "injected IndexCopy failure");
  ExpectRefused(m.FinishStep(nullptr), StatusCode::kFailedPrecondition,
                "layer 0 (index group 0) has no CopyMisses in this step");
  ASSERT_TRUE(m.CopyMisses(0, nullptr).ok());
  ASSERT_TRUE(m.FinishStep(nullptr).ok());
  for (int32_t b = 0; b < 2; ++b) {
    for (int32_t k = 0; k < 2; ++k) {
      const int32_t slot = slots[b * 2 + k];
      ASSERT_GE(slot, 0);
      EXPECT_EQ(m.HotLayer(0)[int64_t{slot} * 8], RowByte(b + 1, topk[b * 2 + k]));
    }
  }
}

// The benchmark's copies-ahead order (docs/overlap.md): every layer of a group is copied right
// after the group's resolve, before the group's later layers are appended.
TEST_F(ManagerRefusalTest, CopiesAheadOfTheirLayersStayLegal) {
  Plan();
  for (int32_t g = 0; g < 3; ++g) {
    Append(2 * g);
    ASSERT_TRUE(Resolve(g).ok());
    ASSERT_TRUE(Copy(2 * g).ok());
    ASSERT_TRUE(Copy(2 * g + 1).ok());
    Append(2 * g + 1);
  }
  for (int32_t l = 0; l < kLayers; ++l) ExpectRows(l);
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
}

// From one layer per group: running layer 1 before layer 0 is refused, not silently accepted.
TEST(ManagerRefusalOrderTest, RunLayerOfALaterLayerFirstIsRefused) {
  CacheOptions o = testing::SmallOptions();
  o.geometry = KVGeometry::Uniform(2, 8);
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok());
  SparseKVCacheManager& mgr = **m;
  ASSERT_TRUE(mgr.Admit(1, kPrompt, 8, nullptr).ok());
  for (int32_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(mgr.IngestPrompt(1, l, Rows(l, 0, kPrompt).data(), nullptr).ok());
  }
  ASSERT_TRUE(mgr.PlanStep(std::vector<RequestId>{1}, nullptr).ok());
  const std::vector<int32_t> topk = {3, 4};
  std::vector<int32_t> slots(2);
  for (int32_t l : {1, 0}) {
    ASSERT_TRUE(mgr.AppendToken(l, Rows(l, kPrompt, 1).data(), nullptr).ok());
  }
  ExpectRefused(mgr.RunLayer(1, topk.data(), slots.data(), nullptr, nullptr),
                StatusCode::kFailedPrecondition, "index groups resolve in order");
  for (int32_t l : {0, 1}) {
    ASSERT_TRUE(mgr.RunLayer(l, topk.data(), slots.data(), nullptr, nullptr).ok());
    for (int32_t k = 0; k < 2; ++k) {
      EXPECT_EQ(mgr.HotLayer(l)[int64_t{slots[k]} * 8], RowByte(l, topk[k]));
    }
  }
  ASSERT_TRUE(mgr.FinishStep(nullptr).ok());
  EXPECT_EQ(mgr.ReadStats(nullptr)->total.misses, 4u);
}

// An extension that only hands out the manager's ExtensionHost.
class HostGrabber final : public ManagerExtension {
 public:
  bool BeginStep(std::span<const RequestId>, StreamHandle) override { return false; }
  StatusOr<MissList> BeforeCopy(int32_t, const MissList& list, int32_t, int32_t,
                                StreamHandle) override {
    return list;
  }
  Status AfterCopy(int32_t, StreamHandle) override { return Status::Ok(); }
  Status AfterResolve(int32_t, int32_t*, StreamHandle) override { return Status::Ok(); }
  Status AfterMissCopy(int32_t, StreamHandle) override { return Status::Ok(); }
  void OnDrop(RequestId) override {}
  Status CheckFork(RequestId) const override { return Status::Ok(); }
};

TEST_F(ManagerRefusalTest, CompleteLayerRefusesUnknownRequestsBadLayersAndCompleteOnes) {
  ExtensionHost* host = nullptr;
  ASSERT_TRUE(m_->InstallExtension([&host](ExtensionHost& h)
                                       -> StatusOr<std::unique_ptr<ManagerExtension>> {
                  host = &h;
                  return std::unique_ptr<ManagerExtension>(std::make_unique<HostGrabber>());
                }).ok());
  ASSERT_TRUE(host->AdmitWithPages(2, kPrompt, 4, {}, nullptr).ok());
  ExpectRefused(host->CompleteLayer(3, 0, nullptr), StatusCode::kNotFound, "request 3");
  ExpectRefused(host->CompleteLayer(2, kLayers, nullptr), StatusCode::kInvalidArgument,
                "layer 6 out of range");
  ASSERT_TRUE(m_->Retract(2).ok());
  ExpectRefused(host->CompleteLayer(2, 0, nullptr), StatusCode::kFailedPrecondition,
                "request 2 is retracted");
  ASSERT_TRUE(m_->Resume(2, nullptr).ok());
  for (int32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(host->CompleteLayer(2, l, nullptr).ok());
  ExpectRefused(host->CompleteLayer(2, 1, nullptr), StatusCode::kAlreadyExists,
                "layer 1 of request 2 is complete already");
  // Every layer complete once: it joins a step (its prompt rows were never written: no row
  // checks).
  ASSERT_TRUE(m_->PlanStep(std::vector<RequestId>{2}, nullptr).ok());
  AppendAll();
  for (int32_t g = 0; g < 3; ++g) {
    ASSERT_TRUE(Resolve(g).ok());
    ASSERT_TRUE(Copy(2 * g).ok());
    ASSERT_TRUE(Copy(2 * g + 1).ok());
  }
  ASSERT_TRUE(m_->FinishStep(nullptr).ok());
  EXPECT_EQ(*m_->SequenceLength(2), kPrompt + 1);
}

// Resident and window-only layers and a raw window are served beside offloaded layers; a geometry
// with no offloaded layer is refused at creation, naming why.
TEST(ManagerCreateRefusalTest, AGeometryWithoutOffloadedLayersIsRefused) {
  CacheOptions o = testing::SmallOptions();
  o.geometry = KVGeometry::Uniform(3, 8);
  ASSERT_TRUE(SparseKVCacheManager::Create(o, CreateCpuBackend()).ok());
  o.geometry.layers[1].kind = LayerKind::kResident;
  o.geometry.layers[1].indexer_keys = false;
  o.raw_window = 4;
  EXPECT_TRUE(SparseKVCacheManager::Create(o, CreateCpuBackend()).ok());
  for (LayerShape& l : o.geometry.layers) {
    l.kind = LayerKind::kResident;
    l.indexer_keys = false;
  }
  const auto refused = SparseKVCacheManager::Create(o, CreateCpuBackend());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("no offloaded layer"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace sparsekv
