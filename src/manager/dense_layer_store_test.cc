// DenseLayerStore on the CPU backend, whose device memory the test reads directly: sizes and
// budget refusals by hand, and random lifecycles checked against a model in plain arrays.
#include "manager/dense_layer_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "sparsekv/backend.h"
#include "testing/counting_backend.h"
#include "testing/forwarding_backend.h"

namespace sparsekv {
namespace {

using testing::CountingBackend;

void ExpectOk(const Status& status) { EXPECT_TRUE(status.ok()) << status.ToString(); }

LayerShape Layer(LayerKind kind, int32_t entry_tokens, int32_t row_bytes, int32_t row_stride) {
  LayerShape shape;
  shape.kind = kind;
  shape.entry_tokens = entry_tokens;
  shape.row_bytes = row_bytes;
  shape.row_stride = row_stride;
  return shape;
}

// An offloaded layer (r = 4; the store holds its window only), resident layers of r = 4 and
// r = 128, and a window-only layer, with rows of two sizes and a padded stride.
DenseLayerStoreOptions MixedOptions() {
  DenseLayerStoreOptions o;
  o.geometry.layers = {
      Layer(LayerKind::kOffloaded, 4, 24, 32), Layer(LayerKind::kResident, 4, 24, 32),
      Layer(LayerKind::kResident, 128, 40, 40), Layer(LayerKind::kWindowOnly, 1, 24, 32)};
  o.raw_window = 8;
  o.page_rows = 4;
  o.max_requests = 6;
  o.max_batch = 4;
  o.max_request_tokens = 700;
  o.budget_bytes = int64_t{1} << 30;
  return o;
}

TEST(DenseLayerStoreTest, RequestBytesFollowTheSizingFormula) {
  auto backend = std::make_shared<CountingBackend>();
  auto store = DenseLayerStore::Create(MixedOptions(), backend);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  // 300 tokens: r = 4 has 75 entries -> 19 pages of 4 rows of 32 B; r = 128 has 2 entries -> 1
  // page of 4 rows of 40 B; rings: 8 rows in each layer, 32 + 32 + 40 + 32 B.
  const DenseMemoryUse use = (*store)->RequestBytes(300);
  EXPECT_EQ(use.resident_entries, 19 * 4 * 32 + 1 * 4 * 40);
  EXPECT_EQ(use.windows, 8 * (32 + 32 + 40 + 32));
  EXPECT_EQ(use.tables, 0);
  // 100 tokens: 25 entries of r = 4 in 7 pages; no entry of r = 128 yet, so no page of it.
  EXPECT_EQ((*store)->RequestBytes(100).resident_entries, 7 * 4 * 32);
}

TEST(DenseLayerStoreTest, MemoryByUseIsWhatWasAllocated) {
  auto backend = std::make_shared<CountingBackend>();
  auto store = DenseLayerStore::Create(MixedOptions(), backend);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const int64_t tables = (*store)->MemoryByUse().tables;
  EXPECT_GT(tables, 0);
  EXPECT_EQ(backend->live_device_bytes(), tables);
  ExpectOk((*store)->Admit(1, 0, 300, nullptr));
  ExpectOk((*store)->Admit(2, 0, 700, nullptr));
  const DenseMemoryUse a = (*store)->RequestBytes(300), b = (*store)->RequestBytes(700);
  const DenseMemoryUse use = (*store)->MemoryByUse();
  EXPECT_EQ(use.resident_entries, a.resident_entries + b.resident_entries);
  EXPECT_EQ(use.windows, a.windows + b.windows);
  EXPECT_EQ(use.tables, tables);
  EXPECT_EQ(backend->live_device_bytes(), (*store)->bytes());
  ExpectOk((*store)->Release(1));
  EXPECT_EQ(backend->live_device_bytes(), tables + b.sum());
  EXPECT_EQ((*store)->bytes(), tables + b.sum());
}

TEST(DenseLayerStoreTest, RefusesWhatExceedsTheBudgetNamingTheBytes) {
  DenseLayerStoreOptions o = MixedOptions();
  auto probe = DenseLayerStore::Create(o, std::make_shared<CountingBackend>());
  ASSERT_TRUE(probe.ok());
  const int64_t tables = (*probe)->MemoryByUse().tables;
  const int64_t request = (*probe)->RequestBytes(700).sum();
  o.budget_bytes = tables + request;
  auto backend = std::make_shared<CountingBackend>();
  auto store = DenseLayerStore::Create(o, backend);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ExpectOk((*store)->Admit(1, 0, 700, nullptr));
  const Status refused = (*store)->Admit(2, 0, 1, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  const int64_t need = (*store)->RequestBytes(1).sum();
  EXPECT_NE(refused.message().find("needs " + std::to_string(need) + " bytes"), std::string::npos)
      << refused.ToString();
  EXPECT_NE(refused.message().find("0 of budget_bytes " + std::to_string(o.budget_bytes)),
            std::string::npos)
      << refused.ToString();
  EXPECT_EQ(backend->live_device_bytes(), tables + request);
  // A retracted request's memory is free for another; it cannot come back until there is room.
  std::vector<std::byte> host(request);
  ExpectOk((*store)->Retract(1, host.data(), request, nullptr));
  ExpectOk((*store)->Admit(2, 0, 1, nullptr));
  EXPECT_EQ((*store)->Resume(1, host.data(), request, nullptr).code(),
            StatusCode::kResourceExhausted);
  ExpectOk((*store)->Release(2));
  ExpectOk((*store)->Resume(1, host.data(), request, nullptr));
  EXPECT_EQ(backend->live_device_bytes(), tables + request);
}

TEST(DenseLayerStoreTest, RefusesTablesAboveTheBudget) {
  DenseLayerStoreOptions o = MixedOptions();
  o.budget_bytes = 16;
  auto store = DenseLayerStore::Create(o, std::make_shared<CountingBackend>());
  EXPECT_EQ(store.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(store.status().message().find("budget_bytes 16"), std::string::npos);
}

TEST(DenseLayerStoreTest, RefusesBadOptionsNamingThem) {
  const auto refusal = [](DenseLayerStoreOptions o) {
    return DenseLayerStore::Create(o, std::make_shared<CountingBackend>()).status();
  };
  DenseLayerStoreOptions o = MixedOptions();
  o.max_batch = 7;
  EXPECT_NE(refusal(o).message().find("max_batch 7"), std::string::npos);
  o = MixedOptions();
  o.page_rows = 0;
  EXPECT_NE(refusal(o).message().find("page_rows 0"), std::string::npos);
  o = MixedOptions();
  o.max_request_tokens = 0;
  EXPECT_NE(refusal(o).message().find("max_request_tokens 0"), std::string::npos);
  o = MixedOptions();
  o.raw_window = -1;
  EXPECT_NE(refusal(o).message().find("raw_window -1"), std::string::npos);
  o = MixedOptions();
  o.geometry.layers[2].row_stride = 8;
  EXPECT_NE(refusal(o).message().find("layer 2"), std::string::npos);
}

TEST(DenseLayerStoreTest, RefusesCallsOutOfOrder) {
  auto store = DenseLayerStore::Create(MixedOptions(), std::make_shared<CountingBackend>());
  ASSERT_TRUE(store.ok());
  DenseLayerStore& s = **store;
  EXPECT_EQ(s.Admit(1, 0, 701, nullptr).code(), StatusCode::kInvalidArgument);
  ExpectOk(s.Admit(1, 0, 1, nullptr));
  EXPECT_EQ(s.Admit(1, 0, 1, nullptr).code(), StatusCode::kAlreadyExists);
  const RequestId twice[] = {1, 1};
  EXPECT_EQ(s.PlanStep(twice, nullptr).code(), StatusCode::kInvalidArgument);
  const RequestId one[] = {1};
  ExpectOk(s.PlanStep(one, nullptr));
  EXPECT_EQ(s.PlanStep(one, nullptr).code(), StatusCode::kOutOfRange);
  const RequestId unknown[] = {9};
  EXPECT_EQ(s.PlanStep(unknown, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(s.DenseEntries(3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.DenseEntries(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s.DenseEntries(1).ok());
  EXPECT_EQ(s.Append(1, nullptr, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Append(4, nullptr, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Fork(1, 2, 0, nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> host(*s.RetractedBytes(1));
  EXPECT_EQ(s.Retract(1, host.data(), 1, nullptr).code(), StatusCode::kInvalidArgument);
  ExpectOk(s.Retract(1, host.data(), static_cast<int64_t>(host.size()), nullptr));
  EXPECT_TRUE(s.IsRetracted(1));
  EXPECT_EQ(s.PlanStep(one, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Fork(1, 2, 1, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Retract(1, host.data(), 1 << 20, nullptr).code(), StatusCode::kFailedPrecondition);
  ExpectOk(s.Release(1));
  EXPECT_EQ(s.Release(1).code(), StatusCode::kNotFound);
  EXPECT_EQ(s.Admit(2, 9, 8, nullptr).code(), StatusCode::kInvalidArgument);
  ExpectOk(s.Admit(2, 8, 8, nullptr));
  std::vector<std::byte> rows(8 * 40);
  EXPECT_EQ(s.IngestPrompt(2, 1, nullptr, rows.data(), nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.IngestPrompt(2, 3, nullptr, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  ExpectOk(s.IngestPrompt(2, 3, nullptr, rows.data(), nullptr));
  EXPECT_EQ(s.IngestPrompt(7, 3, nullptr, rows.data(), nullptr).code(), StatusCode::kNotFound);
}

// A step table upload that fails on the device refuses the step and gives no request its token;
// CancelStep takes back the tokens of a step planned before the caller's own plan failed.
TEST(DenseLayerStoreTest, AStepRefusedOnTheDeviceOrCancelledGivesNoToken) {
  auto backend = std::make_shared<testing::FaultyBackend>();
  auto store = DenseLayerStore::Create(MixedOptions(), backend);
  ASSERT_TRUE(store.ok());
  DenseLayerStore& s = **store;
  ExpectOk(s.Admit(1, 0, 8, nullptr));
  ExpectOk(s.Admit(2, 4, 8, nullptr));
  const RequestId batch[] = {1, 2};
  backend->FailCopy(0);
  EXPECT_EQ(s.PlanStep(batch, nullptr).code(), StatusCode::kInternal);
  EXPECT_EQ(*s.Tokens(1), 0);
  EXPECT_EQ(*s.Tokens(2), 4);
  ExpectOk(s.PlanStep(batch, nullptr));
  EXPECT_EQ(*s.Tokens(1), 1);
  EXPECT_EQ(*s.Tokens(2), 5);
  s.CancelStep(batch);
  EXPECT_EQ(*s.Tokens(1), 0);
  EXPECT_EQ(*s.Tokens(2), 4);
  // The next step plans from there: the step table holds the lengths it gives.
  ExpectOk(s.PlanStep(batch, nullptr));
  const StatusOr<RawWindowView> window = s.RawWindow(3);
  ASSERT_TRUE(window.ok());
  EXPECT_EQ(window->Valid(0), 1);
  EXPECT_EQ(window->Valid(1), 5);
}

TEST(DenseLayerStoreTest, WithoutRawWindowThereIsNoRing) {
  DenseLayerStoreOptions o = MixedOptions();
  o.raw_window = 0;
  auto store = DenseLayerStore::Create(o, std::make_shared<CountingBackend>());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->RawWindow(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->RequestBytes(300).windows, 0);
  ExpectOk((*store)->Admit(1, 0, 8, nullptr));
  const RequestId one[] = {1};
  ExpectOk((*store)->PlanStep(one, nullptr));
  std::vector<std::byte> rows(4 * 40);
  ExpectOk((*store)->Append(1, rows.data(), nullptr, nullptr));
  ExpectOk((*store)->Append(3, nullptr, nullptr, nullptr));
}

// Rows of `n` entries of `stride` bytes, entry e filled with the byte `first + e`.
std::vector<std::byte> EntryRows(int32_t first, int32_t n, int32_t stride) {
  std::vector<std::byte> rows(static_cast<size_t>(n) * stride);
  for (int32_t e = 0; e < n; ++e) {
    std::memset(rows.data() + static_cast<size_t>(e) * stride, (first + e) & 0xff, stride);
  }
  return rows;
}

// A prompt that starts with another request's tokens takes that request's first entries of each
// resident layer from its host copy (what Retract wrote, laid out for its own reservation) and
// ingests only the entries past them; the views read both.
TEST(DenseLayerStoreTest, RestoredEntriesComeFromAnotherRequestsHostCopy) {
  auto made = DenseLayerStore::Create(MixedOptions(), std::make_shared<CountingBackend>());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  DenseLayerStore& store = **made;
  const std::vector<std::byte> window = EntryRows(200, 8, 40);
  // Request 1: 300 tokens, reserving 400: 75 entries of layer 1 (r = 4), 2 of layer 2 (r = 128).
  ExpectOk(store.Admit(1, 300, 400, nullptr));
  ExpectOk(store.IngestPrompt(1, 0, nullptr, window.data(), nullptr));
  ExpectOk(store.IngestPrompt(1, 1, EntryRows(0, 75, 32).data(), window.data(), nullptr));
  ExpectOk(store.IngestPrompt(1, 2, EntryRows(100, 2, 40).data(), window.data(), nullptr));
  ExpectOk(store.IngestPrompt(1, 3, nullptr, window.data(), nullptr));
  std::vector<std::byte> host(static_cast<size_t>(*store.RetractedBytes(1)));
  ExpectOk(store.Retract(1, host.data(), static_cast<int64_t>(host.size()), nullptr));

  // Request 2: 290 tokens whose first 256 are request 1's, reserving 300 (another layout).
  ExpectOk(store.Admit(2, 290, 300, nullptr));
  const int64_t bytes = static_cast<int64_t>(host.size());
  EXPECT_EQ(store.RestoreEntries(2, host.data(), bytes, 400, 291, nullptr).code(),
            StatusCode::kInvalidArgument);  // more tokens than request 2 holds
  EXPECT_EQ(store.RestoreEntries(2, host.data(), bytes - 1, 400, 256, nullptr).code(),
            StatusCode::kInvalidArgument);  // short of the copy's bytes
  ExpectOk(store.RestoreEntries(2, host.data(), bytes, 400, 256, nullptr));
  EXPECT_EQ(store.IngestPrompt(2, 1, nullptr, window.data(), nullptr, 291).code(),
            StatusCode::kInvalidArgument);  // kept tokens past the prompt
  EXPECT_EQ(store.IngestPrompt(2, 1, nullptr, window.data(), nullptr, 256).code(),
            StatusCode::kInvalidArgument);  // entries 64-71 to give
  ExpectOk(store.IngestPrompt(2, 0, nullptr, window.data(), nullptr, 256));
  ExpectOk(store.IngestPrompt(2, 1, EntryRows(64, 8, 32).data(), window.data(), nullptr, 256));
  ExpectOk(store.IngestPrompt(2, 2, nullptr, window.data(), nullptr, 256));  // no entry past 256
  ExpectOk(store.IngestPrompt(2, 3, nullptr, window.data(), nullptr, 256));

  const RequestId two[] = {2};
  ExpectOk(store.PlanStep(two, nullptr));
  for (const auto& [layer, count, first] : {std::tuple{1, 72, 0}, std::tuple{2, 2, 100}}) {
    const StatusOr<DenseEntriesView> view = store.DenseEntries(layer);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    ASSERT_EQ(view->seq_len[0] / view->entry_tokens, count);
    for (int32_t e = 0; e < count; ++e) {
      const std::byte* page =
          view->pages[int64_t{view->table_row[0]} * view->pages_per_row + e / view->page_rows];
      const std::vector<std::byte> want = EntryRows(first + e, 1, view->row_stride);
      EXPECT_EQ(std::memcmp(page + int64_t{e % view->page_rows} * view->row_stride, want.data(),
                            want.size()),
                0)
          << "layer " << layer << " entry " << e;
    }
  }
}

// The model: every entry and window row each request was given, in plain arrays.
struct ModelRequest {
  int64_t reserved = 0;
  int32_t tokens = 0;
  std::vector<std::vector<std::vector<std::byte>>> entries;  // [layer][entry] row bytes
  std::vector<std::vector<std::vector<std::byte>>> window;   // [layer][token] row bytes
  bool retracted = false;
  std::vector<std::byte> host;  // what Retract wrote
};

class DenseLayerStoreModelTest : public ::testing::TestWithParam<uint64_t> {};

// Random admit (with a prompt, or none) / step / fork / retract / resume / release under a budget
// that fits about three large requests; after every step, each batch row's entries and window rows
// read through the views are the model's, and the memory figures are what the backend has
// allocated.
TEST_P(DenseLayerStoreModelTest, MatchesAModelInPlainArrays) {
  std::mt19937_64 rng(GetParam());
  DenseLayerStoreOptions o = MixedOptions();
  auto probe = DenseLayerStore::Create(o, std::make_shared<CountingBackend>());
  ASSERT_TRUE(probe.ok());
  o.budget_bytes = (*probe)->MemoryByUse().tables + 3 * (*probe)->RequestBytes(700).sum();
  auto backend = std::make_shared<CountingBackend>();
  auto created = DenseLayerStore::Create(o, backend);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  DenseLayerStore& store = **created;
  const int32_t layers = o.geometry.num_layers();
  const int32_t W = o.raw_window;

  std::map<RequestId, ModelRequest> model;
  RequestId next_id = 1;
  int64_t steps_checked = 0, entries_checked = 0, hca_entries_checked = 0, refusals = 0;
  int64_t forks = 0, resumes = 0, prompts = 0;
  const auto placed_bytes = [&] {
    int64_t sum = store.MemoryByUse().tables;
    for (const auto& [id, m] : model) {
      if (!m.retracted) sum += store.RequestBytes(m.reserved).sum();
    }
    return sum;
  };
  const auto placed = [&] {
    int32_t n = 0;
    for (const auto& [id, m] : model) n += m.retracted ? 0 : 1;
    return n;
  };
  const auto fits = [&](int64_t reserved) {
    return placed() < o.max_requests &&
           placed_bytes() + store.RequestBytes(reserved).sum() <= o.budget_bytes;
  };
  const auto pick = [&](bool retracted) -> RequestId {
    std::vector<RequestId> ids;
    for (const auto& [id, m] : model) {
      if (m.retracted == retracted) ids.push_back(id);
    }
    return ids.empty() ? 0 : ids[rng() % ids.size()];
  };
  const auto new_model = [&](int64_t reserved) {
    ModelRequest m;
    m.reserved = reserved;
    m.entries.resize(layers);
    m.window.resize(layers);
    return m;
  };

  for (int op = 0; op < 1500; ++op) {
    const int kind = static_cast<int>(rng() % 24);
    if (kind == 0) {  // admit
      const int64_t reserved = 1 + static_cast<int64_t>(rng() % 700);
      const int32_t prompt = rng() % 2 ? 0 : static_cast<int32_t>(rng() % (reserved + 1));
      const Status s = store.Admit(next_id, prompt, reserved, nullptr);
      if (fits(reserved)) {
        ASSERT_TRUE(s.ok()) << s.ToString();
        ModelRequest m = new_model(reserved);
        m.tokens = prompt;
        for (int32_t l = 0; l < layers; ++l) {
          const LayerShape& shape = o.geometry.layers[l];
          const int32_t entries =
              shape.kind == LayerKind::kResident ? prompt / shape.entry_tokens : 0;
          const int32_t valid = std::min(prompt, W);
          std::vector<std::byte> entry_rows(entries * shape.row_stride);
          std::vector<std::byte> window_rows(valid * shape.row_stride);
          for (auto& byte : entry_rows) byte = static_cast<std::byte>(rng());
          for (auto& byte : window_rows) byte = static_cast<std::byte>(rng());
          ASSERT_TRUE(
              store.IngestPrompt(next_id, l, entry_rows.data(), window_rows.data(), nullptr).ok());
          for (int32_t e = 0; e < entries; ++e) {
            const std::byte* row = entry_rows.data() + e * shape.row_stride;
            m.entries[l].emplace_back(row, row + shape.row_bytes);
          }
          // Tokens older than the window were never given: the model keeps no bytes for them.
          m.window[l].resize(prompt - valid);
          for (int32_t i = 0; i < valid; ++i) {
            const std::byte* row = window_rows.data() + i * shape.row_stride;
            m.window[l].emplace_back(row, row + shape.row_bytes);
          }
        }
        ++prompts;
        model[next_id] = std::move(m);
      } else {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
        ++refusals;
      }
      ++next_id;
    } else if (kind == 1) {  // fork
      const RequestId parent = pick(false);
      if (parent == 0) continue;
      const ModelRequest& p = model.at(parent);
      const int64_t reserved =
          std::max<int64_t>(1, p.tokens + static_cast<int64_t>(rng() % (701 - p.tokens)));
      const Status s = store.Fork(parent, next_id, reserved, nullptr);
      if (fits(reserved)) {
        ASSERT_TRUE(s.ok()) << s.ToString();
        ++forks;
        ModelRequest child = p;
        child.reserved = reserved;
        model[next_id] = std::move(child);
      } else {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
        ++refusals;
      }
      ++next_id;
    } else if (kind == 2) {  // retract
      const RequestId id = pick(false);
      if (id == 0) continue;
      ModelRequest& m = model.at(id);
      m.host.assign(*store.RetractedBytes(id), std::byte{0});
      ASSERT_TRUE(
          store.Retract(id, m.host.data(), static_cast<int64_t>(m.host.size()), nullptr).ok());
      m.retracted = true;
    } else if (kind == 3) {  // resume
      const RequestId id = pick(true);
      if (id == 0) continue;
      ModelRequest& m = model.at(id);
      const bool room = fits(m.reserved);
      const Status s =
          store.Resume(id, m.host.data(), static_cast<int64_t>(m.host.size()), nullptr);
      if (room) {
        ASSERT_TRUE(s.ok()) << s.ToString();
        m.retracted = false;
        ++resumes;
      } else {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
        ++refusals;
      }
    } else if (kind == 4) {  // release
      const RequestId id = rng() % 2 ? pick(false) : pick(true);
      if (id == 0) continue;
      ASSERT_TRUE(store.Release(id).ok());
      model.erase(id);
    } else {  // a step over up to max_batch requests with room
      std::vector<RequestId> batch;
      for (const auto& [id, m] : model) {
        if (!m.retracted && m.tokens < m.reserved && rng() % 4 != 0) batch.push_back(id);
      }
      std::shuffle(batch.begin(), batch.end(), rng);
      if (batch.size() > static_cast<size_t>(o.max_batch)) batch.resize(o.max_batch);
      ASSERT_TRUE(store.PlanStep(batch, nullptr).ok());
      for (RequestId id : batch) ++model.at(id).tokens;
      for (int32_t l = 0; l < layers; ++l) {
        const LayerShape& shape = o.geometry.layers[l];
        std::vector<std::byte> entry_rows(o.max_batch * shape.row_stride);
        std::vector<std::byte> window_rows(o.max_batch * shape.row_stride);
        for (auto& byte : entry_rows) byte = static_cast<std::byte>(rng());
        for (auto& byte : window_rows) byte = static_cast<std::byte>(rng());
        ASSERT_TRUE(store.Append(l, entry_rows.data(), window_rows.data(), nullptr).ok());
        for (size_t b = 0; b < batch.size(); ++b) {
          ModelRequest& m = model.at(batch[b]);
          const std::byte* e = entry_rows.data() + b * shape.row_stride;
          const std::byte* w = window_rows.data() + b * shape.row_stride;
          if (shape.kind == LayerKind::kResident && m.tokens % shape.entry_tokens == 0) {
            m.entries[l].emplace_back(e, e + shape.row_bytes);
          }
          m.window[l].emplace_back(w, w + shape.row_bytes);
        }
      }
      // Every batch row's entries and window, read through the views.
      for (int32_t l = 0; l < layers; ++l) {
        const LayerShape& shape = o.geometry.layers[l];
        const RawWindowView window = *store.RawWindow(l);
        ASSERT_EQ(*window.batch_size, static_cast<int32_t>(batch.size()));
        for (int32_t b = 0; b < static_cast<int32_t>(batch.size()); ++b) {
          const ModelRequest& m = model.at(batch[b]);
          ASSERT_EQ(window.seq_len[b], m.tokens);
          ASSERT_EQ(window.Valid(b), std::min(m.tokens, W));
          for (int32_t i = 0; i < window.Valid(b); ++i) {
            const auto& want = m.window[l][m.tokens - window.Valid(b) + i];
            ASSERT_EQ(std::memcmp(window.Row(b, i), want.data(), shape.row_bytes), 0)
                << "layer " << l << " row " << b << " window row " << i;
          }
          if (shape.kind != LayerKind::kResident) continue;
          const DenseEntriesView entries = *store.DenseEntries(l);
          ASSERT_EQ(entries.Count(b), static_cast<int32_t>(m.entries[l].size()));
          for (int32_t e = 0; e < entries.Count(b); ++e) {
            ASSERT_EQ(std::memcmp(entries.Entry(b, e), m.entries[l][e].data(), shape.row_bytes), 0)
                << "layer " << l << " row " << b << " entry " << e;
            ++entries_checked;
            if (shape.entry_tokens == 128) ++hca_entries_checked;
          }
        }
      }
      ++steps_checked;
    }
    ASSERT_EQ(store.bytes(), placed_bytes());
    ASSERT_EQ(backend->live_device_bytes(), store.bytes());
  }
  // The runs crossed entries of both cadences, forked and resumed, and met the budget.
  EXPECT_GT(steps_checked, 500);
  EXPECT_GT(entries_checked, 1000);
  EXPECT_GT(refusals, 0);
  EXPECT_GT(hca_entries_checked, 0);
  EXPECT_GT(forks, 0);
  EXPECT_GT(prompts, 0);
  EXPECT_GT(resumes, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, DenseLayerStoreModelTest, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace sparsekv
