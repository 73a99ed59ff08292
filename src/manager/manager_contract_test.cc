// Sentences of manager.h held to the code: each test is named after what the header promises, and
// fails if the manager does otherwise (CPU backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "testing/harness.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kStride = 16;

// One layer of 16-byte rows, K = 2, 4 hot slots, pages of `page_tokens`, at most 4 requests of
// 32 positions.
CacheOptions Tiny(int32_t window, int32_t page_tokens) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(1, kStride);
  o.top_k = 2;
  o.hot_slots = 4;
  o.window = window;
  o.host_capacity_tokens = 256;
  o.max_requests = 4;
  o.max_context = 32;
  o.host_page_tokens = page_tokens;
  return o;
}

std::unique_ptr<SparseKVCacheManager> Make(const CacheOptions& o) {
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

Bytes Filled(int32_t rows, int value) {
  Bytes b(static_cast<size_t>(rows) * kStride);
  std::memset(b.data(), value, b.size());
  return b;
}

// Rows 0, 1, 2, ... of 16 bytes each: byte i of the buffer is i (mod 256).
Bytes Counting(int32_t rows) {
  Bytes b(static_cast<size_t>(rows) * kStride);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i);
  return b;
}

// One layer's run phase for `top_k_rows` ([4, 2] positions): the assembled rows, [4, 2, 16].
Bytes RunOneLayer(SparseKVCacheManager& m, const std::vector<int32_t>& topk) {
  const Bytes new_rows = Filled(4, 0);
  EXPECT_TRUE(m.AppendToken(0, new_rows.data(), nullptr).ok());
  std::vector<int32_t> slots(8);
  Bytes assembled(8 * kStride);
  const Status s = m.RunLayer(0, topk.data(), slots.data(), assembled.data(), nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(m.FinishStep(nullptr).ok());
  return assembled;
}

bool RowIs(const Bytes& rows, int32_t i, const std::byte* want) {
  return std::memcmp(rows.data() + static_cast<size_t>(i) * kStride, want, kStride) == 0;
}

// IngestPrompt: "rows of positions found by AdmitWithPrefix are skipped (the pool's shared copy
// is kept)" -- also for the positions of the newest-token window.
TEST(ManagerContractTest, IngestPromptSkipsPrefixRowsAlsoInTheWindow) {
  for (int32_t window : {1, 2, 3, 4}) {
    SCOPED_TRACE("window " + std::to_string(window));
    auto m = Make(Tiny(window, 4));
    ASSERT_NE(m, nullptr);
    const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
    ASSERT_TRUE(m->AdmitWithPrefix(1, ids, 4, nullptr).ok());
    const Bytes a = Counting(8);
    ASSERT_TRUE(m->IngestPrompt(1, 0, a.data(), nullptr).ok());

    std::vector<int32_t> longer = ids;
    longer.push_back(9);
    const StatusOr<int32_t> cached = m->AdmitWithPrefix(2, longer, 4, nullptr);
    ASSERT_TRUE(cached.ok());
    ASSERT_EQ(*cached, 8);
    // The caller's rows for the shared positions are garbage; only position 8 is its own.
    Bytes prompt = Filled(9, 0xEE);
    std::memset(prompt.data() + 8 * kStride, 0x55, kStride);
    ASSERT_TRUE(m->IngestPrompt(2, 0, prompt.data(), nullptr).ok());

    ASSERT_TRUE(m->PlanStep({2}, {10}, nullptr).ok());
    const Bytes got = RunOneLayer(*m, {7, 8, 7, 8, 7, 8, 7, 8});
    EXPECT_TRUE(RowIs(got, 0, a.data() + 7 * kStride)) << "position 7 must be the shared row";
    EXPECT_TRUE(RowIs(got, 1, prompt.data() + 8 * kStride));
  }
}

// CopyMissChunk: "chunks are valid in [0, ceil(max_batch / R))", each copied once, in any order
// -- also the chunks past the batch after the layer counts as copied.
TEST(ManagerContractTest, EveryChunkCopiesOnceInAnyOrder) {
  for (bool descending : {false, true}) {
    SCOPED_TRACE(descending ? "descending" : "ascending");
    CacheOptions o = Tiny(1, 8);
    o.copy_chunk_rows = 1;
    auto m = Make(o);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
    const Bytes prompt = Counting(8);
    ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
    ASSERT_TRUE(m->PlanStep({1}, nullptr).ok());
    const Bytes new_rows = Filled(4, 0);
    ASSERT_TRUE(m->AppendToken(0, new_rows.data(), nullptr).ok());
    const std::vector<int32_t> topk = {0, 1, 0, 1, 0, 1, 0, 1};
    std::vector<int32_t> slots(8);
    ASSERT_TRUE(m->ResolveLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
    std::vector<int32_t> order(4);
    std::iota(order.begin(), order.end(), 0);
    if (descending) std::reverse(order.begin(), order.end());
    for (int32_t c : order) {
      const Status s = m->CopyMissChunk(0, c, nullptr);
      EXPECT_TRUE(s.ok()) << "chunk " << c << ": " << s.ToString();
    }
    EXPECT_EQ(m->CopyMissChunk(0, 1, nullptr).code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(m->FinishStep(nullptr).ok());
    // The copied rows are the prompt's.
    Bytes assembled(8 * kStride);
    ASSERT_TRUE(m->PlanStep({1}, nullptr).ok());
    ASSERT_TRUE(m->AppendToken(0, new_rows.data(), nullptr).ok());
    ASSERT_TRUE(m->ResolveLayer(0, topk.data(), slots.data(), nullptr, nullptr).ok());
    ASSERT_TRUE(m->CopyMisses(0, nullptr).ok());
    ASSERT_TRUE(m->AssembleLayer(0, slots.data(), assembled.data(), nullptr).ok());
    ASSERT_TRUE(m->FinishStep(nullptr).ok());
    EXPECT_TRUE(RowIs(assembled, 0, prompt.data()));
    EXPECT_TRUE(RowIs(assembled, 1, prompt.data() + kStride));
  }
}

// AppendToken: new_keys "is ignored without" indexer keys.
TEST(ManagerContractTest, AppendTokenIgnoresKeysWithoutIndexerKeys) {
  auto m = Make(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->PlanStep({1}, nullptr).ok());
  const Bytes rows = Filled(4, 7);
  const Bytes keys = Filled(4, 9);
  const Status s = m->AppendToken(0, rows.data(), keys.data(), nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// PlanStep: "InvalidArgument unless token_ids.size() == batch.size()" -- an empty list too; the
// refusal changes nothing.
TEST(ManagerContractTest, PlanStepRefusesEmptyTokenIdsForABatch) {
  auto m = Make(Tiny(1, 4));
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  ASSERT_TRUE(m->AdmitWithPrefix(1, ids, 8, nullptr).ok());
  const Bytes prompt = Counting(11);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  const std::vector<RequestId> batch = {1};
  EXPECT_EQ(m->PlanStep(batch, std::vector<int32_t>{}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m->batch_size(), 0);
  // The request still knows its ids: a step with its next id fills page 2, which is retained.
  ASSERT_TRUE(m->PlanStep(batch, std::vector<int32_t>{12}, nullptr).ok());
  RunOneLayer(*m, {0, 1, 0, 1, 0, 1, 0, 1});
  const StatusOr<int32_t> retained = m->Retain(1);
  ASSERT_TRUE(retained.ok());
  EXPECT_EQ(*retained, 12);
}

// Promote: FailedPrecondition for a request whose prompt is not yet ingested in every layer.
TEST(ManagerContractTest, PromoteRefusesARequestStillBeingIngested) {
  CacheOptions o = Tiny(1, 8);
  o.geometry = KVGeometry::Uniform(2, kStride);
  o.hot_slots = 7;  // a block of 8 rows: one resident page
  o.hybrid_residency = true;
  o.resident_page_rows = 8;
  o.max_requests = 2;
  auto m = Make(o);
  ASSERT_NE(m, nullptr);
  // Two requests whose reservations fill the device: the second is in hot-cache mode.
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  ASSERT_TRUE(m->Admit(2, 8, 8, nullptr).ok());
  const RequestId hot = m->IsResident(1) ? 2 : 1;
  if (m->IsResident(hot)) GTEST_SKIP() << "both requests fit resident in this geometry";
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(hot, 0, prompt.data(), nullptr).ok());
  EXPECT_EQ(m->Promote(hot, nullptr).code(), StatusCode::kFailedPrecondition);
}

// HostCounters::bytes_host_to_device counts a resident request's prompt rows at ingest, and at a
// resume only the layers ingested so far; the rows read afterwards are the prompt's.
TEST(ManagerContractTest, ResidentIngestAndResumeCountTheRowsTheyLoad) {
  CacheOptions o = Tiny(1, 8);
  o.geometry = KVGeometry::Uniform(2, kStride);
  o.hot_slots = 7;  // a block of 8 rows: one resident page
  o.hybrid_residency = true;
  o.resident_page_rows = 8;
  auto m = Make(o);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  ASSERT_TRUE(m->IsResident(1));
  const Bytes layer0 = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, layer0.data(), nullptr).ok());
  StatusOr<CacheStats> stats = m->ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->bytes_host_to_device, 8u * kStride);

  ASSERT_TRUE(m->Retract(1).ok());
  ASSERT_TRUE(m->ResetStats(nullptr).ok());
  ASSERT_TRUE(m->Resume(1, nullptr).ok());
  ASSERT_TRUE(m->IsResident(1));
  stats = m->ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->bytes_host_to_device, 8u * kStride) << "only layer 0 is ingested";

  Bytes layer1 = Filled(8, 0x31);
  ASSERT_TRUE(m->IngestPrompt(1, 1, layer1.data(), nullptr).ok());
  ASSERT_TRUE(m->PlanStep({1}, nullptr).ok());
  const Bytes new_rows = Filled(4, 0);
  const std::vector<int32_t> topk = {3, 5, 3, 5, 3, 5, 3, 5};
  std::vector<int32_t> slots(8);
  Bytes assembled(8 * kStride);
  for (int32_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(m->AppendToken(l, new_rows.data(), nullptr).ok());
    ASSERT_TRUE(m->RunLayer(l, topk.data(), slots.data(), assembled.data(), nullptr).ok());
    const Bytes& want = l == 0 ? layer0 : layer1;
    EXPECT_TRUE(RowIs(assembled, 0, want.data() + 3 * kStride)) << "layer " << l;
    EXPECT_TRUE(RowIs(assembled, 1, want.data() + 5 * kStride)) << "layer " << l;
  }
  ASSERT_TRUE(m->FinishStep(nullptr).ok());
}

// Fork: "the parent may be retracted"; the child reads the parent's rows.
TEST(ManagerContractTest, ForkOfARetractedParent) {
  auto m = Make(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->Retract(1).ok());
  ASSERT_TRUE(m->Fork(1, 2, 4, nullptr).ok());
  ASSERT_TRUE(m->PlanStep({2}, nullptr).ok());
  const Bytes got = RunOneLayer(*m, {2, 6, 2, 6, 2, 6, 2, 6});
  EXPECT_TRUE(RowIs(got, 0, prompt.data() + 2 * kStride));
  EXPECT_TRUE(RowIs(got, 1, prompt.data() + 6 * kStride));
}

// PlanStep takes braced lists.
TEST(ManagerContractTest, PlanStepTakesBracedLists) {
  auto m = Make(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  ASSERT_TRUE(m->Admit(2, 8, 8, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->IngestPrompt(2, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->PlanStep({1, 2}, nullptr).ok());
  EXPECT_EQ(m->batch_size(), 2);
  RunOneLayer(*m, {0, 1, 0, 1, 0, 1, 0, 1});
  EXPECT_EQ(m->PlanStep({1, 2}, {5}, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv
