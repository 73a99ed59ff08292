#include "testing/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>

#include "sparsekv/hot_cache.h"

namespace sparsekv::testing {

CacheOptions SmallOptions() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(1, 8);
  o.top_k = 2;
  o.hot_slots = 3;
  o.window = 1;
  o.host_capacity_tokens = 64;
  o.max_requests = 2;
  o.max_context = 32;
  o.host_page_tokens = 8;
  return o;
}

CacheOptions RandomSmallOptions(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  auto pick = [&](std::initializer_list<int32_t> v) { return *(v.begin() + rng() % v.size()); };
  CacheOptions o;
  // Odd and padded rows, an indexer-sized row, a 16-B-aligned row.
  const std::vector<LayerShape> shapes = {{7, 8}, {24, 32}, {132, 132}, {48, 48}, {3, 3}};
  const int32_t layers = 1 + static_cast<int32_t>(rng() % 3);
  for (int32_t l = 0; l < layers; ++l) o.geometry.layers.push_back(shapes[rng() % shapes.size()]);
  o.top_k = pick({1, 5, 16, 24});
  o.hot_slots = o.top_k * pick({1, 2, 3}) + pick({0, 0, 1, 7});
  o.window = pick({1, 1, 3});
  o.host_page_tokens = pick({4, 16});
  o.max_requests = pick({2, 5});
  o.max_host_requests = o.max_requests + pick({0, 2});
  o.max_batch = 1 + static_cast<int32_t>(rng() % o.max_requests);
  o.max_context = 120;
  // Tight enough that admission sometimes fails for lack of pages.
  o.host_capacity_tokens = int64_t{o.max_host_requests} * pick({40, 80, 120});
  // Each replacement policy for a third of the seeds (from the seed, so that the draws above stay
  // as they were).
  o.eviction = static_cast<EvictionPolicy>(seed % 3);
  return o;
}

CacheOptions RandomOverlapOptions(uint64_t seed, int32_t prefetch) {
  CacheOptions o = RandomSmallOptions(seed);
  std::mt19937_64 rng(seed * 104729 + 3);
  // 2..4 layers, so that groups (of 2 or 3 layers, the last one maybe shorter) occur.
  while (o.geometry.num_layers() < 2 + static_cast<int32_t>(seed % 3)) {
    o.geometry.layers.push_back(o.geometry.layers.back());
  }
  o.layers_per_index = 1 + static_cast<int32_t>(rng() % std::min(3, o.geometry.num_layers()));
  o.share_repeated_positions = rng() % 2 == 0;
  o.max_prefetch = std::min(o.hot_slots, prefetch + static_cast<int32_t>(rng() % 3));
  // Half the seeds copy with a grid of 1-4 blocks, so that a thread walks many rows.
  o.copy_blocks = rng() % 2 == 0 ? 0 : 1 + static_cast<int32_t>(rng() % 4);
  // A third of the seeds copy misses in the resolve from batch 1-3 on; every copy strategy.
  o.fused_copy_min_batch = rng() % 3 == 0 ? 1 + static_cast<int32_t>(rng() % 3) : 0;
  o.copy_strategy = static_cast<CopyStrategy>(rng() % 4);
  o.prefetch_copy_blocks = static_cast<int32_t>(rng() % 3);
  // A third of the seeds copy by chunks of 1-3 batch rows.
  o.copy_chunk_rows = rng() % 3 == 0 ? 1 + static_cast<int32_t>(rng() % 3) : 0;
  return o;
}

namespace {

// A device budget of `blocks` blocks of `o`'s hot slots and the indexer keys of max_requests
// requests of max_context positions (none without keys).
int64_t BudgetFor(const CacheOptions& o, int32_t blocks) {
  const int64_t page_bytes = o.resident_page_rows * o.geometry.token_stride_bytes();
  const int64_t block_pages =
      (o.hot_slots + o.window + o.resident_page_rows - 1) / o.resident_page_rows;
  int64_t budget =
      blocks * (block_pages * page_bytes +
                HotCache::StateBytesOf(o.offloaded_index_groups(), o.hot_slots, ReplacementOf(o)) +
                block_pages * int64_t{sizeof(int32_t)});
  if (o.indexer_key_bytes > 0) {
    const int32_t keys_per_page =
        o.resident_page_rows * o.geometry.layers[0].row_stride / o.indexer_key_bytes;
    budget += int64_t{o.max_requests} * ((o.max_context + keys_per_page - 1) / keys_per_page) *
              page_bytes;
  }
  return budget;
}

}  // namespace

CacheOptions RandomHybridOptions(uint64_t seed) {
  CacheOptions o = RandomSmallOptions(seed);
  std::mt19937_64 rng(seed * 6007 + 11);
  o.hybrid_residency = true;
  o.resident_page_rows = std::min(o.hot_slots + o.window, 1 + static_cast<int32_t>(rng() % 9));
  // Half the seeds keep indexer keys too (one row shape for every layer, as they need), of up to
  // a page's worth each.
  const bool keys = rng() % 2 == 0;
  if (keys) {
    const LayerShape shape =
        o.geometry.layers[0].row_stride % 4 == 0 ? o.geometry.layers[0] : LayerShape{24, 32};
    for (LayerShape& l : o.geometry.layers) l = shape;
    const int32_t page = o.resident_page_rows * shape.row_stride;
    o.indexer_key_bytes = 4 * (1 + static_cast<int32_t>(rng() % std::max(1, page / 4)));
  }
  // A budget of max_requests blocks and a few more, so that some requests are resident and
  // admissions demote others, and the keys of max_requests requests; half the seeds let the
  // library choose the slots.
  const int32_t blocks = o.max_requests + static_cast<int32_t>(rng() % 4);
  o.device_budget_bytes = BudgetFor(o, blocks);
  if (rng() % 2 == 0) o.hot_slots = 0;
  o.fused_copy_min_batch = rng() % 3 == 0 ? 1 + static_cast<int32_t>(rng() % 3) : 0;
  return o;
}

CacheOptions RandomGroupedOptions(uint64_t seed, int32_t prefetch) {
  CacheOptions o = RandomOverlapOptions(seed, prefetch);
  std::mt19937_64 rng(seed * 15485863 + 5);
  o.layers_per_index = 1;
  // One row for every layer, a multiple of 4 (as indexer keys need).
  const std::vector<LayerShape> rows = {{24, 32}, {132, 132}, {48, 48}};
  const int32_t layers = seed % 2 == 0 ? 6 : 10;
  o.geometry.layers.assign(layers, rows[rng() % rows.size()]);
  // A second top-k for every other group, within the hot slots.
  if (o.top_k + 3 > o.hot_slots) o.hot_slots = o.top_k + 3 + static_cast<int32_t>(rng() % 4);
  const int32_t other_top_k = rng() % 2 == 0 ? o.top_k + 3 : std::max(1, o.top_k / 2);
  o.max_prefetch = std::min(o.max_prefetch, o.hot_slots);
  int32_t group = -1;
  for (int32_t l = 0; l < layers; ++l) {
    LayerShape& shape = o.geometry.layers[l];
    shape.index_group = l <= 2 ? l : 2 + (l - 2) / 4 * 4;
    group += shape.index_group == l;
    shape.top_k = group % 2 == 1 ? other_top_k : 0;
    shape.indexer_keys = shape.index_group == l;
  }
  if (seed % 2 == 0 || seed % 3 == 0) {
    o.resident_page_rows = std::min(o.hot_slots + o.window, 1 + static_cast<int32_t>(rng() % 9));
  }
  if (seed % 2 == 0) {
    const int32_t page = o.resident_page_rows * o.geometry.layers[0].row_stride;
    o.indexer_key_bytes = 4 * (1 + static_cast<int32_t>(rng() % std::max(1, page / 4)));
  }
  if (seed % 3 == 0) {
    o.hybrid_residency = true;
    o.device_budget_bytes = BudgetFor(o, o.max_requests + static_cast<int32_t>(rng() % 4));
  }
  return o;
}

CacheOptions RandomCadenceOptions(uint64_t seed, int32_t prefetch, int32_t entry_tokens) {
  CacheOptions o =
      seed % 4 < 2 ? RandomOverlapOptions(seed, prefetch) : RandomGroupedOptions(seed, prefetch);
  for (LayerShape& l : o.geometry.layers) l.entry_tokens = entry_tokens;
  return o;
}

std::vector<uint64_t> TestSeeds(int count) {
  if (const char* s = std::getenv("SPARSEKV_TEST_SEED")) return {std::stoull(s)};
  std::vector<uint64_t> seeds;
  for (int i = 1; i <= count; ++i) seeds.push_back(i);
  return seeds;
}

RandomWorkload::RandomWorkload(const CacheOptions& options, uint64_t seed,
                               std::vector<SparseKVCacheManager*> managers, Shape shape)
    : options_(options),
      groups_(options),
      cadence_(options.geometry.layers[0].entry_tokens),
      shape_(shape),
      rng_(seed),
      managers_(std::move(managers)),
      model_(options.geometry),
      shared_snapshots_(managers_.size()),
      entries_(options.geometry.num_layers(), 0) {
  RunMode run = shape.run;
  run.seed = seed;
  for (SparseKVCacheManager* m : managers_) {
    drivers_.push_back(std::make_unique<StepDriver>(*m, nullptr, run));
  }
}

void RandomWorkload::ExpectAll(const char* what,
                               const std::function<Status(SparseKVCacheManager&)>& op,
                               StatusCode want) {
  for (SparseKVCacheManager* m : managers_) {
    const Status s = op(*m);
    EXPECT_EQ(s.code(), want) << what << " on " << m->backend().name() << ": " << s.ToString();
  }
}

int RandomWorkload::Run(int ops) {
  for (int i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
    const uint64_t r = rng_() % 100;
    if (shape_.sharing) {
      if (r < 8) {
        Admit();
      } else if (r < 16) {
        Continue();
      } else if (r < 22) {
        Fork();
      } else if (r < 70) {
        Step();
      } else if (r < 76) {
        Release();
      } else if (r < 84) {
        Retain();
      } else if (r < 88) {
        RetractOrResume();
      } else if (r < 92) {
        DropRetained();
      } else {
        BadInput();
      }
      CheckPool();
      continue;
    }
    if (shape_.deferred_ingest && !ingesting_.empty() && r % 8 == 0) {
      IngestDeferred();
    } else if (r < 15) {
      Admit();
    } else if (r < 80) {
      Step();
    } else if (r < 88) {
      Release();
    } else if (r < 94) {
      RetractOrResume();
    } else {
      BadInput();
    }
  }
  return steps_;
}

void RandomWorkload::Admit() {
  if (shape_.sharing) {
    const int32_t prompt = 1 + static_cast<int32_t>(rng_() % shape_.max_prompt);
    AdmitTokens(RandomTokens(prompt), static_cast<int32_t>(rng_() % shape_.max_new));
    return;
  }
  const RequestId id = next_id_++;
  const int32_t prompt = 1 + static_cast<int32_t>(rng_() % shape_.max_prompt);
  const int32_t max_new = static_cast<int32_t>(rng_() % shape_.max_new);
  std::vector<Status> results;
  for (SparseKVCacheManager* m : managers_)
    results.push_back(m->Admit(id, prompt, max_new, nullptr));
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), results[0].code()) << "backends disagree on Admit: " << s.ToString();
  }
  if (!results[0].ok()) {
    // Exhaustion and over-long requests are errors that change nothing.
    const StatusCode c = results[0].code();
    EXPECT_TRUE(c == StatusCode::kResourceExhausted || c == StatusCode::kOutOfRange)
        << results[0].ToString();
    return;
  }
  Ingesting a{.id = id, .prompt = prompt, .max_new = max_new, .rows = {}, .order = {}, .next = 0};
  for (const LayerShape& l : options_.geometry.layers) {
    a.rows.push_back(RandomRows(rng_, prompt / cadence_, l.row_stride));
  }
  // Ingest layers in a random order; a step may not include the request before all are in.
  a.order.resize(options_.geometry.num_layers());
  std::iota(a.order.begin(), a.order.end(), 0);
  std::shuffle(a.order.begin(), a.order.end(), rng_);
  const size_t now =
      shape_.deferred_ingest && rng_() % 3 != 0 ? rng_() % a.order.size() : a.order.size();
  Ingest(std::move(a), now);
}

void RandomWorkload::IngestKeys(RequestId id, int32_t layer, const std::byte* rows,
                                int32_t prompt) {
  if (options_.indexer_key_bytes == 0) return;
  if (!options_.geometry.layers[layer].indexer_keys) {
    ExpectAll(
        "IngestIndexerKeys of a layer without keys",
        [&](SparseKVCacheManager& m) { return m.IngestIndexerKeys(id, layer, rows, nullptr); },
        StatusCode::kInvalidArgument);
    return;
  }
  const Bytes keys =
      KeysOf(rows, prompt, options_.geometry.layers[layer], options_.indexer_key_bytes);
  ExpectAll(
      "IngestIndexerKeys",
      [&](SparseKVCacheManager& m) { return m.IngestIndexerKeys(id, layer, keys.data(), nullptr); },
      StatusCode::kOk);
  ExpectAll(
      "IngestIndexerKeys twice",
      [&](SparseKVCacheManager& m) { return m.IngestIndexerKeys(id, layer, keys.data(), nullptr); },
      StatusCode::kAlreadyExists);
}

void RandomWorkload::IngestDeferred() {
  const size_t i = rng_() % ingesting_.size();
  Ingesting a = std::move(ingesting_[i]);
  ingesting_.erase(ingesting_.begin() + static_cast<std::ptrdiff_t>(i));
  Ingest(std::move(a), 1);
}

void RandomWorkload::Ingest(Ingesting a, size_t layers) {
  const RequestId id = a.id;
  for (size_t n = 0; n < layers && a.next < a.order.size(); ++n, ++a.next) {
    if (a.next == 1) {
      const std::vector<RequestId> batch = {id};
      ExpectAll(
          "PlanStep before full ingest",
          [&](SparseKVCacheManager& m) { return m.PlanStep(batch, nullptr); },
          StatusCode::kFailedPrecondition);
    }
    const int32_t l = a.order[a.next];
    ExpectAll(
        "IngestPrompt",
        [&](SparseKVCacheManager& m) { return m.IngestPrompt(id, l, a.rows[l].data(), nullptr); },
        StatusCode::kOk);
    IngestKeys(id, l, a.rows[l].data(), a.prompt / cadence_);
  }
  if (a.next < a.order.size()) {
    ingesting_.push_back(std::move(a));
    return;
  }
  ExpectAll(
      "IngestPrompt twice",
      [&](SparseKVCacheManager& m) {
        return m.IngestPrompt(id, a.order[0], a.rows[a.order[0]].data(), nullptr);
      },
      StatusCode::kAlreadyExists);
  model_.Add(id, a.rows, a.prompt / cadence_);
  live_[id] = Req{a.prompt + a.max_new, false,
                  std::vector<std::vector<int32_t>>(options_.geometry.num_layers())};
  live_[id].length = a.prompt;
}

std::vector<int32_t> RandomWorkload::RandomTopKRow(RequestId id, int32_t layer, int32_t seq_len) {
  const int32_t top_k = groups_.LayerTopK(layer);
  std::vector<int32_t> row(top_k);
  const std::vector<int32_t>& last = live_[id].last_topk[layer];
  for (int32_t k = 0; k < top_k; ++k) {
    const uint64_t r = rng_() % 100;
    if (seq_len == 0) {  // no entry yet (fewer tokens than entry_tokens): nothing in range
      row[k] = r < 50 ? kPaddingPosition : static_cast<int32_t>(rng_() % 1000);
      continue;
    }
    if (r < 40 && !last.empty()) {
      row[k] = last[rng_() % last.size()];  // temporal locality: hits
    } else if (r < 75) {
      row[k] = static_cast<int32_t>(rng_() % seq_len);
    } else if (r < 82) {
      row[k] = seq_len - 1 - static_cast<int32_t>(rng_() % std::min(seq_len, 4));  // window
    } else if (r < 88) {
      row[k] = kPaddingPosition;
    } else if (r < 93 && k > 0) {
      row[k] = row[rng_() % k];  // duplicate (or a repeated -1)
    } else if (r < 97) {
      row[k] = seq_len + static_cast<int32_t>(rng_() % 1000);  // past the end
    } else {
      row[k] = -2 - static_cast<int32_t>(rng_() % 100000);
    }
  }
  // Full-hit and full-miss rows now and then.
  if (rng_() % 20 == 0 && last.size() == row.size()) row = last;
  return row;
}

void RandomWorkload::Step() {
  std::vector<RequestId> ready;
  for (const auto& [id, r] : live_) {
    if (!r.retracted && r.length < r.reserved) ready.push_back(id);
  }
  if (ready.empty()) return;
  std::shuffle(ready.begin(), ready.end(), rng_);
  const size_t n = 1 + rng_() % std::min<size_t>(ready.size(), options_.effective_max_batch());
  const std::vector<RequestId> batch(ready.begin(), ready.begin() + n);

  std::vector<int32_t> token_ids;
  if (shape_.sharing) {
    for (RequestId id : batch) {
      token_ids.push_back(RandomTokens(1)[0]);
      live_[id].tokens.push_back(token_ids.back());
    }
  }
  std::vector<Bytes> new_rows;
  std::vector<std::vector<int32_t>> topk(options_.geometry.num_layers());
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    const int32_t stride = options_.geometry.layers[l].row_stride;
    if (shape_.sharing) {
      new_rows.emplace_back();
      for (RequestId id : batch) {
        const Bytes row = RowOf(live_[id].tokens, l);
        new_rows.back().insert(new_rows.back().end(), row.begin(), row.end());
      }
    } else {
      new_rows.push_back(RandomRows(rng_, static_cast<int64_t>(n), stride));
    }
    // Only the rows whose token completes an entry append.
    for (size_t b = 0; b < n; ++b) {
      if ((live_[batch[b]].length + 1) % cadence_ == 0) {
        model_.Append(batch[b], l, new_rows[l].data() + b * stride);
      }
    }
    if (!groups_.Leads(l)) {
      topk[l] = topk[l - 1];  // the group's top-k
      continue;
    }
    for (size_t b = 0; b < n; ++b) {
      const std::vector<int32_t> row = RandomTopKRow(batch[b], l, Length(batch[b]));
      topk[l].insert(topk[l].end(), row.begin(), row.end());
    }
  }
  for (RequestId id : batch) ++live_[id].length;
  std::vector<std::vector<LayerResult>> results;
  for (auto& d : drivers_) results.push_back(d->Step(batch, new_rows, topk, token_ids));
  if (options_.indexer_key_bytes > 0) {
    for (size_t i = 0; i < managers_.size(); ++i) {
      EXPECT_EQ(CheckKeys(model_, *managers_[i], batch, drivers_[i]->stream()), 0)
          << "indexer keys at step " << steps_ << " on " << managers_[i]->backend().name();
    }
  }
  ++steps_;
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    const int32_t top_k = groups_.LayerTopK(l);
    entries_[l] += n * top_k;
    for (size_t b = 0; b < n; ++b) {
      auto first = topk[l].begin() + b * top_k;
      std::vector<int32_t>& last = live_[batch[b]].last_topk[l];
      last.clear();
      for (auto it = first; it != first + top_k; ++it) {
        if (*it >= 0 && *it < Length(batch[b])) last.push_back(*it);
      }
    }
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(CheckLayer(model_, options_.geometry, l, batch, topk[l], results[i][l], top_k,
                           options_.share_repeated_positions),
                0)
          << "step " << steps_ << " layer " << l << " on " << managers_[i]->backend().name();
      if (i > 0) {
        // Identical slot choices and bytes across backends (the rows of the batch).
        EXPECT_TRUE(SameRows(results[i][l], results[0][l], n * top_k, options_.geometry.layers[l]))
            << "backends differ at step " << steps_ << " layer " << l;
      }
    }
  }
}

void RandomWorkload::Release() {
  if (live_.empty()) return;
  auto it = live_.begin();
  std::advance(it, rng_() % live_.size());
  const RequestId id = it->first;
  ExpectAll(
      "Release", [&](SparseKVCacheManager& m) { return m.Release(id); }, StatusCode::kOk);
  ExpectAll(
      "Release twice", [&](SparseKVCacheManager& m) { return m.Release(id); },
      StatusCode::kNotFound);
  const std::vector<RequestId> batch = {id};
  ExpectAll(
      "PlanStep after release", [&](SparseKVCacheManager& m) { return m.PlanStep(batch, nullptr); },
      StatusCode::kNotFound);
  live_.erase(it);
  model_.Remove(id);
}

void RandomWorkload::RetractOrResume() {
  if (live_.empty()) return;
  auto it = live_.begin();
  std::advance(it, rng_() % live_.size());
  const RequestId id = it->first;
  if (it->second.retracted) {
    std::vector<Status> results;
    for (SparseKVCacheManager* m : managers_) results.push_back(m->Resume(id, nullptr));
    for (const Status& s : results) EXPECT_EQ(s.code(), results[0].code()) << s.ToString();
    if (results[0].ok()) {
      it->second.retracted = false;
      // A fresh hot-cache block: the next step finds only the window resident.
    } else {
      EXPECT_EQ(results[0].code(), StatusCode::kResourceExhausted) << results[0].ToString();
    }
  } else if (options_.hybrid_residency && rng_() % 2 == 0) {
    // Promotion: a hot-cache request becomes resident if its pages are free (resident ones,
    // forked ones and those of the open step are refused).
    std::vector<Status> results;
    for (SparseKVCacheManager* m : managers_) results.push_back(m->Promote(id, nullptr));
    for (const Status& s : results) EXPECT_EQ(s.code(), results[0].code()) << s.ToString();
    EXPECT_TRUE(results[0].ok() || results[0].code() == StatusCode::kResourceExhausted ||
                results[0].code() == StatusCode::kFailedPrecondition)
        << results[0].ToString();
    for (SparseKVCacheManager* m : managers_) {
      EXPECT_EQ(m->IsResident(id), managers_[0]->IsResident(id));
    }
  } else {
    ExpectAll(
        "Retract", [&](SparseKVCacheManager& m) { return m.Retract(id); }, StatusCode::kOk);
    it->second.retracted = true;
    const std::vector<RequestId> batch = {id};
    ExpectAll(
        "PlanStep of a retracted request",
        [&](SparseKVCacheManager& m) { return m.PlanStep(batch, nullptr); },
        StatusCode::kFailedPrecondition);
  }
}

void RandomWorkload::BadInput() {
  const std::vector<RequestId> unknown = {next_id_ + 1000};
  ExpectAll(
      "PlanStep unknown", [&](SparseKVCacheManager& m) { return m.PlanStep(unknown, nullptr); },
      StatusCode::kNotFound);
  ExpectAll(
      "PlanStep empty", [&](SparseKVCacheManager& m) { return m.PlanStep({}, nullptr); },
      StatusCode::kInvalidArgument);
  ExpectAll(
      "Admit too long",
      [&](SparseKVCacheManager& m) {
        return m.Admit(next_id_ + 2000, options_.max_context, 1, nullptr);
      },
      StatusCode::kOutOfRange);
  ExpectAll(
      "AppendToken outside a step",
      [&](SparseKVCacheManager& m) {
        const std::byte row[1] = {};
        return m.AppendToken(0, row, nullptr);
      },
      StatusCode::kFailedPrecondition);
  for (const auto& [id, r] : live_) {
    if (r.retracted || r.length >= r.reserved) continue;
    const std::vector<RequestId> twice = {id, id};
    ExpectAll(
        "PlanStep duplicate", [&](SparseKVCacheManager& m) { return m.PlanStep(twice, nullptr); },
        StatusCode::kInvalidArgument);
    ExpectAll(
        "Admit existing", [&](SparseKVCacheManager& m) { return m.Admit(id, 1, 1, nullptr); },
        StatusCode::kAlreadyExists);
    break;
  }
}

void RandomWorkload::CheckStats() {
  std::vector<CacheStats> stats;
  for (SparseKVCacheManager* m : managers_) {
    StatusOr<CacheStats> s = m->ReadStats(nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stats.push_back(*s);
  }
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    const LayerStats& a = stats[0].layers[l];
    EXPECT_EQ(a.hits + a.window_hits + a.misses + a.padding + a.duplicates + a.out_of_range +
                  a.resident_hits,
              entries_[l])
        << "layer " << l << ": every top-k entry is counted exactly once";
    for (const CacheStats& s : stats) {
      const LayerStats& b = s.layers[l];
      EXPECT_EQ(std::tie(a.hits, a.window_hits, a.misses, a.padding, a.duplicates, a.out_of_range,
                         a.resident_hits),
                std::tie(b.hits, b.window_hits, b.misses, b.padding, b.duplicates, b.out_of_range,
                         b.resident_hits));
    }
  }
  for (const CacheStats& s : stats) {
    EXPECT_EQ(s.invalid_copy_entries, 0u);
    EXPECT_EQ(s.bytes_host_to_device, stats[0].bytes_host_to_device);
    EXPECT_EQ(s.bytes_device_to_host, stats[0].bytes_device_to_host);
    EXPECT_EQ(s.prefetch_lookups, stats[0].prefetch_lookups);
    EXPECT_EQ(s.prefetch_rows, stats[0].prefetch_rows);
    EXPECT_EQ(std::tie(s.prefetch_useful_rows, s.prefetch_wasted_rows, s.prefetch_missed_rows),
              std::tie(stats[0].prefetch_useful_rows, stats[0].prefetch_wasted_rows,
                       stats[0].prefetch_missed_rows));
    EXPECT_EQ(std::tie(s.demotions, s.promotions, s.resident_requests),
              std::tie(stats[0].demotions, stats[0].promotions, stats[0].resident_requests));
  }
}

void RandomWorkload::ReleaseAll() {
  for (const Ingesting& a : ingesting_) {
    ExpectAll(
        "Release while ingesting", [&](SparseKVCacheManager& m) { return m.Release(a.id); },
        StatusCode::kOk);
  }
  ingesting_.clear();
  for (const auto& [id, r] : live_) {
    ExpectAll(
        "Release", [&](SparseKVCacheManager& m) { return m.Release(id); }, StatusCode::kOk);
    model_.Remove(id);
  }
  live_.clear();
  const int32_t evicted = managers_[0]->EvictRetained();
  for (SparseKVCacheManager* m : managers_) {
    if (m != managers_[0]) {
      EXPECT_EQ(m->EvictRetained(), evicted);
    }
    StatusOr<CacheStats> s = m->ReadStats(nullptr);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->host_pages_used, 0) << "host pages leaked";
    EXPECT_EQ(s->hot_blocks_used, 0) << "hot-cache blocks leaked";
    EXPECT_EQ(s->resident_requests, 0);
    EXPECT_EQ(s->pages_shared, 0);
    EXPECT_EQ(s->bytes_saved, 0);
  }
  retained_.clear();
}

std::vector<int32_t> RandomWorkload::RandomTokens(int32_t n) {
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % shape_.vocabulary);
  return ids;
}

Bytes RandomWorkload::RowOf(std::span<const int32_t> tokens, int32_t layer) const {
  uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(layer + 1);
  for (int32_t id : tokens) h = (h ^ static_cast<uint32_t>(id)) * 0x100000001b3ull + 0x7f4a7c15;
  std::mt19937_64 rng(h);
  return RandomRows(rng, 1, options_.geometry.layers[layer].row_stride);
}

void RandomWorkload::AdmitTokens(std::vector<int32_t> tokens, int32_t max_new) {
  const RequestId id = next_id_++;
  const int32_t prompt = static_cast<int32_t>(tokens.size());
  std::vector<StatusOr<int32_t>> results;
  for (SparseKVCacheManager* m : managers_) {
    results.push_back(m->AdmitWithPrefix(id, tokens, max_new, nullptr));
  }
  for (const auto& r : results) {
    EXPECT_EQ(r.status().code(), results[0].status().code()) << r.status().ToString();
    if (r.ok() && results[0].ok()) {
      EXPECT_EQ(*r, *results[0]) << "backends disagree on the prefix";
    }
  }
  if (!results[0].ok()) {
    const StatusCode c = results[0].status().code();
    EXPECT_TRUE(c == StatusCode::kResourceExhausted || c == StatusCode::kOutOfRange)
        << results[0].status().ToString();
    return;
  }
  // In tokens: whole pages of entries, each entry covering cadence_ tokens.
  const int32_t cached = *results[0];
  const int32_t page_tokens = options_.host_page_tokens * cadence_;
  EXPECT_TRUE(cached % page_tokens == 0 && cached < prompt) << "cached " << cached;
  const int32_t entries = prompt / cadence_;
  std::vector<Bytes> prompt_rows(options_.geometry.num_layers());
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    // Entry e is the KV of the tokens up to the one that completes it.
    for (int32_t e = 0; e < entries; ++e) {
      const Bytes row = RowOf(std::span(tokens).first((e + 1) * cadence_), l);
      prompt_rows[l].insert(prompt_rows[l].end(), row.begin(), row.end());
    }
    // Alternately the suffix alone and the whole prompt (whose cached rows are skipped). A prompt
    // whose uncached tokens complete no entry has no rows to give.
    const bool suffix = rng_() % 2 == 0;
    const size_t first = suffix ? static_cast<size_t>(cached / cadence_) : 0;
    const std::byte* rows =
        first < static_cast<size_t>(entries)
            ? prompt_rows[l].data() + first * options_.geometry.layers[l].row_stride
            : nullptr;
    ExpectAll(
        "Ingest",
        [&](SparseKVCacheManager& m) {
          return suffix ? m.IngestPromptSuffix(id, l, rows, nullptr)
                        : m.IngestPrompt(id, l, rows, nullptr);
        },
        StatusCode::kOk);
  }
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    IngestKeys(id, l, entries > 0 ? prompt_rows[l].data() : nullptr,
               entries);  // the cached prefix's too
  }
  model_.Add(id, prompt_rows, entries);
  live_[id] = Req{prompt + max_new, false,
                  std::vector<std::vector<int32_t>>(options_.geometry.num_layers()),
                  std::move(tokens), prompt};
}

void RandomWorkload::Continue() {
  // The source: a retained conversation (which the managers may have evicted since) or a live
  // request; the new turn keeps a random part of its history and adds new tokens.
  std::vector<int32_t> tokens;
  if (!retained_.empty() && (live_.empty() || rng_() % 3 != 0)) {
    auto it = retained_.begin();
    std::advance(it, rng_() % retained_.size());
    tokens = it->second;
  } else if (!live_.empty()) {
    auto it = live_.begin();
    std::advance(it, rng_() % live_.size());
    tokens = it->second.tokens;
  } else {
    return;
  }
  if (rng_() % 3 == 0) tokens.resize(1 + rng_() % tokens.size());
  const std::vector<int32_t> turn = RandomTokens(static_cast<int32_t>(rng_() % 12));
  tokens.insert(tokens.end(), turn.begin(), turn.end());
  if (tokens.empty()) tokens = RandomTokens(1);
  AdmitTokens(std::move(tokens), static_cast<int32_t>(rng_() % shape_.max_new));
}

void RandomWorkload::Fork() {
  if (live_.empty()) return;
  auto it = live_.begin();
  std::advance(it, rng_() % live_.size());
  const RequestId parent = it->first;
  const RequestId child = next_id_++;
  const int32_t max_new = static_cast<int32_t>(rng_() % shape_.max_new);
  std::vector<Status> results;
  for (SparseKVCacheManager* m : managers_)
    results.push_back(m->Fork(parent, child, max_new, nullptr));
  for (const Status& s : results) EXPECT_EQ(s.code(), results[0].code()) << s.ToString();
  if (!results[0].ok()) {
    const StatusCode c = results[0].code();
    EXPECT_TRUE(c == StatusCode::kResourceExhausted || c == StatusCode::kOutOfRange)
        << results[0].ToString();
    return;
  }
  model_.Copy(parent, child);
  Req r = it->second;
  r.reserved = r.length + max_new;
  r.retracted = false;
  live_[child] = std::move(r);
}

void RandomWorkload::Retain() {
  if (live_.empty()) return;
  auto it = live_.begin();
  std::advance(it, rng_() % live_.size());
  const RequestId id = it->first;
  std::vector<StatusOr<int32_t>> results;
  for (SparseKVCacheManager* m : managers_) results.push_back(m->Retain(id));
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, *results[0]);
  }
  const int32_t page_tokens = options_.host_page_tokens * cadence_;
  EXPECT_TRUE(*results[0] % page_tokens == 0 && *results[0] <= it->second.length)
      << "retained " << *results[0] << " of " << it->second.length << " tokens";
  if (*results[0] > 0) retained_[id] = it->second.tokens;
  ExpectAll(
      "PlanStep of a retained request",
      [&](SparseKVCacheManager& m) { return m.PlanStep(std::vector<RequestId>{id}, nullptr); },
      StatusCode::kNotFound);
  live_.erase(it);
  model_.Remove(id);
}

void RandomWorkload::DropRetained() {
  // Forget the conversations the managers evicted.
  std::erase_if(retained_, [&](const auto& c) { return !managers_[0]->IsRetained(c.first); });
  for (SparseKVCacheManager* m : managers_) {
    for (const auto& [id, tokens] : retained_) EXPECT_TRUE(m->IsRetained(id)) << "request " << id;
  }
  if (rng_() % 4 == 0) {
    for (SparseKVCacheManager* m : managers_) {
      EXPECT_EQ(m->EvictRetained(), static_cast<int32_t>(retained_.size()));
    }
    retained_.clear();
  } else if (!retained_.empty()) {
    auto it = retained_.begin();
    std::advance(it, rng_() % retained_.size());
    const RequestId id = it->first;
    ExpectAll(
        "Release retained", [&](SparseKVCacheManager& m) { return m.Release(id); },
        StatusCode::kOk);
    ExpectAll(
        "Release retained twice", [&](SparseKVCacheManager& m) { return m.Release(id); },
        StatusCode::kNotFound);
    retained_.erase(it);
  }
}

void RandomWorkload::CheckPool() {
  const int32_t page = options_.host_page_tokens;
  for (size_t i = 0; i < managers_.size(); ++i) {
    SparseKVCacheManager& m = *managers_[i];
    ASSERT_TRUE(m.backend().Synchronize(nullptr).ok());
    const HostKVPool& pool = m.host_pool();
    for (const auto& [id, r] : live_) {
      StatusOr<std::vector<int32_t>> pages = m.HostPages(id);
      ASSERT_TRUE(pages.ok()) << pages.status().ToString();
      for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
        const int32_t bytes = options_.geometry.layers[l].row_bytes;
        for (int32_t p = 0; p < Length(id); ++p) {
          const int32_t row = (*pages)[p / page] * page + p % page;
          ASSERT_EQ(std::memcmp(pool.row(l, row), model_.Row(id, l, p), bytes), 0)
              << "request " << id << " layer " << l << " position " << p << " in the host pool on "
              << m.backend().name();
        }
      }
    }
    // A page with several holders never changes while it has them.
    std::map<int32_t, Bytes>& snapshots = shared_snapshots_[i];
    std::erase_if(snapshots, [&](const auto& s) { return pool.RefCount(s.first) < 2; });
    for (int32_t p = 0; p < pool.total_pages(); ++p) {
      if (pool.RefCount(p) < 2) continue;
      Bytes now;
      for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
        const std::byte* first = pool.row(l, p * page);
        now.insert(now.end(), first,
                   first + int64_t{page} * options_.geometry.layers[l].row_stride);
      }
      auto [it, fresh] = snapshots.emplace(p, now);
      if (!fresh) {
        ASSERT_TRUE(it->second == now)
            << "shared page " << p << " was modified on " << m.backend().name();
      }
    }
  }
}

}  // namespace sparsekv::testing
