#include "testing/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <tuple>
#include <string>

namespace sparsekv::testing {

CacheOptions RandomSmallOptions(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  auto pick = [&](std::initializer_list<int32_t> v) {
    return *(v.begin() + rng() % v.size());
  };
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
    : options_(options), shape_(shape), rng_(seed), managers_(std::move(managers)), model_(options.geometry) {
  for (SparseKVCacheManager* m : managers_) drivers_.push_back(std::make_unique<StepDriver>(*m));
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
    if (r < 15) {
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
  const RequestId id = next_id_++;
  const int32_t prompt = 1 + static_cast<int32_t>(rng_() % shape_.max_prompt);
  const int32_t max_new = static_cast<int32_t>(rng_() % shape_.max_new);
  std::vector<Status> results;
  for (SparseKVCacheManager* m : managers_) results.push_back(m->Admit(id, prompt, max_new, nullptr));
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
  std::vector<Bytes> prompt_rows;
  for (const LayerShape& l : options_.geometry.layers) {
    prompt_rows.push_back(RandomRows(rng_, prompt, l.row_stride));
  }
  // Ingest layers in a random order; a step may not include the request before all are in.
  std::vector<int32_t> order(options_.geometry.num_layers());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng_);
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 1) {
      const std::vector<RequestId> batch = {id};
      ExpectAll("PlanStep before full ingest",
                [&](SparseKVCacheManager& m) { return m.PlanStep(batch, nullptr); },
                StatusCode::kFailedPrecondition);
    }
    const int32_t l = order[i];
    ExpectAll("IngestPrompt",
              [&](SparseKVCacheManager& m) {
                return m.IngestPrompt(id, l, prompt_rows[l].data(), nullptr);
              },
              StatusCode::kOk);
  }
  ExpectAll("IngestPrompt twice",
            [&](SparseKVCacheManager& m) {
              return m.IngestPrompt(id, order[0], prompt_rows[order[0]].data(), nullptr);
            },
            StatusCode::kAlreadyExists);
  model_.Add(id, prompt_rows, prompt);
  live_[id] = Req{prompt + max_new, false,
                  std::vector<std::vector<int32_t>>(options_.geometry.num_layers())};
}

std::vector<int32_t> RandomWorkload::RandomTopKRow(RequestId id, int32_t layer,
                                                   int32_t seq_len) {
  std::vector<int32_t> row(options_.top_k);
  const std::vector<int32_t>& last = live_[id].last_topk[layer];
  for (int32_t k = 0; k < options_.top_k; ++k) {
    const uint64_t r = rng_() % 100;
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
    if (!r.retracted && Length(id) < r.reserved) ready.push_back(id);
  }
  if (ready.empty()) return;
  std::shuffle(ready.begin(), ready.end(), rng_);
  const size_t n = 1 + rng_() % std::min<size_t>(ready.size(), options_.effective_max_batch());
  const std::vector<RequestId> batch(ready.begin(), ready.begin() + n);

  std::vector<Bytes> new_rows;
  std::vector<std::vector<int32_t>> topk(options_.geometry.num_layers());
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    const int32_t stride = options_.geometry.layers[l].row_stride;
    new_rows.push_back(RandomRows(rng_, static_cast<int64_t>(n), stride));
    for (size_t b = 0; b < n; ++b) {
      model_.Append(batch[b], l, new_rows[l].data() + b * stride);
      const std::vector<int32_t> row = RandomTopKRow(batch[b], l, Length(batch[b]));
      topk[l].insert(topk[l].end(), row.begin(), row.end());
    }
  }
  std::vector<std::vector<LayerResult>> results;
  for (auto& d : drivers_) results.push_back(d->Step(batch, new_rows, topk));
  ++steps_;
  entries_ += n * options_.top_k;
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    for (size_t b = 0; b < n; ++b) {
      auto first = topk[l].begin() + b * options_.top_k;
      std::vector<int32_t>& last = live_[batch[b]].last_topk[l];
      last.clear();
      for (auto it = first; it != first + options_.top_k; ++it) {
        if (*it >= 0 && *it < Length(batch[b])) last.push_back(*it);
      }
    }
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(CheckLayer(model_, options_.geometry, l, batch, topk[l], results[i][l],
                           options_.top_k),
                0)
          << "step " << steps_ << " layer " << l << " on " << managers_[i]->backend().name();
      if (i > 0) {
        // Identical slot choices and bytes across backends (the rows of the batch).
        EXPECT_TRUE(SameRows(results[i][l], results[0][l], n * options_.top_k,
                             options_.geometry.layers[l]))
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
  ExpectAll("Release", [&](SparseKVCacheManager& m) { return m.Release(id); }, StatusCode::kOk);
  ExpectAll("Release twice", [&](SparseKVCacheManager& m) { return m.Release(id); },
            StatusCode::kNotFound);
  const std::vector<RequestId> batch = {id};
  ExpectAll("PlanStep after release",
            [&](SparseKVCacheManager& m) { return m.PlanStep(batch, nullptr); },
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
  } else {
    ExpectAll("Retract", [&](SparseKVCacheManager& m) { return m.Retract(id); },
              StatusCode::kOk);
    it->second.retracted = true;
    const std::vector<RequestId> batch = {id};
    ExpectAll("PlanStep of a retracted request",
              [&](SparseKVCacheManager& m) { return m.PlanStep(batch, nullptr); },
              StatusCode::kFailedPrecondition);
  }
}

void RandomWorkload::BadInput() {
  const std::vector<RequestId> unknown = {next_id_ + 1000};
  ExpectAll("PlanStep unknown",
            [&](SparseKVCacheManager& m) { return m.PlanStep(unknown, nullptr); },
            StatusCode::kNotFound);
  ExpectAll("PlanStep empty",
            [&](SparseKVCacheManager& m) { return m.PlanStep({}, nullptr); },
            StatusCode::kInvalidArgument);
  ExpectAll("Admit too long",
            [&](SparseKVCacheManager& m) {
              return m.Admit(next_id_ + 2000, options_.max_context, 1, nullptr);
            },
            StatusCode::kOutOfRange);
  ExpectAll("AppendToken outside a step",
            [&](SparseKVCacheManager& m) {
              const std::byte row[1] = {};
              return m.AppendToken(0, row, nullptr);
            },
            StatusCode::kFailedPrecondition);
  for (const auto& [id, r] : live_) {
    if (r.retracted || Length(id) >= r.reserved) continue;
    const std::vector<RequestId> twice = {id, id};
    ExpectAll("PlanStep duplicate",
              [&](SparseKVCacheManager& m) { return m.PlanStep(twice, nullptr); },
              StatusCode::kInvalidArgument);
    ExpectAll("Admit existing",
              [&](SparseKVCacheManager& m) { return m.Admit(id, 1, 1, nullptr); },
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
    EXPECT_EQ(a.hits + a.window_hits + a.misses + a.padding + a.duplicates + a.out_of_range,
              entries_)
        << "layer " << l << ": every top-k entry is counted exactly once";
    for (const CacheStats& s : stats) {
      const LayerStats& b = s.layers[l];
      EXPECT_EQ(std::tie(a.hits, a.window_hits, a.misses, a.padding, a.duplicates, a.out_of_range),
                std::tie(b.hits, b.window_hits, b.misses, b.padding, b.duplicates, b.out_of_range));
    }
  }
  for (const CacheStats& s : stats) {
    EXPECT_EQ(s.invalid_copy_entries, 0u);
    EXPECT_EQ(s.bytes_host_to_device, stats[0].bytes_host_to_device);
    EXPECT_EQ(s.bytes_device_to_host, stats[0].bytes_device_to_host);
  }
}

void RandomWorkload::ReleaseAll() {
  for (const auto& [id, r] : live_) {
    ExpectAll("Release", [&](SparseKVCacheManager& m) { return m.Release(id); },
              StatusCode::kOk);
    model_.Remove(id);
  }
  live_.clear();
  for (SparseKVCacheManager* m : managers_) {
    StatusOr<CacheStats> s = m->ReadStats(nullptr);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->host_pages_used, 0) << "host pages leaked";
    EXPECT_EQ(s->hot_blocks_used, 0) << "hot-cache blocks leaked";
  }
}

}  // namespace sparsekv::testing
