// Sentences of manager.h held to the code: each test is named after what the header promises, and
// fails if the manager does otherwise (the first on the CPU backend; the error lists, under
// Backends/, on the CPU and the CUDA backend, the latter skipping without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "testing/cuda_test_util.h"
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
// The run phase's buffers are the backend's device memory.
Bytes RunOneLayer(SparseKVCacheManager& m, const std::vector<int32_t>& topk) {
  using testing::DeviceBuffer;
  Backend& b = m.backend();
  DeviceBuffer new_rows(b, 4 * kStride), topk_d(b, topk.size() * sizeof(int32_t));
  DeviceBuffer slots(b, 8 * sizeof(int32_t)), assembled(b, 8 * kStride);
  const Bytes zeros = Filled(4, 0);
  new_rows.Upload(zeros.data(), zeros.size(), nullptr);
  topk_d.Upload(topk);
  EXPECT_TRUE(m.AppendToken(0, new_rows.get(), nullptr).ok());
  const Status s =
      m.RunLayer(0, topk_d.get<int32_t>(), slots.get<int32_t>(), assembled.get(), nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(m.FinishStep(nullptr).ok());
  return assembled.Download(nullptr);
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

// ---- Error lists, on both backends ----

class ManagerErrorContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
  }
  std::unique_ptr<SparseKVCacheManager> Create(const CacheOptions& o) {
    auto m = SparseKVCacheManager::Create(o, backend_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  // What an error must leave as it was: the pool's pages, the live requests' lengths, the stats.
  struct Snapshot {
    int32_t free_pages;
    std::vector<int32_t> lengths;  // of requests 1..8, -1 for an unknown one
    int32_t live;
    friend bool operator==(const Snapshot&, const Snapshot&) = default;
  };
  static Snapshot Take(SparseKVCacheManager& m) {
    Snapshot s{m.host_pool().free_pages(), {}, 0};
    for (RequestId id = 1; id <= 8; ++id) {
      StatusOr<int32_t> len = m.SequenceLength(id);
      s.lengths.push_back(len.ok() ? *len : -1);
      s.live += len.ok() ? 1 : 0;
    }
    return s;
  }

  std::shared_ptr<Backend> backend_;
};

// Admit: "AlreadyExists for a known id (live or retained); OutOfRange if the length exceeds
// max_context; ResourceExhausted if the hot cache ... are all in use, or the host pool is full
// even after evicting every retained conversation (nothing changes then)".
TEST_P(ManagerErrorContractTest, AdmitErrorsChangeNothing) {
  if (backend_ == nullptr) return;
  CacheOptions o = Tiny(1, 4);
  o.host_capacity_tokens = 40;  // 10 pages
  auto m = Create(o);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(m->AdmitWithPrefix(1, ids, 0, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  ASSERT_EQ(m->Retain(1).value(), 8);             // 2 pages retained
  ASSERT_TRUE(m->Admit(2, 16, 0, nullptr).ok());  // 4 pages
  const Snapshot before = Take(*m);
  EXPECT_EQ(m->Admit(2, 4, 4, nullptr).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(m->Admit(1, 4, 4, nullptr).code(), StatusCode::kAlreadyExists);  // retained
  EXPECT_EQ(m->Admit(3, 30, 3, nullptr).code(), StatusCode::kOutOfRange);
  // 8 pages > 4 free + 2 retained: refused without evicting the retained conversation.
  EXPECT_EQ(m->Admit(3, 32, 0, nullptr).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m->IsRetained(1));
  EXPECT_EQ(Take(*m), before);
  ASSERT_TRUE(m->Admit(3, 16, 0, nullptr).ok());  // 4 pages: fits
  ASSERT_TRUE(m->Admit(4, 8, 0, nullptr).ok());   // 2 more: evicts the retained conversation
  EXPECT_FALSE(m->IsRetained(1));
  const Snapshot full = Take(*m);
  EXPECT_EQ(m->Admit(5, 4, 0, nullptr).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Take(*m), full);
}

// AdmitWithPrefix: "Errors as Admit; nothing changes on error" -- a prefix found in the pool
// is not shared by a refused admission.
TEST_P(ManagerErrorContractTest, AdmitWithPrefixErrorsChangeNothing) {
  if (backend_ == nullptr) return;
  auto m = Create(Tiny(1, 4));
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(m->AdmitWithPrefix(1, ids, 0, nullptr).ok());
  const Bytes prompt = Counting(9);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  const Snapshot before = Take(*m);
  const int32_t shared = m->ReadStats(nullptr).value().pages_shared;
  EXPECT_EQ(m->AdmitWithPrefix(1, ids, 0, nullptr).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(m->AdmitWithPrefix(2, ids, 30, nullptr).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Take(*m), before);
  EXPECT_EQ(m->ReadStats(nullptr).value().pages_shared, shared);
  EXPECT_EQ(m->AdmitWithPrefix(2, ids, 0, nullptr).value(), 8);
}

// IngestPrompt: "NotFound unless the request is live; InvalidArgument for a bad layer or null
// rows; AlreadyExists for a layer ingested already; FailedPrecondition for a retracted request".
TEST_P(ManagerErrorContractTest, IngestPromptErrors) {
  if (backend_ == nullptr) return;
  auto m = Create(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  const Bytes prompt = Counting(8);
  EXPECT_EQ(m->IngestPrompt(1, 0, prompt.data(), nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  EXPECT_EQ(m->IngestPrompt(1, 1, prompt.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->IngestPrompt(1, -1, prompt.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->IngestPrompt(1, 0, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  EXPECT_EQ(m->IngestPrompt(1, 0, prompt.data(), nullptr).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(m->Admit(2, 8, 8, nullptr).ok());
  ASSERT_TRUE(m->Retract(2).ok());
  EXPECT_EQ(m->IngestPrompt(2, 0, prompt.data(), nullptr).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->Release(2).ok());
  EXPECT_EQ(m->IngestPrompt(2, 0, prompt.data(), nullptr).code(), StatusCode::kNotFound);
  // Release: "NotFound for an unknown or released id".
  EXPECT_EQ(m->Release(2).code(), StatusCode::kNotFound);
  EXPECT_EQ(m->Release(7).code(), StatusCode::kNotFound);
}

// IngestIndexerKeys: "FailedPrecondition without indexer keys; NotFound unless the request is
// live; InvalidArgument for a bad layer or null keys; AlreadyExists for a layer ingested
// already". IndexerKeys: "With indexer_key_bytes = 0 every pointer is null".
TEST_P(ManagerErrorContractTest, IngestIndexerKeysErrors) {
  if (backend_ == nullptr) return;
  auto plain = Create(Tiny(1, 8));
  ASSERT_NE(plain, nullptr);
  ASSERT_TRUE(plain->Admit(1, 8, 8, nullptr).ok());
  const Bytes keys = Counting(8);
  EXPECT_EQ(plain->IngestIndexerKeys(1, 0, keys.data(), nullptr).code(),
            StatusCode::kFailedPrecondition);
  const IndexerKeyView none = plain->IndexerKeys(0);
  EXPECT_EQ(none.keys, nullptr);
  EXPECT_EQ(none.page_table, nullptr);
  EXPECT_EQ(none.batch, nullptr);
  CacheOptions o = Tiny(1, 8);
  o.indexer_key_bytes = kStride;
  o.hot_slots = 7;
  o.resident_page_rows = 8;
  auto m = Create(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->IngestIndexerKeys(1, 0, keys.data(), nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  EXPECT_EQ(m->IngestIndexerKeys(1, 1, keys.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->IngestIndexerKeys(1, 0, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->IngestIndexerKeys(1, 0, keys.data(), nullptr).ok());
  EXPECT_EQ(m->IngestIndexerKeys(1, 0, keys.data(), nullptr).code(), StatusCode::kAlreadyExists);
}

// Fork: "NotFound (parent), AlreadyExists (child), FailedPrecondition (parent not fully ingested
// or in the open step), OutOfRange (parent length + max_new_tokens > max_context)".
TEST_P(ManagerErrorContractTest, ForkErrorsChangeNothing) {
  if (backend_ == nullptr) return;
  auto m = Create(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  ASSERT_TRUE(m->Admit(2, 8, 8, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(2, 0, prompt.data(), nullptr).ok());
  const Snapshot before = Take(*m);
  EXPECT_EQ(m->Fork(7, 3, 4, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(m->Fork(2, 1, 4, nullptr).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(m->Fork(1, 3, 4, nullptr).code(), StatusCode::kFailedPrecondition);  // not ingested
  EXPECT_EQ(m->Fork(2, 3, 25, nullptr).code(), StatusCode::kOutOfRange);         // 8 + 25 > 32
  EXPECT_EQ(Take(*m), before);
  ASSERT_TRUE(m->PlanStep({2}, nullptr).ok());
  EXPECT_EQ(m->Fork(2, 3, 4, nullptr).code(), StatusCode::kFailedPrecondition);  // open step
  EXPECT_EQ(m->SequenceLength(3).status().code(), StatusCode::kNotFound);
  RunOneLayer(*m, {0, 1, 0, 1, 0, 1, 0, 1});
  EXPECT_TRUE(m->Fork(2, 3, 4, nullptr).ok());
}

// Retain: "Errors: NotFound, FailedPrecondition (in the open step)"; Release:
// "FailedPrecondition for a request of the open step".
TEST_P(ManagerErrorContractTest, RetainAndReleaseRefuseTheOpenStep) {
  if (backend_ == nullptr) return;
  auto m = Create(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->Retain(1).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->PlanStep({1}, nullptr).ok());
  EXPECT_EQ(m->Retain(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->Release(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->SequenceLength(1).value(), 9);
  RunOneLayer(*m, {0, 1, 0, 1, 0, 1, 0, 1});
  EXPECT_TRUE(m->Release(1).ok());
}

// Promote: "Errors: NotFound; FailedPrecondition without hybrid_residency, for a retracted ...
// request".
TEST_P(ManagerErrorContractTest, PromoteErrors) {
  if (backend_ == nullptr) return;
  auto plain = Create(Tiny(1, 8));
  ASSERT_NE(plain, nullptr);
  ASSERT_TRUE(plain->Admit(1, 8, 8, nullptr).ok());
  EXPECT_EQ(plain->Promote(1, nullptr).code(), StatusCode::kFailedPrecondition);
  CacheOptions o = Tiny(1, 8);
  o.hybrid_residency = true;
  o.hot_slots = 7;
  o.resident_page_rows = 8;
  auto m = Create(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->Promote(1, nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m->Admit(1, 8, 8, nullptr).ok());
  const Bytes prompt = Counting(8);
  ASSERT_TRUE(m->IngestPrompt(1, 0, prompt.data(), nullptr).ok());
  if (m->IsResident(1)) {
    EXPECT_EQ(m->Promote(1, nullptr).code(), StatusCode::kFailedPrecondition);  // resident
  }
  ASSERT_TRUE(m->Retract(1).ok());
  EXPECT_EQ(m->Promote(1, nullptr).code(), StatusCode::kFailedPrecondition);
}

// AdmitSealedPrompt: "NotFound if the seal has ended ...; InvalidArgument for a bad owner or
// max_new_tokens < 0; as Admit otherwise. Nothing changes on error."
TEST_P(ManagerErrorContractTest, AdmitSealedPromptErrorsChangeNothing) {
  if (backend_ == nullptr) return;
  const CacheOptions o = Tiny(1, 8);
  auto pool = HostKVPool::CreateShared(o, 4, backend_);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto made = SparseKVCacheManager::Create(o, backend_, *pool);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  SparseKVCacheManager& m = **made;
  HostKVPool& p = **pool;
  const int32_t owner = p.AcquireOwner().value();
  ASSERT_TRUE(p.Reserve(owner, 8).ok());
  const uint64_t seal = p.Seal(owner, 8).value();
  ASSERT_TRUE(m.Admit(1, 8, 8, nullptr).ok());
  const Snapshot before = Take(m);
  EXPECT_EQ(m.AdmitSealedPrompt(2, owner, seal + 1, 8, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.AdmitSealedPrompt(2, -1, seal, 8, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.AdmitSealedPrompt(2, p.max_owners(), seal, 8, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.AdmitSealedPrompt(2, owner, seal, -1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.AdmitSealedPrompt(1, owner, seal, 8, nullptr).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(m.AdmitSealedPrompt(2, owner, seal, 25, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Take(m), before);
  EXPECT_TRUE(m.AdmitSealedPrompt(2, owner, seal, 8, nullptr).ok());
  EXPECT_EQ(m.SequenceLength(2).value(), 8);
  p.Release(owner);
  p.ReleaseOwner(owner);
}

// PlanStep: "Errors: empty or oversized batch, duplicate, unknown, retracted or not fully
// ingested requests, a request at its reserved length, or a previous step not finished".
TEST_P(ManagerErrorContractTest, PlanStepErrorsPlanNothing) {
  if (backend_ == nullptr) return;
  auto m = Create(Tiny(1, 8));
  ASSERT_NE(m, nullptr);
  const Bytes prompt = Counting(8);
  for (RequestId id : {1, 2, 3}) ASSERT_TRUE(m->Admit(id, 8, id == 3 ? 0 : 8, nullptr).ok());
  for (RequestId id : {1, 3}) ASSERT_TRUE(m->IngestPrompt(id, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->Admit(4, 8, 8, nullptr).ok());
  ASSERT_TRUE(m->IngestPrompt(4, 0, prompt.data(), nullptr).ok());
  ASSERT_TRUE(m->Retract(4).ok());
  const std::vector<std::vector<RequestId>> bad = {{},
                                                   {1, 1},
                                                   {1, 9},
                                                   {1, 2} /* not ingested */,
                                                   {3} /* at its reserved length */,
                                                   {4} /* retracted */,
                                                   {1, 3, 4, 2, 1} /* oversized */};
  for (const std::vector<RequestId>& batch : bad) {
    EXPECT_FALSE(m->PlanStep(batch, nullptr).ok()) << batch.size();
    EXPECT_EQ(m->batch_size(), 0);
  }
  ASSERT_TRUE(m->PlanStep({1}, nullptr).ok());
  EXPECT_FALSE(m->PlanStep({1}, nullptr).ok());  // the step is not finished
  EXPECT_EQ(m->SequenceLength(1).value(), 9);
}

INSTANTIATE_TEST_SUITE_P(Backends, ManagerErrorContractTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace sparsekv
