// A randomized, model-checked workload: random admit / ingest / step / retract / resume / release
// operations, including bad input (padding, duplicates, out-of-range positions, unknown and
// released requests, exhausted pools), applied in lockstep to one or more managers. Every step's
// rows are checked byte for byte against the dense model, and the managers' outputs (slots and
// assembled rows) must be identical to each other.
//
// With WorkloadShape::sharing, requests carry token ids from a tiny vocabulary and their KV rows
// are a function of the ids up to each position (as in a real model), so that prefixes repeat;
// operations add prefix admission, continuing a retained or live conversation with a new turn,
// fork, retain, release of retained conversations and eviction (also under pool pressure). After
// every operation, each live request's history is checked in the host pool, and every page with
// more than one holder must hold the bytes it held when it became shared.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "sparsekv/manager.h"
#include "testing/harness.h"

namespace sparsekv::testing {

// One layer of 8-byte rows; top_k 2, 3 hot slots, window 1; 8-token pages, 64 tokens in the
// pool, 2 requests of up to 32 tokens: small enough to reason about slot by slot.
CacheOptions SmallOptions();
// Random but valid options for a small configuration, derived from `seed`.
CacheOptions RandomSmallOptions(uint64_t seed);
// The same with the transfer-hiding options drawn too: layers_per_index (groups of up to 3
// layers sharing a top-k), share_repeated_positions, and max_prefetch >= `prefetch`.
CacheOptions RandomOverlapOptions(uint64_t seed, int32_t prefetch);
// The same with hybrid residency: a device budget of a few blocks more than max_requests (half
// the seeds with hot_slots = 0, chosen from it) and small resident pages.
CacheOptions RandomHybridOptions(uint64_t seed);
// GLM-5.3's shape, small: 6 or 10 layers in explicit index groups {0}, {1}, {2-5}(, {6-9})
// (LayerShape::index_group), two top-k among the groups (LayerShape::top_k), and the transfer-
// hiding options of RandomOverlapOptions; half the seeds keep indexer keys on the groups' first
// layers only, a third use hybrid residency.
CacheOptions RandomGroupedOptions(uint64_t seed, int32_t prefetch);
// The same options (RandomOverlapOptions for half the seeds, RandomGroupedOptions for the rest)
// with every layer gaining an entry every `entry_tokens` tokens (LayerShape::entry_tokens).
CacheOptions RandomCadenceOptions(uint64_t seed, int32_t prefetch, int32_t entry_tokens);

// Seeds to run: SPARSEKV_TEST_SEED (one seed) if set, else `count` fixed seeds 1..count.
std::vector<uint64_t> TestSeeds(int count);

struct WorkloadShape {
  int32_t max_prompt = 60;  // prompts are 1..max_prompt tokens
  int32_t max_new = 50;     // each request may generate 0..max_new-1 tokens
  bool sharing = false;     // prefix sharing, forks and retained conversations (see above)
  // Without sharing: two admissions in three ingest only some layers at once, the rest later
  // between other operations (an engine that admits a batch first), so that an admission can find
  // requests whose prompt is still being ingested.
  bool deferred_ingest = false;
  int32_t vocabulary = 3;  // token ids are 0..vocabulary-1 (sharing only)
  RunMode run;             // how the step drivers run each layer
};

class RandomWorkload {
 public:
  using Shape = WorkloadShape;
  // All managers must have been created with `options` and be empty.
  RandomWorkload(const CacheOptions& options, uint64_t seed,
                 std::vector<SparseKVCacheManager*> managers, Shape shape = WorkloadShape());

  // Runs `ops` random operations; returns the number of decode steps among them.
  int Run(int ops);
  // Releases every request and checks that the host pool and hot cache are empty again.
  void ReleaseAll();
  // Checks that the statistics of every manager agree and account for every top-k entry.
  void CheckStats();

 private:
  struct Req {
    int32_t reserved;  // tokens the request may reach
    bool retracted;
    std::vector<std::vector<int32_t>> last_topk;  // per layer, last step's positions
    std::vector<int32_t> tokens{};                // sharing: ids of positions [0, length)
    // Tokens appended; the model holds floor(length / entry_tokens) entries (Length).
    int32_t length = 0;
  };
  // Sharing: the token ids of the retained conversations the managers may still hold.
  using Conversations = std::map<RequestId, std::vector<int32_t>>;
  // An admitted request whose prompt layers are not all ingested yet (deferred_ingest).
  struct Ingesting {
    RequestId id;
    int32_t prompt;
    int32_t max_new;
    std::vector<Bytes> rows;     // per layer, the prompt's rows
    std::vector<int32_t> order;  // the layers in ingestion order
    size_t next;                 // order[next] is the next layer to ingest
  };
  void Admit();
  // With indexer keys: ingests the keys of `prompt` positions of `layer` (KeysOf `rows`).
  void IngestKeys(RequestId id, int32_t layer, const std::byte* rows, int32_t prompt);
  // Ingests the next layer of one request of ingesting_; the last one makes it live.
  void IngestDeferred();
  // Ingests order[next, end) of `a`'s layers (the last one makes it live) or, if `layers` is
  // smaller, that many, keeping it in ingesting_.
  void Ingest(Ingesting a, size_t layers);
  void AdmitTokens(std::vector<int32_t> tokens, int32_t max_new);
  void Continue();
  void Fork();
  void Retain();
  void DropRetained();
  // KV row of the last position of `tokens` in `layer` (sharing).
  Bytes RowOf(std::span<const int32_t> tokens, int32_t layer) const;
  std::vector<int32_t> RandomTokens(int32_t n);
  // Sharing: live histories in the host pool, shared pages unchanged.
  void CheckPool();
  void Step();
  void Release();
  void RetractOrResume();
  void BadInput();
  std::vector<int32_t> RandomTopKRow(RequestId id, int32_t layer, int32_t seq_len);
  void ExpectAll(const char* what, const std::function<Status(SparseKVCacheManager&)>& op,
                 StatusCode want);
  // Entries the request holds (tokens at entry_tokens 1).
  int32_t Length(RequestId id) const { return model_.Length(id, 0); }

  CacheOptions options_;
  IndexGroups groups_;
  int32_t cadence_;  // tokens per entry (LayerShape::entry_tokens, one for every layer)
  Shape shape_;
  std::mt19937_64 rng_;
  std::vector<SparseKVCacheManager*> managers_;
  std::vector<std::unique_ptr<StepDriver>> drivers_;
  DenseModel model_;
  std::map<RequestId, Req> live_;
  std::vector<Ingesting> ingesting_;
  Conversations retained_;
  // Per manager: page -> its bytes in every layer, for pages with more than one holder.
  std::vector<std::map<int32_t, Bytes>> shared_snapshots_;
  RequestId next_id_ = 1;
  std::vector<uint64_t> entries_;  // top-k entries resolved, per layer
  int steps_ = 0;
};

}  // namespace sparsekv::testing
