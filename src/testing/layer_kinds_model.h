// A random model-checked lifecycle over DeepSeek-V4's layer kinds, for the manager's tests on
// every backend: offloaded layers (an entry per 4 tokens, through the host pool and the hot
// cache), resident layers (an entry per 128 tokens, all on the device) and a window-only layer,
// every layer with a raw window. After every step each offloaded layer's assembled top-k, each
// resident layer's entries and each layer's raw window (read back from the views' device memory)
// are checked against a model that keeps every entry and raw row in plain arrays.
//
// Every row is a function of the request's token ids up to the token it belongs to (an entry's:
// up to the token that completes it), as in a real model, so that a shared prefix's rows are the
// ones the new request would have computed. With sharing, requests are admitted with
// AdmitWithPrefix (random ids, or a retained or live conversation's history, possibly cut, plus
// new tokens), steps carry token ids, and conversations are retained, released and evicted: a
// prefix's resident entries come from the retained conversation's host copy and must read back
// as the model's, like every other entry and window row.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "sparsekv/kernel_views.h"
#include "sparsekv/manager.h"
#include "testing/harness.h"

namespace sparsekv::testing {

// V4Shaped's row stride, raw window, top-k and batch.
constexpr int32_t kStride = 16;
constexpr int32_t kRawWindow = 8;
constexpr int32_t kTopK = 3;
constexpr int32_t kMaxBatch = 3;

// Layers 0 and 2: CSA (offloaded, r = 4); 1 and 3: HCA (resident, r = 128); 4: window-only.
inline CacheOptions V4Shaped(bool hybrid) {
  CacheOptions o;
  for (int32_t l = 0; l < 5; ++l) {
    LayerShape s{kStride, kStride};
    if (l == 0 || l == 2) s.entry_tokens = 4;
    if (l == 1 || l == 3) {
      s.kind = LayerKind::kResident;
      s.entry_tokens = 128;
    }
    if (l == 4) s.kind = LayerKind::kWindowOnly;
    if (l != 0 && l != 2) s.indexer_keys = false;
    o.geometry.layers.push_back(s);
  }
  o.raw_window = kRawWindow;
  o.top_k = kTopK;
  o.hot_slots = 6;
  o.window = 2;
  o.max_requests = 4;
  o.max_host_requests = 5;
  o.max_batch = kMaxBatch;
  o.max_context = 640;
  o.host_page_tokens = 16;
  o.host_capacity_tokens = 1600;  // 400 entries: admissions are sometimes refused
  o.resident_page_rows = 2;
  o.hybrid_residency = hybrid;
  return o;
}

// A whole preset (every layer, its raw window, keys where it has them) at a small size: one
// request of up to 1024 tokens, a hot cache of one top-k.
inline CacheOptions SmallPresetOptions(const ModelPreset& p) {
  CacheOptions o;
  o.geometry = p.geometry();
  o.top_k = o.hot_slots = p.top_k;
  o.indexer_key_bytes = p.indexer_key_bytes;
  o.raw_window = p.raw_window;
  o.host_capacity_tokens = o.max_context = 1024;
  o.max_requests = 1;
  o.host_page_tokens = 64;
  return o;
}

inline int32_t Cadence(const CacheOptions& o, int32_t layer) {
  return o.geometry.layers[layer].entry_tokens;
}
inline bool HasEntries(const CacheOptions& o, int32_t layer) {
  return o.geometry.layers[layer].kind != LayerKind::kWindowOnly;
}

// A request's history: per layer every entry, and every raw row by token (rows before the
// prompt's window were never given and are not checked).
struct History {
  int32_t tokens = 0;
  int32_t reserved = 0;
  bool retracted = false;
  std::vector<int32_t> ids;                   // [tokens]
  std::vector<uint64_t> chain;                // [tokens]: a hash of ids [0, t] (Chain)
  std::vector<std::vector<Bytes>> entries;    // [layer][entry]
  std::vector<std::map<int32_t, Bytes>> raw;  // [layer] token -> row
};

inline Bytes RandomRow(std::mt19937_64& rng) {
  Bytes b(kStride);
  for (std::byte& x : b) x = static_cast<std::byte>(rng() & 0xff);
  return b;
}

// The hash of a token sequence extended by `id` (splitmix64 steps).
inline uint64_t Chain(uint64_t prefix, int32_t id) {
  uint64_t z = prefix + 0x9e3779b97f4a7c15ull + static_cast<uint32_t>(id);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The row of `layer` for the tokens hashed as `chain`: its entry (what 0) or raw row (what 1).
inline Bytes RowOf(uint64_t chain, int32_t layer, int32_t what) {
  std::mt19937_64 rng(Chain(Chain(chain, layer), what));
  return RandomRow(rng);
}

class LayerKindsModel {
 public:
  LayerKindsModel(uint64_t seed, bool hybrid, std::shared_ptr<Backend> backend,
                  bool sharing = false)
      : rng_(seed),
        sharing_(sharing),
        o_(V4Shaped(hybrid)),
        backend_(std::move(backend)),
        entries_(*backend_, kMaxBatch * kStride),
        window_(*backend_, kMaxBatch * kStride),
        topk_(*backend_, kMaxBatch * kTopK * sizeof(int32_t)),
        slots_(*backend_, kMaxBatch * kTopK * sizeof(int32_t)),
        assembled_(*backend_, kMaxBatch * kTopK * kStride) {
    auto m = SparseKVCacheManager::Create(o_, backend_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(*m);
  }

  void Run(int32_t ops) {
    for (int32_t i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
      const uint64_t pick = rng_() % (sharing_ ? 26 : 20);
      if (pick >= 20) {
        if (pick < 22) {
          Retain();
        } else if (pick < 25) {
          Continue();
        } else {
          DropRetained();
        }
      } else if (pick < 4) {
        Admit();
      } else if (pick < 12) {
        Step();
      } else if (pick < 14) {
        Fork();
      } else if (pick < 16) {
        Retract();
      } else if (pick < 18) {
        Resume();
      } else if (pick < 19) {
        Release();
      } else {
        Promote();
      }
    }
  }

  int32_t steps() const { return steps_; }
  // Called in each step before it is planned, with the step's batch; returns whether it planned
  // the step itself (a test of refused plans; a refusal must change nothing the model checks).
  using BeforePlanFn =
      std::function<bool(SparseKVCacheManager& m, const std::vector<RequestId>& batch)>;
  void BeforePlan(BeforePlanFn fn) { before_plan_ = std::move(fn); }

  // Sharing: prompt tokens found by AdmitWithPrefix, and admissions whose prefix held an entry of
  // every resident layer (restored from a retained conversation's copy).
  int64_t hit_tokens() const { return hit_tokens_; }
  int32_t restored() const { return restored_; }

  // Releases every request and conversation; the host pool and the device's entries and windows
  // are empty again.
  void ReleaseAll() {
    for (const auto& [id, h] : model_) ASSERT_TRUE(m_->Release(id).ok());
    model_.clear();
    EXPECT_EQ(m_->EvictRetained(), static_cast<int32_t>(Retained().size()));
    retained_.clear();
    const StatusOr<CacheStats> s = m_->ReadStats(nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->host_pages_used, 0);
    EXPECT_EQ(s->device_memory.resident_entries, 0);
    EXPECT_EQ(s->device_memory.windows, 0);
  }

 private:
  int32_t Layers() const { return o_.geometry.num_layers(); }

  std::vector<RequestId> Live(bool on_device) const {
    std::vector<RequestId> ids;
    for (const auto& [id, h] : model_) {
      if (h.retracted != on_device) ids.push_back(id);
    }
    return ids;
  }
  RequestId Any(const std::vector<RequestId>& ids) { return ids[rng_() % ids.size()]; }

  std::vector<int32_t> RandomIds(int32_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % 4);
    return ids;
  }

  // The history of a prompt of `ids`: every entry and its newest raw rows.
  History PromptHistory(std::vector<int32_t> ids, int32_t new_tokens) const {
    History h;
    h.tokens = static_cast<int32_t>(ids.size());
    h.reserved = h.tokens + new_tokens;
    h.ids = std::move(ids);
    for (int32_t t = 0; t < h.tokens; ++t) {
      h.chain.push_back(Chain(t == 0 ? 0 : h.chain.back(), h.ids[t]));
    }
    h.entries.resize(Layers());
    h.raw.resize(Layers());
    for (int32_t l = 0; l < Layers(); ++l) {
      if (HasEntries(o_, l)) {
        const int32_t r = Cadence(o_, l);
        for (int32_t e = 0; e < h.tokens / r; ++e) {
          h.entries[l].push_back(RowOf(h.chain[(e + 1) * r - 1], l, 0));
        }
      }
      for (int32_t t = h.tokens - std::min(h.tokens, kRawWindow); t < h.tokens; ++t) {
        h.raw[l][t] = RowOf(h.chain[t], l, 1);
      }
    }
    return h;
  }

  // Ingests layer l of `h` from its entries [floor(first_token / r), ...) and its window.
  Status IngestLayer(RequestId id, int32_t l, const History& h, int32_t first_token, bool suffix) {
    Bytes entries, window;
    if (HasEntries(o_, l)) {
      for (size_t e = first_token / Cadence(o_, l); e < h.entries[l].size(); ++e) {
        entries.insert(entries.end(), h.entries[l][e].begin(), h.entries[l][e].end());
      }
    }
    for (const auto& [t, row] : h.raw[l]) window.insert(window.end(), row.begin(), row.end());
    const PromptRows rows{.entries = entries.empty() ? nullptr : entries.data(),
                          .window = window.data()};
    return suffix ? m_->IngestPromptSuffix(id, l, rows, nullptr)
                  : m_->IngestPrompt(id, l, rows, nullptr);
  }

  void Admit() {
    const int32_t prompt = 1 + static_cast<int32_t>(rng_() % 300);
    const int32_t new_tokens = static_cast<int32_t>(rng_() % 300);
    if (sharing_) {
      AdmitWithPrefix(RandomIds(prompt), new_tokens);
      return;
    }
    const RequestId id = next_id_++;
    const Status s = m_->Admit(id, prompt, new_tokens, nullptr);
    if (s.code() == StatusCode::kResourceExhausted) return;
    ASSERT_TRUE(s.ok()) << s.ToString();
    History h = PromptHistory(RandomIds(prompt), new_tokens);
    for (int32_t l = 0; l < Layers(); ++l) {
      const Status ingested = IngestLayer(id, l, h, 0, /*suffix=*/false);
      ASSERT_TRUE(ingested.ok()) << ingested.ToString();
    }
    model_[id] = std::move(h);
  }

  // Sharing: admits a prompt of `ids` with its longest shared prefix, and ingests the rest
  // (alternately the suffix alone and the whole prompt, whose shared entries are skipped).
  void AdmitWithPrefix(std::vector<int32_t> ids, int32_t new_tokens) {
    const RequestId id = next_id_++;
    const StatusOr<int32_t> cached = m_->AdmitWithPrefix(id, ids, new_tokens, nullptr);
    if (cached.status().code() == StatusCode::kResourceExhausted ||
        cached.status().code() == StatusCode::kOutOfRange) {
      return;
    }
    ASSERT_TRUE(cached.ok()) << cached.status().ToString();
    // Whole pages of 16 entries of 4 tokens, less than the prompt.
    const int32_t page_tokens = o_.host_page_tokens * 4;
    ASSERT_TRUE(*cached % page_tokens == 0 && *cached < static_cast<int32_t>(ids.size()))
        << "cached " << *cached << " of " << ids.size();
    hit_tokens_ += *cached;
    restored_ += *cached >= 128;
    History h = PromptHistory(std::move(ids), new_tokens);
    const bool suffix = rng_() % 2 == 0;
    for (int32_t l = 0; l < Layers(); ++l) {
      const Status ingested = IngestLayer(id, l, h, suffix ? *cached : 0, suffix);
      ASSERT_TRUE(ingested.ok()) << ingested.ToString();
    }
    model_[id] = std::move(h);
  }

  // Sharing: a continuation of a retained conversation (which the manager may have evicted since)
  // or of a live request: its history, possibly cut, plus new tokens.
  void Continue() {
    std::vector<int32_t> ids;
    const std::vector<RequestId> retained = Retained();
    if (!retained.empty() && (model_.empty() || rng_() % 4 != 0)) {
      ids = retained_.at(Any(retained));
    } else if (!model_.empty()) {
      auto it = model_.begin();
      std::advance(it, rng_() % model_.size());
      ids = it->second.ids;
    } else {
      return;
    }
    if (rng_() % 3 == 0) ids.resize(1 + rng_() % ids.size());
    const std::vector<int32_t> added = RandomIds(static_cast<int32_t>(rng_() % 40));
    ids.insert(ids.end(), added.begin(), added.end());
    if (ids.size() > 600) ids.resize(600);
    AdmitWithPrefix(std::move(ids), static_cast<int32_t>(rng_() % 40));
  }

  // The retained conversations the manager still holds (it may have evicted some).
  std::vector<RequestId> Retained() {
    std::erase_if(retained_, [&](const auto& c) { return !m_->IsRetained(c.first); });
    std::vector<RequestId> ids;
    for (const auto& [id, tokens] : retained_) ids.push_back(id);
    return ids;
  }

  void Retain() {
    if (model_.empty()) return;
    auto it = model_.begin();
    std::advance(it, rng_() % model_.size());
    const RequestId id = it->first;
    const StatusOr<int32_t> kept = m_->Retain(id);
    ASSERT_TRUE(kept.ok()) << kept.status().ToString();
    ASSERT_TRUE(*kept % (o_.host_page_tokens * 4) == 0 && *kept <= it->second.tokens)
        << "retained " << *kept << " of " << it->second.tokens << " tokens";
    EXPECT_EQ(m_->IsRetained(id), *kept > 0);
    if (*kept > 0) retained_[id] = it->second.ids;
    model_.erase(it);
  }

  void DropRetained() {
    const std::vector<RequestId> ids = Retained();
    if (rng_() % 4 == 0) {
      EXPECT_EQ(m_->EvictRetained(), static_cast<int32_t>(ids.size()));
      retained_.clear();
    } else if (!ids.empty()) {
      const RequestId id = Any(ids);
      ASSERT_TRUE(m_->Release(id).ok());
      EXPECT_FALSE(m_->IsRetained(id));
      retained_.erase(id);
    }
  }

  void Fork() {
    std::vector<RequestId> ids = Live(true);
    if (ids.empty()) return;
    const RequestId parent = Any(ids), child = next_id_++;
    const int32_t new_tokens = static_cast<int32_t>(rng_() % 100);
    const Status s = m_->Fork(parent, child, new_tokens, nullptr);
    if (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kOutOfRange) return;
    ASSERT_TRUE(s.ok()) << s.ToString();
    History h = model_.at(parent);
    h.reserved = h.tokens + new_tokens;
    model_[child] = std::move(h);
  }

  void Retract() {
    std::vector<RequestId> ids = Live(true);
    if (ids.empty()) return;
    const RequestId id = Any(ids);
    ASSERT_TRUE(m_->Retract(id).ok());
    model_.at(id).retracted = true;
  }

  void Resume() {
    std::vector<RequestId> ids = Live(false);
    if (ids.empty()) return;
    const RequestId id = Any(ids);
    const Status s = m_->Resume(id, nullptr);
    if (s.code() == StatusCode::kResourceExhausted) return;
    ASSERT_TRUE(s.ok()) << s.ToString();
    model_.at(id).retracted = false;
  }

  void Release() {
    if (model_.empty()) return;
    std::vector<RequestId> ids;
    for (const auto& [id, h] : model_) ids.push_back(id);
    const RequestId id = Any(ids);
    ASSERT_TRUE(m_->Release(id).ok());
    model_.erase(id);
  }

  void Promote() {
    std::vector<RequestId> ids = Live(true);
    if (ids.empty() || !o_.hybrid_residency) return;
    const RequestId id = Any(ids);
    if (m_->IsResident(id)) return;
    const Status s = m_->Promote(id, nullptr);
    // Forked children stay in hot-cache mode; a full device leaves the request where it is.
    ASSERT_TRUE(s.ok() || s.code() == StatusCode::kResourceExhausted ||
                s.code() == StatusCode::kFailedPrecondition)
        << s.ToString();
  }

  void Step() {
    std::vector<RequestId> batch;
    for (RequestId id : Live(true)) {
      const History& h = model_.at(id);
      if (h.tokens < h.reserved && batch.size() < kMaxBatch && rng_() % 4 != 0) batch.push_back(id);
    }
    if (batch.empty()) return;
    // Each request's new token: its id extends the chain its rows are a function of.
    std::vector<int32_t> ids;
    for (RequestId id : batch) {
      History& h = model_.at(id);
      ids.push_back(RandomIds(1)[0]);
      h.chain.push_back(Chain(h.chain.empty() ? 0 : h.chain.back(), ids.back()));
      h.ids.push_back(ids.back());
      ++h.tokens;
    }
    const bool planned_by_test = before_plan_ != nullptr && before_plan_(*m_, batch);
    if (::testing::Test::HasFatalFailure()) return;
    if (!planned_by_test) {
      const Status planned =
          sharing_ ? m_->PlanStep(batch, ids, nullptr) : m_->PlanStep(batch, nullptr);
      ASSERT_TRUE(planned.ok()) << planned.ToString();
    }
    ++steps_;
    const int32_t n = static_cast<int32_t>(batch.size());
    for (int32_t l = 0; l < Layers(); ++l) {
      // The step's rows: entry b of the batch (kept only if the token completes one) and raw row.
      Bytes entries(kMaxBatch * kStride), window(kMaxBatch * kStride);
      for (int32_t b = 0; b < n; ++b) {
        History& h = model_.at(batch[b]);
        const Bytes e = RowOf(h.chain.back(), l, 0), w = RowOf(h.chain.back(), l, 1);
        std::memcpy(entries.data() + b * kStride, e.data(), kStride);
        std::memcpy(window.data() + b * kStride, w.data(), kStride);
        if (HasEntries(o_, l) && h.tokens % Cadence(o_, l) == 0) h.entries[l].push_back(e);
        h.raw[l][h.tokens - 1] = w;
      }
      const Status appended =
          m_->AppendToken(l, StepRows{.entries = entries.data(), .window = window.data()}, nullptr);
      ASSERT_TRUE(appended.ok()) << appended.ToString();
      if (o_.geometry.layers[l].kind == LayerKind::kOffloaded) {
        CheckOffloaded(l, batch);
      } else if (o_.geometry.layers[l].kind == LayerKind::kResident) {
        CheckResident(l, batch);
      }
      CheckWindow(l, batch);
    }
    const Status finished = m_->FinishStep(nullptr);
    ASSERT_TRUE(finished.ok()) << finished.ToString();
  }

  // A random top-k of each row's entries is assembled as the model holds them.
  void CheckOffloaded(int32_t l, const std::vector<RequestId>& batch) {
    std::vector<int32_t> topk(kMaxBatch * kTopK, -1);
    for (size_t b = 0; b < batch.size(); ++b) {
      const int32_t count = static_cast<int32_t>(model_.at(batch[b]).entries[l].size());
      for (int32_t k = 0; k < kTopK; ++k) {
        const int32_t e = count > 0 ? static_cast<int32_t>(rng_() % count) : -1;
        const auto row = topk.begin() + b * kTopK;
        // Distinct entries (a repeated one is skipped: ResolveView); some padding.
        if (rng_() % 5 != 0 && std::find(row, row + k, e) == row + k) topk[b * kTopK + k] = e;
      }
    }
    topk_.Upload(topk.data(), topk.size() * sizeof(int32_t), nullptr);
    const Status run =
        m_->RunLayer(l, topk_.get<int32_t>(), slots_.get<int32_t>(), assembled_.get(), nullptr);
    ASSERT_TRUE(run.ok()) << run.ToString();
    const Bytes assembled = assembled_.Download(nullptr);
    for (size_t b = 0; b < batch.size(); ++b) {
      for (int32_t k = 0; k < kTopK; ++k) {
        const int32_t e = topk[b * kTopK + k];
        if (e < 0) continue;
        ASSERT_EQ(std::memcmp(assembled.data() + (b * kTopK + k) * kStride,
                              model_.at(batch[b]).entries[l][e].data(), kStride),
                  0)
            << "layer " << l << " request " << batch[b] << " entry " << e;
      }
    }
  }

  // `bytes` of device (or host) memory at `p`, read back.
  Bytes Read(const void* p, size_t bytes) {
    Bytes out(bytes);
    EXPECT_TRUE(backend_->CopyAsync(out.data(), p, bytes, nullptr).ok());
    EXPECT_TRUE(backend_->Synchronize(nullptr).ok());
    return out;
  }
  template <typename T>
  T ReadOne(const T* p) {
    T value;
    std::memcpy(&value, Read(p, sizeof(T)).data(), sizeof(T));
    return value;
  }

  // DenseEntriesView::Count and Entry, read from device memory on the host.
  void CheckResident(int32_t l, const std::vector<RequestId>& batch) {
    const StatusOr<DenseEntriesView> view = m_->DenseEntries(l);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    ASSERT_EQ(ReadOne(view->batch_size), static_cast<int32_t>(batch.size()));
    for (size_t b = 0; b < batch.size(); ++b) {
      const History& h = model_.at(batch[b]);
      const int32_t row = ReadOne(view->table_row + b);
      const int32_t count = ReadOne(view->seq_len + b) / view->entry_tokens;
      ASSERT_EQ(count, static_cast<int32_t>(h.entries[l].size()));
      for (int32_t e = 0; e < count; ++e) {
        const std::byte* page =
            ReadOne(view->pages + int64_t{row} * view->pages_per_row + e / view->page_rows);
        const Bytes entry = Read(page + int64_t{e % view->page_rows} * view->row_stride, kStride);
        ASSERT_EQ(entry, h.entries[l][e])
            << "layer " << l << " request " << batch[b] << " entry " << e;
      }
    }
  }

  // RawWindowView::Valid and Row, read from device memory on the host.
  void CheckWindow(int32_t l, const std::vector<RequestId>& batch) {
    const StatusOr<RawWindowView> view = m_->RawWindow(l);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (size_t b = 0; b < batch.size(); ++b) {
      const History& h = model_.at(batch[b]);
      const int32_t row = ReadOne(view->table_row + b);
      const int32_t tokens = ReadOne(view->seq_len + b);
      ASSERT_EQ(tokens, h.tokens);
      const int32_t valid = std::min(tokens, view->raw_window);
      ASSERT_EQ(valid, std::min(h.tokens, kRawWindow));
      const std::byte* ring = ReadOne(view->rings + row);
      for (int32_t i = 0; i < valid; ++i) {
        const int32_t token = tokens - valid + i;
        const Bytes raw =
            Read(ring + int64_t{token % view->raw_window} * view->row_stride, kStride);
        ASSERT_EQ(raw, h.raw[l].at(token))
            << "layer " << l << " request " << batch[b] << " window row " << i;
      }
    }
  }

  std::mt19937_64 rng_;
  bool sharing_;
  CacheOptions o_;
  std::shared_ptr<Backend> backend_;
  // The step's rows, top-k, slots and assembled rows, in the backend's device memory.
  DeviceBuffer entries_, window_, topk_, slots_, assembled_;
  std::unique_ptr<SparseKVCacheManager> m_;
  std::map<RequestId, History> model_;
  std::map<RequestId, std::vector<int32_t>> retained_;  // sharing: conversations' token ids
  RequestId next_id_ = 1;
  int32_t steps_ = 0;
  BeforePlanFn before_plan_;
  int64_t hit_tokens_ = 0;
  int32_t restored_ = 0;
};

}  // namespace sparsekv::testing
