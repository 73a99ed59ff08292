// Coverage-guided fuzz target over SparseKVCacheManager's public operations on the CPU backend.
// (A folder of its own at the top: it drives the whole public API, no single component, and
// carries its corpus.) See docs/fuzzing.md.
//
// The input decodes into a small manager's options and a bounded sequence of operations with
// arbitrary arguments: lifecycle (admit, ingest, release, retract, resume), prefixes (admission
// with token ids, suffix ingestion, fork, retain, eviction), hybrid residency (promote) and
// indexer keys (ingestion, appends), steps whose run phase is driven call by call (append,
// prefetch, run or resolve / copy / assemble per layer, copy chunks, finish) or whole through
// StepSchedule (in a schedule the input forces or the schedule's own, with attention calls that
// fail, the step then finished or aborted), with top-k rows holding padding, repeats,
// out-of-range and arbitrary positions, and calls that the API documents as errors in between. A
// model of every request's history (each row is a deterministic pattern of the token that wrote it)
// checks after every operation:
//   * every status is the one the API documents, or one of the documented alternatives;
//   * an operation that fails changes nothing (lengths, pages, blocks, retained conversations);
//   * every slot is -1 or names a row whose bytes are the model's row for the position asked
//     for (in the request's own hot-cache block, unless it is resident), and assembled rows
//     match, also when the schedule calls attention over a slice; every indexer key of the
//     step's requests is the model's;
//   * every live request's history and every retained conversation is intact in the host pool;
//   * the statistics count every top-k entry once, with padding, out-of-range, repeated and
//     window entries exactly as the top-k rows hold them.
// A violation prints what differs and aborts.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"
#include "sparsekv/peer_tier.h"
#include "sparsekv/step_schedule.h"

namespace sparsekv {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "manager_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, what)                                                                     \
  do {                                                                                             \
    if (!(cond)) Fail(std::string(#cond) + " (line " + std::to_string(__LINE__) + "): " + (what)); \
  } while (0)

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The row a token with row seed `seed` has in `layer`: `bytes` pattern bytes.
void FillRow(std::byte* dst, uint64_t seed, int32_t layer, int32_t bytes) {
  uint64_t s = Mix(seed, static_cast<uint64_t>(layer) + 1);
  for (int32_t i = 0; i < bytes; i += 8) {
    s = Mix(s, 0x5bd1e995);
    std::memcpy(dst + i, &s, std::min(8, bytes - i));
  }
}

bool RowIs(const std::byte* row, uint64_t seed, int32_t layer, int32_t bytes) {
  std::byte want[256];
  FillRow(want, seed, layer, bytes);
  return std::memcmp(row, want, bytes) == 0;
}

// The indexer key of the token with row seed `seed` in `layer`.
void FillKey(std::byte* dst, uint64_t seed, int32_t layer, int32_t bytes) {
  FillRow(dst, Mix(seed, 0x6b6579), layer, bytes);
}

std::string Code(const Status& s) { return s.ToString(); }

// What the inputs run so far reached (printed by the corpus replay, to see that a corpus still
// exercises the paths it is meant to).
struct Reached {
  uint64_t inputs = 0, steps = 0, prefix_hits = 0, forks = 0, retained = 0, evictions = 0,
           copy_on_write = 0, prefetches = 0, split_resolves = 0, chunk_copies = 0, key_ingests = 0,
           promotions = 0, peer_imports = 0, peer_maps = 0, errors = 0, scheduled_steps = 0,
           failed_attention = 0, aborted_steps = 0, planned_steps = 0;
} reached;

constexpr uint64_t kRoot = 0x243f6a8885a308d3ull;  // row seed chain of token ids starts here

// The model of one live request.
struct Req {
  std::vector<uint64_t> seeds;  // per position: the row seed
  int32_t prompt_len = 0;
  int32_t reserved = 0;
  int32_t cached = 0;   // AdmitWithPrefix: prompt positions shared, not ingested
  int32_t ids_len = 0;  // positions [0, ids_len) have known token ids
  std::vector<bool> ingested;
  int32_t ingested_count = 0;
  std::vector<bool> keys;  // indexer keys ingested, per layer
  int32_t keys_count = 0;
  bool retracted = false;
  bool forked = false;  // stays in hot-cache mode
  int32_t len() const { return static_cast<int32_t>(seeds.size()); }
};

// What must not change when an operation fails.
struct Snapshot {
  std::map<RequestId, std::vector<int32_t>> pages;  // live and retained
  std::map<RequestId, int32_t> lengths;
  int32_t host_pages_used = 0;
  int32_t hot_blocks_used = 0;
  int32_t retained = 0;
  bool operator==(const Snapshot&) const = default;
};

class Fuzzer {
 public:
  Fuzzer(FuzzedDataProvider& in, const CacheOptions& o, std::shared_ptr<Backend> backend,
         std::unique_ptr<SparseKVCacheManager> m)
      : in_(in),
        o_(o),
        backend_(std::move(backend)),
        m_(std::move(m)),
        layers_(o.geometry.num_layers()),
        lpi_(o.layers_per_index),
        groups_(o.index_groups()),
        max_batch_(o.effective_max_batch()),
        hybrid_(o.hybrid_residency),
        keys_(o.indexer_key_bytes),
        entries_(layers_, 0),
        padding_(layers_, 0),
        out_of_range_(layers_, 0),
        duplicates_(layers_, 0),
        window_hits_(layers_, 0),
        resident_hits_(layers_, 0) {}

  void Run() {
    // The peer tier for about a quarter of the inputs: regions this process lends itself, some
    // requests' rows mapped to them, stale and mutated descriptors refused.
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      PeerTierOptions po;
      po.max_regions = kMaxRegions;
      const Status s = AttachPeerTier(*m_, po);
      FUZZ_CHECK(s.ok(), Code(s));
      peer_ = true;
    }
    for (int op = 0; op < 256 && in_.remaining_bytes() > 0; ++op) {
      const Snapshot before = Take();
      bool changed = true;  // false: the operation failed and must have changed nothing
      bool admission = false;
      // Weighted so that most inputs reach steps; about half of the calls are steps.
      // One byte: its low five bits pick the operation; a step through StepSchedule takes the
      // high values of the byte that picks a step (so that inputs written before it decode as
      // they did, unless their byte was one of those).
      const int byte = in_.ConsumeIntegralInRange<int>(0, 255);
      const int kind = byte % 32;
      switch (kind) {
        case 0:
        case 1:
        case 2:
          changed = Admit();
          admission = true;
          break;
        case 3:
        case 4:
          changed = AdmitWithPrefix();
          admission = true;
          break;
        case 5:
        case 6:
        case 7:
        case 8:
          changed = Ingest();
          break;
        case 9:
          changed = Release();
          break;
        case 10:
          changed = Retract();
          break;
        case 11:
          changed = Resume();
          break;
        case 12:
          changed = Fork();
          admission = true;
          break;
        case 13:
          changed = Retain();
          break;
        case 14:
          changed = EvictRetained();
          break;
        case 15:
          changed = BadRunCall();
          break;
        case 16:
          changed = ResetStats();
          break;
        case 17:
          changed = Promote();
          break;
        case 18:
          changed = Peer();
          break;
        case 19:
          changed = NodePoolDescriptor();
          break;
        case 20:
          if (!step_open_ && byte >= 128) {
            changed = ScheduledStep();
            break;
          }
          [[fallthrough]];
        default:
          changed = step_open_ ? RunNext() : Plan();
          break;
      }
      SyncRetained(admission);
      reached.errors += !changed;
      if (!changed) {
        FUZZ_CHECK(Take() == before, "a failed operation changed the manager's state");
      }
      CheckAll();
    }
    // Finish an open step, then release everything: nothing may leak.
    while (step_open_) {
      if (!Advance(/*choose=*/false)) Fail("could not complete the open step");
    }
    CheckAll();
    for (const auto& [index, region] : imported_) {
      const Status s = DetachPeerRegion(*m_, index, nullptr);
      FUZZ_CHECK(s.ok(), Code(s));
    }
    imported_.clear();
    for (auto it = live_.begin(); it != live_.end(); it = live_.erase(it)) {
      const Status s = m_->Release(it->first);
      FUZZ_CHECK(s.ok(), Code(s));
    }
    const int32_t n = m_->EvictRetained();
    FUZZ_CHECK(n == static_cast<int32_t>(retained_.size()), std::to_string(n));
    retained_.clear();
    StatusOr<CacheStats> s = m_->ReadStats(nullptr);
    FUZZ_CHECK(s.ok(), Code(s.status()));
    FUZZ_CHECK(s->host_pages_used == 0, "host pages leaked: " + std::to_string(s->host_pages_used));
    FUZZ_CHECK(s->hot_blocks_used == 0, "hot-cache blocks leaked");
    FUZZ_CHECK(s->pages_shared == 0 && s->bytes_saved == 0, "shared pages left");
    CheckStats(*s);
    reached.evictions += s->evictions;
    reached.copy_on_write += s->copy_on_write_pages;
  }

 private:
  // ---- Arguments ----

  // Mostly a live request (one not yet fully ingested for ingestion), else a retained
  // conversation, a small id that may be free, or any id.
  RequestId PickId(bool ingesting = false) {
    const int r = in_.ConsumeIntegralInRange<int>(0, 15);
    if (r < 8 && !live_.empty()) {
      std::vector<RequestId> ids;
      for (const auto& [id, q] : live_) {
        if (!ingesting || q.ingested_count < layers_) ids.push_back(id);
      }
      if (ids.empty()) ids.push_back(live_.begin()->first);
      return ids[SmallInt(0, static_cast<int32_t>(ids.size()) - 1)];
    }
    if (r < 10 && !retained_.empty()) {
      return std::next(retained_.begin(), SmallInt(0, static_cast<int32_t>(retained_.size()) - 1))
          ->first;
    }
    if (r < 15) return static_cast<RequestId>(1 + in_.ConsumeIntegralInRange<int>(0, 7));
    return in_.ConsumeIntegral<RequestId>();
  }
  int32_t PickLayer() {
    const int r = in_.ConsumeIntegralInRange<int>(0, 7);
    if (r == 0) return -1;
    if (r == 1) return layers_;
    return r % layers_;
  }
  int32_t SmallInt(int32_t lo, int32_t hi) { return in_.ConsumeIntegralInRange<int32_t>(lo, hi); }
  int32_t TokenId() {
    return in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? in_.ConsumeIntegral<int32_t>()
                                                      : SmallInt(0, 2);
  }
  bool InStep(RequestId id) const {
    return step_open_ && std::find(batch_.begin(), batch_.end(), id) != batch_.end();
  }
  int32_t LiveBlocks() const {
    int32_t n = 0;
    for (const auto& [id, r] : live_) n += !r.retracted;
    return n;
  }
  // Pages an admission may get without failing: free, and held only by retained conversations.
  int64_t Obtainable() const {
    const HostKVPool& pool = m_->host_pool();
    std::map<int32_t, int32_t> retained_refs;
    for (const auto& [id, seeds] : retained_) {
      StatusOr<std::vector<int32_t>> pages = m_->HostPages(id);
      FUZZ_CHECK(pages.ok(), Code(pages.status()));
      for (int32_t p : *pages) ++retained_refs[p];
    }
    int64_t n = pool.free_pages();
    for (const auto& [p, refs] : retained_refs) n += refs == pool.RefCount(p);
    return n;
  }
  int64_t Pages(int64_t tokens) const {
    return (tokens + o_.host_page_tokens - 1) / o_.host_page_tokens;
  }
  // The codes admission checks give before the pool is consulted; kOk if none applies.
  StatusCode AdmissionCode(RequestId id, int64_t tokens) const {
    if (live_.contains(id) || retained_.contains(id)) return StatusCode::kAlreadyExists;
    if (tokens > o_.max_context) return StatusCode::kOutOfRange;
    // (With hybrid residency a resident request holds pages, not a block: the pages decide.)
    if (static_cast<int32_t>(live_.size()) >= o_.effective_max_host_requests() ||
        (!hybrid_ && LiveBlocks() >= o_.max_requests)) {
      return StatusCode::kResourceExhausted;
    }
    return StatusCode::kOk;
  }
  void ExpectCode(const Status& s, StatusCode want, const char* op) {
    FUZZ_CHECK(s.code() == want, std::string(op) + " returned " + Code(s) + ", the API says " +
                                     std::string(StatusCodeName(want)));
  }

  // ---- Lifecycle ----

  Req NewRequest(int32_t prompt_len, int32_t max_new) {
    Req r;
    r.prompt_len = prompt_len;
    r.reserved = prompt_len + max_new;
    r.ingested.assign(layers_, false);
    r.keys.assign(layers_, false);
    return r;
  }
  // An admission the host side allows may find the device's pages short.
  bool DeviceShort(StatusCode want, const Status& s) const {
    return device_paged() && want == StatusCode::kOk && s.code() == StatusCode::kResourceExhausted;
  }

  bool Admit() {
    const RequestId id = PickId();
    const int32_t prompt = in_.ConsumeIntegralInRange<int>(0, 7) == 0
                               ? SmallInt(-1, o_.max_context + 1)
                               : SmallInt(1, o_.max_context / 2);
    const int32_t max_new = SmallInt(-1, o_.max_context / 2);
    StatusCode want = prompt < 1 || max_new < 0 ? StatusCode::kInvalidArgument
                                                : AdmissionCode(id, int64_t{prompt} + max_new);
    if (want == StatusCode::kOk && Obtainable() < Pages(int64_t{prompt} + max_new)) {
      want = StatusCode::kResourceExhausted;
    }
    const Status s = m_->Admit(id, prompt, max_new, nullptr);
    if (!DeviceShort(want, s)) ExpectCode(s, want, "Admit");
    if (!s.ok()) return false;
    Req r = NewRequest(prompt, max_new);
    const uint64_t salt = Mix(0x1234, ++salt_);
    for (int32_t p = 0; p < prompt; ++p) r.seeds.push_back(Mix(salt, p));
    live_[id] = std::move(r);
    return true;
  }

  bool AdmitWithPrefix() {
    const RequestId id = PickId();
    std::vector<int32_t> ids;
    const int r = in_.ConsumeIntegralInRange<int>(0, 7);
    if (r < 4 && !history_ids_.empty()) {
      // A continuation: the ids of a tracked history (live or retained), cut at a random point,
      // plus a new turn.
      const std::vector<int32_t>& source =
          std::next(history_ids_.begin(),
                    SmallInt(0, static_cast<int32_t>(history_ids_.size()) - 1))
              ->second;
      ids.assign(source.begin(), source.begin() + SmallInt(0, static_cast<int32_t>(source.size())));
    }
    const int32_t extra = SmallInt(r == 7 ? 0 : 1, 12);
    for (int32_t i = 0; i < extra; ++i) ids.push_back(TokenId());
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) {
      ids.resize(o_.max_context + in_.ConsumeIntegralInRange<int>(0, 2), 1);
    }
    const int32_t max_new = SmallInt(-1, o_.max_context / 2);
    const int64_t obtainable = Obtainable();
    StatusOr<int32_t> cached = m_->AdmitWithPrefix(id, ids, max_new, nullptr);
    const int64_t tokens = static_cast<int64_t>(ids.size()) + max_new;
    StatusCode want = StatusCode::kOk;
    if (ids.empty() || max_new < 0) {
      want = StatusCode::kInvalidArgument;
    } else if (ids.size() > static_cast<size_t>(o_.max_context)) {
      want = StatusCode::kOutOfRange;
    } else {
      want = AdmissionCode(id, tokens);
    }
    const bool may_lack_pages = want == StatusCode::kOk && obtainable < Pages(tokens);
    if (!(may_lack_pages && cached.status().code() == StatusCode::kResourceExhausted) &&
        !DeviceShort(want, cached.status())) {
      ExpectCode(cached.status(), want, "AdmitWithPrefix");
    }
    if (!cached.ok()) return false;
    const int32_t prompt = static_cast<int32_t>(ids.size());
    FUZZ_CHECK(*cached >= 0 && *cached % o_.host_page_tokens == 0 && *cached < prompt,
               "AdmitWithPrefix returned cached = " + std::to_string(*cached));
    reached.prefix_hits += *cached > 0;
    Req q = NewRequest(prompt, max_new);
    q.cached = *cached;
    q.ids_len = prompt;
    uint64_t h = kRoot;
    for (int32_t t : ids) q.seeds.push_back(h = Mix(h, static_cast<uint32_t>(t)));
    live_[id] = std::move(q);
    history_ids_[id] = ids;
    return true;
  }

  bool Ingest() {
    // Indexer keys for about half of the calls where the manager keeps them (otherwise now and
    // then, to be refused).
    if (keys_ > 0 ? in_.ConsumeBool() : in_.ConsumeIntegralInRange<int>(0, 15) == 0) {
      return IngestKeys();
    }
    const RequestId id = PickId(/*ingesting=*/true);
    int32_t layer = PickLayer();
    if (auto it = live_.find(id); it != live_.end() && in_.ConsumeBool()) {
      for (int32_t l = 0; l < layers_; ++l) {
        if (!it->second.ingested[l]) layer = l;  // the next layer to ingest
      }
    }
    const bool suffix = in_.ConsumeBool();
    auto it = live_.find(id);
    std::vector<std::byte> rows;
    if (it != live_.end() && layer >= 0 && layer < layers_) {
      const Req& r = it->second;
      const LayerShape shape = o_.geometry.layers[layer];
      const int32_t first = suffix ? r.cached : 0;
      rows.assign(static_cast<size_t>(std::max(1, r.prompt_len - first)) * shape.row_stride,
                  std::byte{0xEE});  // cached rows stay garbage: they must be skipped
      for (int32_t p = r.cached; p < r.prompt_len; ++p) {
        FillRow(rows.data() + static_cast<size_t>(p - first) * shape.row_stride, r.seeds[p], layer,
                shape.row_bytes);
      }
    } else {
      rows.assign(16, std::byte{0xEE});
    }
    const Status s = suffix ? m_->IngestPromptSuffix(id, layer, rows.data(), nullptr)
                            : m_->IngestPrompt(id, layer, rows.data(), nullptr);
    StatusCode want = StatusCode::kOk;
    if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (layer < 0 || layer >= layers_) {
      want = StatusCode::kInvalidArgument;
    } else if (it->second.ingested[layer]) {
      want = StatusCode::kAlreadyExists;
    } else if (it->second.retracted) {
      want = StatusCode::kFailedPrecondition;
    }
    ExpectCode(s, want, suffix ? "IngestPromptSuffix" : "IngestPrompt");
    if (!s.ok()) return false;
    it->second.ingested[layer] = true;
    ++it->second.ingested_count;
    return true;
  }

  bool IngestKeys() {
    const RequestId id = PickId(/*ingesting=*/true);
    int32_t layer = PickLayer();
    auto it = live_.find(id);
    if (it != live_.end() && in_.ConsumeBool()) {
      for (int32_t l = 0; l < layers_; ++l) {
        if (!it->second.keys[l]) layer = l;  // the next layer without keys
      }
    }
    // Every position's key (those of a shared prefix too); one garbage key without a request.
    std::vector<std::byte> keys(16, std::byte{0xEE});
    if (it != live_.end() && keys_ > 0) {
      const Req& r = it->second;
      keys.assign(static_cast<size_t>(std::max(1, r.len())) * keys_, std::byte{0xEE});
      for (int32_t p = 0; layer >= 0 && layer < layers_ && p < r.len(); ++p) {
        FillKey(keys.data() + static_cast<size_t>(p) * keys_, r.seeds[p], layer, keys_);
      }
    }
    const Status s = m_->IngestIndexerKeys(id, layer, keys.data(), nullptr);
    StatusCode want = StatusCode::kOk;
    if (keys_ == 0) {
      want = StatusCode::kFailedPrecondition;
    } else if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (layer < 0 || layer >= layers_) {
      want = StatusCode::kInvalidArgument;
    } else if (it->second.keys[layer]) {
      want = StatusCode::kAlreadyExists;
    }
    ExpectCode(s, want, "IngestIndexerKeys");
    if (!s.ok()) return false;
    it->second.keys[layer] = true;
    ++it->second.keys_count;
    ++reached.key_ingests;
    return true;
  }

  // ---- The peer tier ----

  static constexpr int32_t kMaxRegions = 2;

  // A region of this process: every layer, max_context rows.
  std::unique_ptr<PeerRegion> Lend() {
    StatusOr<std::unique_ptr<PeerRegion>> r =
        PeerRegion::Create(o_.geometry, o_.max_context, backend_);
    FUZZ_CHECK(r.ok(), Code(r.status()));
    return std::move(r).value();
  }

  // One of: lend and import a region and map a live request's first rows to it (its misses
  // then read the region: the row checks hold them to the model); detach one; import a stale
  // descriptor (its region destroyed: NotFound), a mutated one (refused, or harmless and then
  // kept), one past max_regions (refused); any of them without the tier (FailedPrecondition).
  bool Peer() {
    const int which = in_.ConsumeIntegralInRange<int>(0, 4);
    if (!peer_) {
      const std::unique_ptr<PeerRegion> region = Lend();
      const StatusOr<int32_t> r = ImportPeerRegion(*m_, region->descriptor().Serialize(), nullptr);
      ExpectCode(r.status(), StatusCode::kFailedPrecondition, "ImportPeerRegion without the tier");
      return false;
    }
    if (which == 1) {  // detach
      if (imported_.empty()) {
        ExpectCode(DetachPeerRegion(*m_, SmallInt(-1, kMaxRegions), nullptr), StatusCode::kNotFound,
                   "DetachPeerRegion of no region");
        return false;
      }
      auto it = std::next(imported_.begin(), SmallInt(0, int32_t(imported_.size()) - 1));
      const Status s = DetachPeerRegion(*m_, it->first, nullptr);
      ExpectCode(s, StatusCode::kOk, "DetachPeerRegion");
      imported_.erase(it);
      return true;
    }
    std::unique_ptr<PeerRegion> region = Lend();
    std::string text = region->descriptor().Serialize();
    if (which == 2) {  // stale: the region is gone
      region.reset();
      const StatusOr<int32_t> r = ImportPeerRegion(*m_, text, nullptr);
      if (static_cast<int32_t>(imported_.size()) >= kMaxRegions) {
        FUZZ_CHECK(!r.ok(), "ImportPeerRegion of a destroyed region succeeded");
      } else {
        ExpectCode(r.status(), StatusCode::kNotFound, "ImportPeerRegion of a destroyed region");
      }
      return false;
    }
    if (which == 3) {  // mutated: one bit flipped, or cut
      const size_t at = static_cast<size_t>(SmallInt(0, static_cast<int32_t>(text.size()) - 1));
      if (in_.ConsumeBool()) {
        text.resize(at);
      } else {
        text[at] = static_cast<char>(text[at] ^ (1 << SmallInt(0, 7)));
      }
    }
    const StatusOr<int32_t> r = ImportPeerRegion(*m_, text, nullptr);
    if (static_cast<int32_t>(imported_.size()) >= kMaxRegions) {
      // ResourceExhausted, unless a refusal of the descriptor itself comes first.
      FUZZ_CHECK(!r.ok(), "ImportPeerRegion past max_regions succeeded");
      return false;
    }
    if (which == 3 && !r.ok()) {
      const StatusCode c = r.status().code();
      FUZZ_CHECK(c == StatusCode::kInvalidArgument || c == StatusCode::kNotFound ||
                     c == StatusCode::kUnavailable,
                 "a mutated descriptor: " + Code(r.status()));
      return false;
    }
    ExpectCode(r.status(), StatusCode::kOk, "ImportPeerRegion");
    ++reached.peer_imports;
    imported_[*r] = region.get();
    regions_.push_back(std::move(region));
    MapRows(*r);
    return true;
  }

  // A node pool's descriptor, as another process gets it, mutated or cut: OpenDescribedNodePool
  // refuses it (InvalidArgument for one that does not parse, NotFound for another pool or none,
  // FailedPrecondition for a file that is not one, Unavailable for a path that cannot be opened)
  // or opens the same pool, never another shape. The pool is one of this process, made once.
  bool NodePoolDescriptor() {
    static const std::shared_ptr<HostKVPool> pool = [] {
      CacheOptions o;
      o.geometry = KVGeometry::Uniform(2, 16);
      o.top_k = o.hot_slots = o.max_requests = 1;
      o.host_page_tokens = 4;
      o.max_context = 16;
      o.host_capacity_tokens = 64;
      NodePoolOptions node;
      node.name = "sparsekv-fuzz-" + std::to_string(getpid());
      StatusOr<std::shared_ptr<HostKVPool>> created =
          CreateNodePool(o, 2, node, CreateCpuBackend());
      FUZZ_CHECK(created.ok(), Code(created.status()));
      return *created;
    }();
    std::string text = DescribeNodePool(*pool).Serialize();
    const size_t at = static_cast<size_t>(SmallInt(0, static_cast<int32_t>(text.size()) - 1));
    switch (in_.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        text.resize(at);
        break;
      case 1:
        text[at] = static_cast<char>(text[at] ^ (1 << SmallInt(0, 7)));
        break;
      default:
        break;  // unchanged: the same pool
    }
    const StatusOr<std::shared_ptr<HostKVPool>> opened =
        OpenDescribedNodePool(text, NodePoolOptions(), backend_);
    if (opened.ok()) {
      FUZZ_CHECK((*opened)->node_pool_id() == pool->node_pool_id() &&
                     (*opened)->rows() == pool->rows() &&
                     (*opened)->geometry().num_layers() == pool->geometry().num_layers(),
                 "a node pool descriptor opened another pool: \"" + text + "\"");
      return false;
    }
    const StatusCode c = opened.status().code();
    FUZZ_CHECK(c == StatusCode::kInvalidArgument || c == StatusCode::kNotFound ||
                   c == StatusCode::kFailedPrecondition || c == StatusCode::kUnavailable,
               "a node pool descriptor \"" + text + "\": " + Code(opened.status()));
    return false;
  }

  // Writes the model's rows of a live request's first positions into `region` and maps them.
  void MapRows(int32_t region) {
    if (live_.empty() || step_open_) return;
    const RequestId id =
        std::next(live_.begin(), SmallInt(0, static_cast<int32_t>(live_.size()) - 1))->first;
    const Req& r = live_.at(id);
    if (r.ingested_count != layers_) return;  // rows the pool does not hold yet
    const int32_t tokens = SmallInt(1, r.len());
    PeerRegion& lent = *imported_.at(region);
    for (int32_t l = 0; l < layers_; ++l) {
      const LayerShape shape = o_.geometry.layers[l];
      std::vector<std::byte> rows(static_cast<size_t>(tokens) * shape.row_stride, std::byte{0});
      for (int32_t p = 0; p < tokens; ++p) {
        FillRow(rows.data() + static_cast<size_t>(p) * shape.row_stride, r.seeds[p], l,
                shape.row_bytes);
      }
      const Status w = lent.WriteRows(l, 0, rows.data(), tokens, nullptr);
      FUZZ_CHECK(w.ok(), Code(w));
    }
    const Status s = MapPeerRows(*m_, id, region, 0, tokens, nullptr);
    ExpectCode(s, StatusCode::kOk, "MapPeerRows");
    ++reached.peer_maps;
  }

  // Promote: FailedPrecondition without hybrid residency, for a resident, retracted, forked or
  // not fully ingested request or one of the open step; otherwise it may find its pages short.
  bool Promote() {
    const RequestId id = PickId();
    auto it = live_.find(id);
    const bool was_resident = m_->IsResident(id);
    const Status s = m_->Promote(id, nullptr);
    StatusCode want = StatusCode::kOk;
    if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (!hybrid_ || was_resident || it->second.retracted || it->second.forked ||
               it->second.ingested_count != layers_ || InStep(id)) {
      want = StatusCode::kFailedPrecondition;
    }
    if (!(want == StatusCode::kOk && s.code() == StatusCode::kResourceExhausted)) {
      ExpectCode(s, want, "Promote");
    }
    if (!s.ok()) return false;
    FUZZ_CHECK(m_->IsResident(id), "Promote succeeded and the request is not resident");
    ++reached.promotions;
    return true;
  }

  bool Release() {
    const RequestId id = PickId();
    const Status s = m_->Release(id);
    StatusCode want = StatusCode::kOk;
    if (retained_.contains(id)) {
      want = StatusCode::kOk;
    } else if (!live_.contains(id)) {
      want = StatusCode::kNotFound;
    } else if (InStep(id)) {
      want = StatusCode::kFailedPrecondition;
    }
    ExpectCode(s, want, "Release");
    if (!s.ok()) return false;
    if (!retained_.erase(id)) live_.erase(id);
    history_ids_.erase(id);
    return true;
  }

  bool Retract() {
    const RequestId id = PickId();
    const Status s = m_->Retract(id);
    auto it = live_.find(id);
    StatusCode want = StatusCode::kOk;
    if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (it->second.retracted || InStep(id)) {
      want = StatusCode::kFailedPrecondition;
    }
    ExpectCode(s, want, "Retract");
    if (!s.ok()) return false;
    it->second.retracted = true;
    return true;
  }

  bool Resume() {
    const RequestId id = PickId();
    const Status s = m_->Resume(id, nullptr);
    auto it = live_.find(id);
    StatusCode want = StatusCode::kOk;
    if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (!it->second.retracted) {
      want = StatusCode::kFailedPrecondition;
    } else if (!hybrid_ && LiveBlocks() >= o_.max_requests) {
      want = StatusCode::kResourceExhausted;
    }
    if (!DeviceShort(want, s)) ExpectCode(s, want, "Resume");
    if (!s.ok()) return false;
    it->second.retracted = false;
    return true;
  }

  bool Fork() {
    const RequestId parent = PickId();
    const RequestId child = PickId();
    const int32_t max_new = SmallInt(-1, o_.max_context / 2);
    const int64_t obtainable = Obtainable();
    const Status s = m_->Fork(parent, child, max_new, nullptr);
    auto it = live_.find(parent);
    StatusCode want = StatusCode::kOk;
    bool may_lack_pages = false;
    if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (max_new < 0) {
      want = StatusCode::kInvalidArgument;
    } else if (it->second.ingested_count != layers_ || InStep(parent)) {
      want = StatusCode::kFailedPrecondition;
    } else {
      const int32_t len = it->second.len();
      want = AdmissionCode(child, int64_t{len} + max_new);
      // The child's own pages plus up to two copy-on-write spares.
      may_lack_pages = obtainable < Pages(int64_t{len} + max_new) - Pages(len) + 2;
    }
    if (!(want == StatusCode::kOk && may_lack_pages &&
          s.code() == StatusCode::kResourceExhausted) &&
        !DeviceShort(want, s)) {
      ExpectCode(s, want, "Fork");
    }
    if (!s.ok()) return false;
    Req c = it->second;
    c.reserved = c.len() + max_new;
    c.cached = c.len();
    c.prompt_len = c.len();
    c.retracted = false;
    c.forked = true;
    live_[child] = std::move(c);
    ++reached.forks;
    if (history_ids_.contains(parent)) history_ids_[child] = history_ids_[parent];
    return true;
  }

  bool Retain() {
    const RequestId id = PickId();
    StatusOr<int32_t> tokens = m_->Retain(id);
    auto it = live_.find(id);
    StatusCode want = StatusCode::kOk;
    if (it == live_.end()) {
      want = StatusCode::kNotFound;
    } else if (InStep(id)) {
      want = StatusCode::kFailedPrecondition;
    }
    ExpectCode(tokens.status(), want, "Retain");
    if (!tokens.ok()) return false;
    const Req& r = it->second;
    FUZZ_CHECK(*tokens >= 0 && *tokens % o_.host_page_tokens == 0 && *tokens <= r.ids_len &&
                   *tokens <= r.len(),
               "Retain returned " + std::to_string(*tokens) + " tokens of " +
                   std::to_string(r.len()) + " (" + std::to_string(r.ids_len) + " with ids)");
    FUZZ_CHECK(m_->IsRetained(id) == (*tokens > 0), "IsRetained disagrees with Retain");
    reached.retained += *tokens > 0;
    if (*tokens > 0) {
      retained_[id].assign(r.seeds.begin(), r.seeds.begin() + *tokens);
      history_ids_[id].resize(*tokens);
    } else {
      history_ids_.erase(id);
    }
    live_.erase(it);
    return true;
  }

  bool EvictRetained() {
    const int32_t n = m_->EvictRetained();
    FUZZ_CHECK(
        n == static_cast<int32_t>(retained_.size()),
        "EvictRetained evicted " + std::to_string(n) + " of " + std::to_string(retained_.size()));
    for (const auto& [id, seeds] : retained_) history_ids_.erase(id);
    retained_.clear();
    return true;
  }

  bool ResetStats() {
    const Status s = m_->ResetStats(nullptr);
    FUZZ_CHECK(s.ok(), Code(s));
    for (auto* v :
         {&entries_, &padding_, &out_of_range_, &duplicates_, &window_hits_, &resident_hits_}) {
      std::fill(v->begin(), v->end(), 0);
    }
    prefetch_lookups_ = 0;
    return true;
  }

  // Admissions may evict retained conversations (least recently used first); nothing else may.
  void SyncRetained(bool admission) {
    for (auto it = retained_.begin(); it != retained_.end();) {
      if (m_->IsRetained(it->first)) {
        ++it;
        continue;
      }
      FUZZ_CHECK(admission, "retained conversation " + std::to_string(it->first) +
                                " disappeared without an admission");
      history_ids_.erase(it->first);
      it = retained_.erase(it);
    }
  }

  // ---- Steps ----

  // PlanStep on the manager, or through `schedule`, which passes the manager's errors on.
  bool Plan(StepSchedule* schedule = nullptr) {
    std::vector<RequestId> batch;
    const int32_t n = SmallInt(0, max_batch_ + 1);
    for (int32_t i = 0; i < n; ++i) {
      if (!live_.empty() && in_.ConsumeIntegralInRange<int>(0, 7) != 0) {
        batch.push_back(
            std::next(live_.begin(), SmallInt(0, static_cast<int32_t>(live_.size()) - 1))->first);
      } else {
        batch.push_back(PickId());
      }
    }
    // Mode 0: no ids (the overload without them); 6: an empty list, which is a count of 0; 7: one
    // id too many; otherwise one id per request.
    std::vector<int32_t> ids;
    const int mode = in_.ConsumeIntegralInRange<int>(0, 7);
    const bool with_ids = mode > 0;
    if (mode > 0 && mode != 6) {
      const size_t count = mode == 7 ? batch.size() + 1 : batch.size();
      for (size_t i = 0; i < count; ++i) ids.push_back(TokenId());
    }
    Status s;
    if (schedule != nullptr) {
      s = with_ids ? schedule->PlanStep(batch, ids, nullptr) : schedule->PlanStep(batch, nullptr);
    } else {
      s = with_ids ? m_->PlanStep(batch, ids, nullptr) : m_->PlanStep(batch, nullptr);
    }
    StatusCode want = StatusCode::kOk;
    if (step_open_) {
      want = StatusCode::kFailedPrecondition;
    } else if (with_ids && ids.size() != batch.size()) {
      want = StatusCode::kInvalidArgument;
    } else if (batch.empty() || batch.size() > static_cast<size_t>(max_batch_)) {
      want = StatusCode::kInvalidArgument;
    } else {
      std::set<RequestId> seen;
      for (RequestId id : batch) {
        auto it = live_.find(id);
        if (it == live_.end()) {
          want = StatusCode::kNotFound;
        } else if (!seen.insert(id).second) {
          want = StatusCode::kInvalidArgument;
        } else if (it->second.retracted || it->second.ingested_count != layers_ ||
                   (keys_ > 0 && it->second.keys_count != layers_)) {
          want = StatusCode::kFailedPrecondition;
        } else if (it->second.len() >= it->second.reserved) {
          want = StatusCode::kOutOfRange;
        }
        if (want != StatusCode::kOk) break;
      }
    }
    ExpectCode(s, want, "PlanStep");
    if (!s.ok()) return false;
    OpenStep(batch, ids);
    return true;
  }

  void OpenStep(const std::vector<RequestId>& batch, const std::vector<int32_t>& ids) {
    step_open_ = true;
    batch_ = batch;
    for (size_t b = 0; b < batch.size(); ++b) {
      Req& r = live_.at(batch[b]);
      const int32_t position = r.len();
      if (!ids.empty() && r.ids_len == position) {
        r.seeds.push_back(Mix(r.seeds.back(), static_cast<uint32_t>(ids[b])));
        ++r.ids_len;
        history_ids_[batch[b]].push_back(ids[b]);
      } else {
        r.seeds.push_back(Mix(0x77, ++salt_));  // a token without an id: never shared
      }
    }
    const size_t rows = static_cast<size_t>(max_batch_) * o_.top_k;
    layer_.assign(layers_, LayerState{});
    for (int32_t l = 0; l < layers_; ++l) {
      const LayerShape shape = o_.geometry.layers[l];
      LayerState& ls = layer_[l];
      ls.new_rows.assign(static_cast<size_t>(max_batch_) * shape.row_stride, std::byte{0xCD});
      for (size_t b = 0; b < batch.size(); ++b) {
        const Req& r = live_.at(batch[b]);
        FillRow(ls.new_rows.data() + b * shape.row_stride, r.seeds.back(), l, shape.row_bytes);
      }
      ls.assembled.assign(rows * shape.row_stride, std::byte{0xA5});
      ls.chunk_copied.assign(Chunks(), false);
      ls.new_keys.assign(static_cast<size_t>(max_batch_) * std::max(keys_, 1), std::byte{0xCD});
      for (size_t b = 0; b < batch.size() && keys_ > 0; ++b) {
        FillKey(ls.new_keys.data() + b * keys_, live_.at(batch[b]).seeds.back(), l, keys_);
      }
    }
    group_.assign(groups_, GroupState{});
    for (GroupState& g : group_) {
      g.slots.assign(rows, 0x5A5A5A5A);
      g.fill.assign(rows, 0xA5);
    }
  }

  struct LayerState {
    std::vector<std::byte> new_rows;   // [max_batch, stride]
    std::vector<std::byte> new_keys;   // [max_batch, indexer_key_bytes]
    std::vector<std::byte> assembled;  // [max_batch, top_k, stride]
    bool appended = false;
    bool copied = false;  // CopyMisses, RunLayer, or every copy chunk holding a batch row
    std::vector<bool> chunk_copied;  // CopyMissChunk, per chunk of the miss list
    bool any_chunk() const {
      return std::find(chunk_copied.begin(), chunk_copied.end(), true) != chunk_copied.end();
    }
    // 0: not assembled; 1: assembled before the miss copy (only fill-0 rows meaningful);
    // 2: assembled after it.
    int assembled_when = 0;
  };
  struct GroupState {
    std::vector<int32_t> topk;  // [max_batch, stride]
    int32_t stride = 0;
    std::vector<int32_t> slots;  // [max_batch, top_k]
    std::vector<uint8_t> fill;   // [max_batch, top_k]
    bool has_fill = false;
    bool resolved = false;
    bool prefetched = false;
  };
  int32_t Leader(int32_t layer) const { return layer - layer % lpi_; }
  // Copy chunks of a step's miss list, and those that hold a row of the open step's batch.
  int32_t Chunks() const {
    return o_.copy_chunk_rows > 0 ? (max_batch_ + o_.copy_chunk_rows - 1) / o_.copy_chunk_rows : 0;
  }
  int32_t BatchChunks() const {
    const int32_t batch = static_cast<int32_t>(batch_.size());
    return o_.copy_chunk_rows > 0 ? (batch + o_.copy_chunk_rows - 1) / o_.copy_chunk_rows : 0;
  }
  int32_t GroupEnd(int32_t g) const { return std::min(layers_, (g + 1) * lpi_); }
  bool AllCopied() const {
    return std::all_of(layer_.begin(), layer_.end(), [](const LayerState& l) { return l.copied; });
  }
  bool GroupCopied(int32_t g) const {
    for (int32_t l = g * lpi_; l < GroupEnd(g); ++l) {
      if (!layer_[l].copied) return false;
    }
    return true;
  }
  int32_t NextGroup() const {
    for (int32_t g = 0; g < groups_; ++g) {
      if (!group_[g].resolved) return g;
    }
    return groups_;
  }
  int32_t NextAppend() const {
    for (int32_t l = 0; l < layers_; ++l) {
      if (!layer_[l].appended) return l;
    }
    return layers_;
  }

  // A top-k row of positions for a request of length `len`: in range, padding, repeats, the
  // window, past the end, negative, arbitrary.
  int32_t TopKEntry(int32_t len, const std::vector<int32_t>& row) {
    switch (in_.ConsumeIntegralInRange<int>(0, 11)) {
      case 0:
        return kPaddingPosition;
      case 1:
        return row.empty() ? 0 : row[SmallInt(0, static_cast<int32_t>(row.size()) - 1)];
      case 2:
        return len - 1 - SmallInt(0, std::min(len - 1, o_.window));
      case 3:
        return len + SmallInt(0, 3);
      case 4:
        return -2 - SmallInt(0, 3);
      case 5:
        return in_.ConsumeIntegral<int32_t>();
      default:
        return SmallInt(0, len - 1);
    }
  }

  void CountResolve(int32_t leader, const std::vector<int32_t>& topk, int32_t stride) {
    for (size_t b = 0; b < batch_.size(); ++b) {
      const int32_t len = live_.at(batch_[b]).len();
      const bool resident = m_->IsResident(batch_[b]);  // every row in HBM: nothing is missed
      std::set<int32_t> seen;
      for (int32_t k = 0; k < o_.top_k; ++k) {
        const int32_t p = topk[b * stride + k];
        if (p == kPaddingPosition) {
          ++padding_[leader];
        } else if (p < 0 || p >= len) {
          ++out_of_range_[leader];
        } else if (!seen.insert(p).second) {
          ++duplicates_[leader];
        } else if (resident) {
          ++resident_hits_[leader];
        } else if (p >= len - o_.window) {
          ++window_hits_[leader];
        }
      }
    }
    entries_[leader] += batch_.size() * o_.top_k;
  }

  // One legal step of the run phase, chosen by the input (or the first legal one).
  bool Advance(bool choose) {
    // 0 append, 1 resolve, 2 prefetch, 3 copy, 4 assemble, 6 copy a chunk, 5 finish
    std::vector<int> actions;
    const int32_t append = NextAppend();
    const int32_t g = NextGroup();
    const int32_t leader = g * lpi_;
    if (append < layers_) actions.push_back(0);
    if (g < groups_ && layer_[leader].appended && (g < 2 || GroupCopied(g - 2))) {
      actions.push_back(1);
      if (o_.max_prefetch > 0 && !group_[g].prefetched) actions.push_back(2);
    }
    // Copies: CopyMisses of a layer none of whose chunks was copied; chunks in any order, each
    // once, also those past the batch (they hold nothing) and after the layer counts as copied,
    // but none after CopyMisses.
    std::vector<int32_t> copies, assembles, uncopied;
    std::vector<std::pair<int32_t, int32_t>> chunks;
    for (int32_t l = 0; l < layers_; ++l) {
      if (!group_[l / lpi_].resolved) continue;
      const LayerState& ls = layer_[l];
      if (!ls.copied) uncopied.push_back(l);
      if (!ls.copied && !ls.any_chunk()) copies.push_back(l);
      if (!ls.copied || ls.any_chunk()) {
        for (int32_t c = 0; c < Chunks(); ++c) {
          if (!ls.chunk_copied[c]) chunks.emplace_back(l, c);
        }
      }
      if (ls.appended && ls.assembled_when == 0) assembles.push_back(l);
    }
    if (!copies.empty()) actions.push_back(3);
    if (!assembles.empty()) actions.push_back(4);
    if (!chunks.empty() && (choose || copies.empty())) actions.push_back(6);
    if (append == layers_ && g == groups_ && uncopied.empty()) actions.push_back(5);
    if (actions.empty()) return false;
    const int action = actions[choose ? SmallInt(0, static_cast<int32_t>(actions.size()) - 1) : 0];
    switch (action) {
      case 0: {
        const Status s =
            m_->AppendToken(append, layer_[append].new_rows.data(),
                            keys_ > 0 ? layer_[append].new_keys.data() : nullptr, nullptr);
        ExpectCode(s, StatusCode::kOk, "AppendToken");
        layer_[append].appended = true;
        break;
      }
      case 1:
        Resolve(g, choose);
        break;
      case 2:
        Prefetch(g, choose);
        break;
      case 3: {
        const int32_t l = copies[choose ? SmallInt(0, static_cast<int32_t>(copies.size()) - 1) : 0];
        const Status s = m_->CopyMisses(l, nullptr);
        ExpectCode(s, StatusCode::kOk, "CopyMisses");
        layer_[l].copied = true;
        break;
      }
      case 6: {
        const auto [l, c] =
            chunks[choose ? SmallInt(0, static_cast<int32_t>(chunks.size()) - 1) : 0];
        const Status s = m_->CopyMissChunk(l, c, nullptr);
        ExpectCode(s, StatusCode::kOk, "CopyMissChunk");
        LayerState& ls = layer_[l];
        ls.chunk_copied[c] = true;
        ++reached.chunk_copies;
        bool all = true;
        for (int32_t i = 0; i < BatchChunks(); ++i) all = all && ls.chunk_copied[i];
        ls.copied = ls.copied || all;
        break;
      }
      case 4: {
        const int32_t l =
            assembles[choose ? SmallInt(0, static_cast<int32_t>(assembles.size()) - 1) : 0];
        const Status s = m_->AssembleLayer(l, group_[l / lpi_].slots.data(),
                                           layer_[l].assembled.data(), nullptr);
        ExpectCode(s, StatusCode::kOk, "AssembleLayer");
        layer_[l].assembled_when = layer_[l].copied ? 2 : 1;
        break;
      }
      default: {
        const Status s = m_->FinishStep(nullptr);
        ExpectCode(s, StatusCode::kOk, "FinishStep");
        CheckStep();
        ++reached.steps;
        ++finished_steps_;
        step_open_ = false;
        batch_.clear();
        break;
      }
    }
    return true;
  }

  bool RunNext() {
    if (!step_open_) {
      ExpectCode(m_->FinishStep(nullptr), StatusCode::kFailedPrecondition, "FinishStep");
      return false;
    }
    FUZZ_CHECK(Advance(/*choose=*/true), "no legal run-phase call in an open step");
    return true;
  }

  void Resolve(int32_t g, bool choose) {
    GroupState& gs = group_[g];
    const int32_t leader = g * lpi_;
    gs.stride = o_.top_k + (choose ? SmallInt(0, 2) : 0);
    FillTopK(gs, choose);
    const int32_t stride_arg =
        gs.stride == o_.top_k && (!choose || in_.ConsumeBool()) ? 0 : gs.stride;
    const int mode = choose ? in_.ConsumeIntegralInRange<int>(0, 3) : 0;
    if (mode <= 1) {
      // RunLayer: resolve, copy and (mode 1) assemble.
      void* assembled = mode == 1 ? layer_[leader].assembled.data() : nullptr;
      const Status s =
          m_->RunLayer(leader, gs.topk.data(), gs.slots.data(), assembled, nullptr, stride_arg);
      ExpectCode(s, StatusCode::kOk, "RunLayer");
      layer_[leader].copied = true;
      if (mode == 1) layer_[leader].assembled_when = 2;
    } else {
      gs.has_fill = mode == 3;
      ++reached.split_resolves;
      const Status s =
          m_->ResolveLayer(leader, gs.topk.data(), gs.slots.data(),
                           gs.has_fill ? gs.fill.data() : nullptr, nullptr, stride_arg);
      ExpectCode(s, StatusCode::kOk, "ResolveLayer");
      // Rows not filled by the miss copy are readable now.
      if (gs.has_fill) CheckSlots(leader, /*only_unfilled=*/true);
    }
    gs.resolved = true;
    CountResolve(leader, gs.topk, gs.stride);
  }

  // The group's top-k rows ([max_batch, gs.stride]) from the input (else padding).
  void FillTopK(GroupState& gs, bool choose) {
    gs.topk.assign(static_cast<size_t>(max_batch_) * gs.stride, 0);
    for (int32_t b = 0; b < max_batch_; ++b) {
      std::vector<int32_t> row;
      const int32_t len = b < static_cast<int32_t>(batch_.size()) ? live_.at(batch_[b]).len() : 1;
      for (int32_t k = 0; k < gs.stride; ++k) {
        // Entries past top_k and rows past the batch must be ignored: anything goes there.
        const int32_t p = choose ? TopKEntry(len, row) : kPaddingPosition;
        gs.topk[b * gs.stride + k] = p;
        row.push_back(p);
      }
    }
  }

  // ---- Steps through StepSchedule ----

  // A choice for ScheduleOptions::fixed from the input: the prefetch on or off, on the options'
  // grid, the bounded one or any other (negative ones refused), the planned copy likewise
  // (refused with one layer per index group), chunks of multiples of copy_chunk_rows up to past
  // the batch, or of any size (refused unless such a multiple).
  StepChoice PickChoice() {
    StepChoice c;
    // One byte: its low bit the prefetch; the planned copy from its high values (so that inputs
    // written before it decode as they did, unless their byte was one of those).
    const int byte = in_.ConsumeIntegralInRange<int>(0, 255);
    c.crosslayer_prefetch = byte % 2 == 1;
    switch (byte / 2 % 8) {
      case 4:
        c.planned_copy = true;
        break;
      case 5:
        c.planned_copy = true;
        c.planned_copy_blocks = kBoundedPrefetchCopyBlocks;
        break;
      case 6:
        c.planned_copy = true;
        c.planned_copy_blocks = SmallInt(1, 64);
        break;
      case 7:
        c.planned_copy = true;
        c.planned_copy_blocks = -SmallInt(1, 2);
        break;
      default:
        break;
    }
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        break;
      case 1:
        c.prefetch_copy_blocks = kBoundedPrefetchCopyBlocks;
        break;
      case 2:
        c.prefetch_copy_blocks = SmallInt(1, 64);
        break;
      default:
        c.prefetch_copy_blocks = -SmallInt(1, 2);
        break;
    }
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        break;
      case 1:
      case 2:
        c.chunk_rows = std::max(o_.copy_chunk_rows, 1) * SmallInt(1, max_batch_ + 1);
        break;
      default:
        c.chunk_rows = SmallInt(-1, max_batch_ + 2);
        break;
    }
    return c;
  }
  bool ChoiceAllowed(const StepChoice& c) const {
    const bool prefetch = groups_ > 1 && o_.max_prefetch >= o_.top_k;
    if (c.crosslayer_prefetch && (!prefetch || c.prefetch_copy_blocks < 0)) return false;
    // The planned copy needs an index group of several layers (layers_per_index <= layers).
    if (c.planned_copy && (lpi_ < 2 || c.planned_copy_blocks < 0)) return false;
    return c.chunk_rows == 0 ||
           (c.chunk_rows > 0 && o_.copy_chunk_rows > 0 && c.chunk_rows % o_.copy_chunk_rows == 0);
  }

  // Every top-k entry of batch rows [first, first + rows) of `layer` that has a slot names the
  // model's row there: what the engine's attention over the slice reads when it is called.
  void CheckAttended(int32_t layer, int32_t first, int32_t rows) {
    const GroupState& gs = group_[layer / lpi_];
    const LayerShape shape = o_.geometry.layers[layer];
    for (int32_t b = first; b < first + rows; ++b) {
      const Req& r = live_.at(batch_[b]);
      for (int32_t k = 0; k < o_.top_k; ++k) {
        const int32_t p = gs.topk[b * gs.stride + k];
        const int32_t slot = gs.slots[b * o_.top_k + k];
        const std::string where = "attention of layer " + std::to_string(layer) + " request " +
                                  std::to_string(batch_[b]) + " position " + std::to_string(p) +
                                  " slot " + std::to_string(slot);
        if (p < 0 || p >= r.len()) {
          FUZZ_CHECK(slot == kNullSlot, where + ": a skipped entry has a slot");
          continue;
        }
        if (slot == kNullSlot) continue;  // a repeat, without share_repeated_positions
        FUZZ_CHECK(slot >= 0 && slot < m_->HotLayerRows(), where + ": out of the hot cache");
        const std::byte* row = m_->HotLayer(layer) + static_cast<int64_t>(slot) * shape.row_stride;
        FUZZ_CHECK(RowIs(row, r.seeds[p], layer, shape.row_bytes), where + ": wrong bytes");
      }
    }
  }

  // A whole decode step through StepSchedule: in a choice the input forces (refused where the
  // options do not allow it), or in the schedule's own (calibrating, then the fastest). The
  // schedule's attention calls must tile the batch in the choice's slices, each reading the
  // model's rows. For some inputs one slice's attention fails: the step then goes on to
  // FinishStep, or AbortStep ends it and the step's requests are released (their later layers
  // hold zero rows for the step's token). Out-of-order calls and a top-k the prefetch cannot
  // read are refused on the way.
  bool ScheduledStep() {
    std::unique_ptr<StepSchedule> fixed;
    StepSchedule* schedule = nullptr;
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      if (auto_schedule_ == nullptr) {
        ScheduleOptions so;
        so.trials = SmallInt(1, 3);
        StatusOr<std::unique_ptr<StepSchedule>> made = StepSchedule::Create(*m_, so);
        FUZZ_CHECK(made.ok(), Code(made.status()));
        auto_schedule_ = std::move(*made);
      }
      schedule = auto_schedule_.get();
    } else {
      ScheduleOptions so;
      so.fixed = PickChoice();
      StatusOr<std::unique_ptr<StepSchedule>> made = StepSchedule::Create(*m_, so);
      ExpectCode(made.status(),
                 ChoiceAllowed(*so.fixed) ? StatusCode::kOk : StatusCode::kInvalidArgument,
                 ("StepSchedule::Create " + so.fixed->ToString()).c_str());
      if (!made.ok()) return false;
      fixed = std::move(*made);
      schedule = fixed.get();
    }
    if (!Plan(schedule)) return false;
    ++reached.scheduled_steps;
    if (schedule->choice().planned_copy) ++reached.planned_steps;
    const StepChoice choice = schedule->choice();
    const int32_t batch = static_cast<int32_t>(batch_.size());
    const int32_t slice = choice.chunk_rows > 0 ? choice.chunk_rows : batch;
    const int32_t slices = (batch + slice - 1) / slice;
    int32_t fail_layer = -1, fail_slice = -1;
    bool abort = false;
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      fail_layer = SmallInt(0, layers_ - 1);
      fail_slice = SmallInt(0, slices - 1);
      abort = in_.ConsumeBool();
    }
    const AttendFn ok = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
    int32_t aborted_at = -1;
    for (int32_t l = 0; l < layers_; ++l) {
      const int32_t g = l / lpi_;
      GroupState& gs = group_[g];
      const bool leader = l % lpi_ == 0;
      int32_t stride_arg = 0;
      if (leader) {
        gs.stride = o_.top_k + (choice.crosslayer_prefetch ? 0 : SmallInt(0, 2));
        FillTopK(gs, /*choose=*/true);
        stride_arg = gs.stride == o_.top_k && in_.ConsumeBool() ? 0 : gs.stride;
      }
      LayerWork work{layer_[l].new_rows.data(), keys_ > 0 ? layer_[l].new_keys.data() : nullptr,
                     gs.topk.data(), stride_arg, gs.slots.data()};
      switch (in_.ConsumeIntegralInRange<int>(0, 15)) {
        case 0:  // out of order
          ExpectCode(schedule->RunLayer(l + 1 + SmallInt(0, 1), work, ok, nullptr),
                     StatusCode::kFailedPrecondition, "StepSchedule::RunLayer out of order");
          break;
        case 1:  // before every layer ran
          ExpectCode(schedule->FinishStep(nullptr), StatusCode::kFailedPrecondition,
                     "StepSchedule::FinishStep");
          break;
        case 2:
          if (leader && choice.crosslayer_prefetch) {
            LayerWork wide = work;
            wide.topk_stride = o_.top_k + 1;
            ExpectCode(schedule->RunLayer(l, wide, ok, nullptr), StatusCode::kInvalidArgument,
                       "StepSchedule::RunLayer with a top-k stride the prefetch cannot read");
          }
          break;
        default:
          break;
      }
      int32_t next_first = 0, index = 0;
      std::string misplaced;
      const AttendFn attend = [&](int32_t layer, int32_t first, int32_t rows,
                                  StreamHandle) -> Status {
        if (layer != l || first != next_first || rows != std::min(slice, batch - first)) {
          misplaced = "attention of layer " + std::to_string(layer) + " over [" +
                      std::to_string(first) + ", +" + std::to_string(rows) + ") in layer " +
                      std::to_string(l) + " at row " + std::to_string(next_first);
        }
        next_first += rows;
        if (l == fail_layer && index++ == fail_slice) return Unavailable("attention failed");
        CheckAttended(l, first, rows);
        return Status::Ok();
      };
      const Status s = schedule->RunLayer(l, work, attend, nullptr);
      FUZZ_CHECK(misplaced.empty(), misplaced);
      const bool fails = l == fail_layer;
      ExpectCode(s, fails ? StatusCode::kUnavailable : StatusCode::kOk, "StepSchedule::RunLayer");
      const int32_t attended = fails ? std::min(batch, (fail_slice + 1) * slice) : batch;
      FUZZ_CHECK(next_first == attended, "attention over " + std::to_string(next_first) +
                                             " rows of " + std::to_string(attended));
      layer_[l].appended = layer_[l].copied = true;
      if (leader) {
        gs.resolved = true;
        CountResolve(l, gs.topk, gs.stride);
        if (choice.crosslayer_prefetch && g + 1 < groups_) CountPrefetchLookups(gs);
      }
      if (fails) ++reached.failed_attention;
      if (fails && abort) {
        aborted_at = l;
        break;
      }
    }
    if (aborted_at >= 0) {
      if (aborted_at + 1 < layers_) {
        ExpectCode(schedule->FinishStep(nullptr), StatusCode::kFailedPrecondition,
                   "StepSchedule::FinishStep of a step with layers to run");
      }
      ExpectCode(schedule->AbortStep(nullptr), StatusCode::kOk, "StepSchedule::AbortStep");
      ExpectCode(schedule->AbortStep(nullptr), StatusCode::kFailedPrecondition,
                 "StepSchedule::AbortStep twice");
      // The groups AbortStep resolved, with an all-padding top-k.
      const std::vector<int32_t> padding(static_cast<size_t>(max_batch_) * o_.top_k,
                                         kPaddingPosition);
      for (int32_t leader = (aborted_at / lpi_ + 1) * lpi_; leader < layers_; leader += lpi_) {
        CountResolve(leader, padding, o_.top_k);
      }
      ++reached.aborted_steps;
      ++finished_steps_;
      step_open_ = false;
      // The step's token holds zero rows in the layers after aborted_at: an engine that drops
      // the step's output releases its requests.
      for (RequestId id : batch_) {
        ExpectCode(m_->Release(id), StatusCode::kOk, "Release after AbortStep");
        live_.erase(id);
        history_ids_.erase(id);
      }
      batch_.clear();
      return true;
    }
    ExpectCode(schedule->FinishStep(nullptr), StatusCode::kOk, "StepSchedule::FinishStep");
    CheckStep();
    ++reached.steps;
    ++finished_steps_;
    step_open_ = false;
    batch_.clear();
    return true;
  }

  // The cross-layer prefetch's lookups: each batch row's distinct positions in range.
  void CountPrefetchLookups(const GroupState& gs) {
    for (size_t b = 0; b < batch_.size(); ++b) {
      const int32_t len = live_.at(batch_[b]).len();
      std::set<int32_t> seen;
      for (int32_t k = 0; k < o_.top_k; ++k) {
        const int32_t p = gs.topk[b * gs.stride + k];
        prefetch_lookups_ += p >= 0 && p < len && seen.insert(p).second;
      }
    }
  }

  void Prefetch(int32_t g, bool choose) {
    const int32_t count = choose ? SmallInt(1, o_.max_prefetch) : 1;
    std::vector<int32_t> positions(static_cast<size_t>(max_batch_) * count);
    std::vector<int32_t> row;
    for (int32_t b = 0; b < max_batch_; ++b) {
      row.clear();
      const int32_t len = b < static_cast<int32_t>(batch_.size()) ? live_.at(batch_[b]).len() : 1;
      for (int32_t i = 0; i < count; ++i) {
        positions[b * count + i] = choose ? TopKEntry(len, row) : kPaddingPosition;
        row.push_back(positions[b * count + i]);
      }
      if (b >= static_cast<int32_t>(batch_.size())) continue;
      std::set<int32_t> seen;
      for (int32_t p : row) prefetch_lookups_ += p >= 0 && p < len && seen.insert(p).second;
    }
    const Status s = m_->PrefetchLayer(g * lpi_, positions.data(), count, nullptr);
    ExpectCode(s, StatusCode::kOk, "PrefetchLayer");
    group_[g].prefetched = true;
    ++reached.prefetches;
  }

  // A run-phase call that the API documents as an error in the current state.
  bool BadRunCall() {
    std::vector<std::byte> rows(4096, std::byte{0});
    std::vector<int32_t> topk(static_cast<size_t>(max_batch_) * o_.top_k * 2, 0);
    std::vector<int32_t> slots(topk.size(), 0);
    const int32_t layer = PickLayer();
    const bool bad_layer = layer < 0 || layer >= layers_;
    const int which = in_.ConsumeIntegralInRange<int>(0, 9);
    Status s;
    StatusCode want = StatusCode::kFailedPrecondition;
    const char* op = "";
    if (!step_open_) {
      op = "a run-phase call outside a step";
      switch (which) {
        case 0:
          s = m_->AppendToken(0, rows.data(), nullptr);
          break;
        case 1:
          s = m_->RunLayer(0, topk.data(), slots.data(), nullptr, nullptr);
          break;
        case 2:
          s = m_->CopyMisses(0, nullptr);
          break;
        case 3:
          s = m_->AssembleLayer(0, slots.data(), rows.data(), nullptr);
          break;
        case 4:
          s = m_->FinishReplayedStep();
          break;
        default:
          s = m_->FinishStep(nullptr);
          break;
      }
      ExpectCode(s, want, op);
      return false;
    }
    switch (which) {
      case 0:
        op = "AppendToken of a bad or appended layer";
        if (!bad_layer && !layer_[layer].appended) return false;
        want = bad_layer ? StatusCode::kInvalidArgument : StatusCode::kFailedPrecondition;
        s = m_->AppendToken(layer, rows.data(), rows.data(), nullptr);  // keys, where any
        break;
      case 1:
        op = "ResolveLayer of a bad, non-leading or unappended layer, out of order, twice, or "
             "into the miss list of a group two back that is not copied";
        if (bad_layer) {
          want = StatusCode::kInvalidArgument;
        } else if (layer % lpi_ == 0 && layer_[layer].appended && layer / lpi_ == NextGroup() &&
                   (layer / lpi_ < 2 || GroupCopied(layer / lpi_ - 2))) {
          return false;
        }
        s = m_->ResolveLayer(layer, topk.data(), slots.data(), nullptr, nullptr);
        break;
      case 2:
        op = "CopyMisses of a bad, unresolved or copied layer, or one with a chunk copied";
        if (bad_layer) {
          want = StatusCode::kInvalidArgument;
        } else if (group_[layer / lpi_].resolved && !layer_[layer].copied &&
                   !layer_[layer].any_chunk()) {
          return false;
        }
        s = m_->CopyMisses(layer, nullptr);
        break;
      case 3:
        op = "FinishStep with a layer not appended, a group not resolved or a layer not copied";
        if (NextAppend() == layers_ && NextGroup() == groups_ && AllCopied()) return false;
        s = m_->FinishStep(nullptr);
        break;
      case 4:
        op = "PlanStep in an open step";
        s = m_->PlanStep(batch_, nullptr);
        break;
      case 5: {
        op = "PrefetchLayer with a bad count or layer, or between a resolve and its copies";
        int32_t count = in_.ConsumeBool() ? 0 : o_.max_prefetch + 1;
        want = !bad_layer && layer % lpi_ != 0 ? StatusCode::kFailedPrecondition
                                               : StatusCode::kInvalidArgument;
        if (!bad_layer && layer % lpi_ == 0 && o_.max_prefetch > 0 &&
            group_[layer / lpi_].resolved && !GroupCopied(layer / lpi_)) {
          count = 1;  // a legal count: the order is what is refused
          want = StatusCode::kFailedPrecondition;
        }
        s = m_->PrefetchLayer(layer, topk.data(), count, nullptr);
        break;
      }
      case 6:
        op = "AssembleLayer of a bad, unresolved or unappended layer";
        if (bad_layer) {
          want = StatusCode::kInvalidArgument;
        } else if (group_[layer / lpi_].resolved && layer_[layer].appended) {
          return false;
        }
        s = m_->AssembleLayer(layer, slots.data(), rows.data(), nullptr);
        break;
      case 8: {
        op = "CopyMissChunk without chunks, of a bad layer or chunk, unresolved, copied twice or "
             "after CopyMisses";
        const int32_t chunk = in_.ConsumeBool() ? SmallInt(-1, Chunks()) : SmallInt(0, 2);
        if (bad_layer) {
          want = StatusCode::kInvalidArgument;
        } else if (o_.copy_chunk_rows == 0) {
          want = StatusCode::kFailedPrecondition;
        } else if (chunk < 0 || chunk >= Chunks()) {
          want = StatusCode::kInvalidArgument;
        } else if (group_[layer / lpi_].resolved && !layer_[layer].chunk_copied[chunk] &&
                   (!layer_[layer].copied || layer_[layer].any_chunk())) {
          return false;  // legal
        }
        s = m_->CopyMissChunk(layer, chunk, nullptr);
        break;
      }
      case 7:
        op = "FinishReplayedStep in a step the host runs, or with no run phase recorded";
        if (finished_steps_ > 0 && std::none_of(layer_.begin(), layer_.end(),
                                                [](const LayerState& l) { return l.appended; })) {
          return false;  // legal: it would close the step without its run phase
        }
        s = m_->FinishReplayedStep();
        break;
      default: {
        op = "a lifecycle call on a request of the open step";
        const RequestId id = batch_[SmallInt(0, static_cast<int32_t>(batch_.size()) - 1)];
        switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
          case 0:
            s = m_->Release(id);
            break;
          case 1:
            s = m_->Retract(id);
            break;
          case 2:
            s = m_->Retain(id).status();
            break;
          default:
            s = m_->Fork(id, 1000 + id, 0, nullptr);
            break;
        }
        break;
      }
    }
    ExpectCode(s, want, op);
    return false;
  }

  // ---- Checks ----

  Snapshot Take() const {
    Snapshot s;
    for (const auto& [id, r] : live_) {
      StatusOr<std::vector<int32_t>> pages = m_->HostPages(id);
      StatusOr<int32_t> len = m_->SequenceLength(id);
      FUZZ_CHECK(pages.ok() && len.ok(), "request " + std::to_string(id) + " is unknown");
      s.pages[id] = *pages;
      s.lengths[id] = *len;
    }
    for (const auto& [id, seeds] : retained_) {
      StatusOr<std::vector<int32_t>> pages = m_->HostPages(id);
      FUZZ_CHECK(pages.ok(), "retained conversation " + std::to_string(id) + " is unknown");
      s.pages[id] = *pages;
    }
    StatusOr<CacheStats> stats = m_->ReadStats(nullptr);
    FUZZ_CHECK(stats.ok(), Code(stats.status()));
    s.host_pages_used = stats->host_pages_used;
    s.hot_blocks_used = stats->hot_blocks_used;
    s.retained = stats->retained_conversations;
    return s;
  }

  // Every live request's history and every retained conversation, in the host pool.
  void CheckPool() const {
    const HostKVPool& pool = m_->host_pool();
    const int32_t pt = o_.host_page_tokens;
    auto check = [&](RequestId id, const std::vector<uint64_t>& seeds, int32_t upto) {
      StatusOr<std::vector<int32_t>> pages = m_->HostPages(id);
      FUZZ_CHECK(pages.ok(), Code(pages.status()));
      FUZZ_CHECK(static_cast<int64_t>(pages->size()) * pt >= upto, "too few host pages");
      for (int32_t l = 0; l < layers_; ++l) {
        for (int32_t p = 0; p < upto; ++p) {
          const std::byte* row = pool.row(l, (*pages)[p / pt] * pt + p % pt);
          FUZZ_CHECK(RowIs(row, seeds[p], l, o_.geometry.layers[l].row_bytes),
                     "request " + std::to_string(id) + " layer " + std::to_string(l) +
                         " position " + std::to_string(p) + " is wrong in the host pool");
        }
      }
    };
    for (const auto& [id, r] : live_) {
      // Prompt rows are in the pool once ingested; the open step's token after FinishStep.
      if (r.ingested_count != layers_) {
        StatusOr<std::vector<int32_t>> pages = m_->HostPages(id);
        FUZZ_CHECK(pages.ok(), Code(pages.status()));
        continue;
      }
      check(id, r.seeds, InStep(id) ? r.len() - 1 : r.len());
    }
    for (const auto& [id, seeds] : retained_) {
      StatusOr<std::vector<int32_t>> pages = m_->HostPages(id);
      FUZZ_CHECK(pages.ok() &&
                     static_cast<int64_t>(pages->size()) * pt == static_cast<int64_t>(seeds.size()),
                 "retained conversation " + std::to_string(id) + " changed size");
      check(id, seeds, static_cast<int32_t>(seeds.size()));
    }
  }

  // The slots of the group of `leader` for the open step, checked in every layer of the group
  // that is complete (or, with only_unfilled, the leader's rows that the miss copy does not fill).
  void CheckSlots(int32_t leader, bool only_unfilled) {
    const GroupState& gs = group_[leader / lpi_];
    const int32_t per_block = o_.slots_per_request();
    // With device pages (hybrid residency, indexer keys) a block's slots lie in its pages, and a
    // resident request's in its own: then only what every slot must be is checked (its row, and
    // no slot of another position of the step).
    const bool paged = device_paged();
    std::set<int32_t> blocks, step_slots;
    for (size_t b = 0; b < batch_.size(); ++b) {
      const Req& r = live_.at(batch_[b]);
      const int32_t len = r.len();
      std::map<int32_t, int32_t> first;  // position -> slot of its first entry
      std::set<int32_t> used;
      int32_t block = -1;
      for (int32_t k = 0; k < o_.top_k; ++k) {
        const size_t i = b * o_.top_k + k;
        const int32_t p = gs.topk[b * gs.stride + k];
        const int32_t slot = gs.slots[i];
        const std::string where = "request " + std::to_string(batch_[b]) + " layer " +
                                  std::to_string(leader) + " k " + std::to_string(k) +
                                  " position " + std::to_string(p) + " of " + std::to_string(len) +
                                  " slot " + std::to_string(slot);
        const bool in_range = p >= 0 && p < len;
        const bool repeat = in_range && first.contains(p);
        const bool valid = in_range && (!repeat || o_.share_repeated_positions);
        if (!valid) {
          FUZZ_CHECK(slot == kNullSlot, where + ": a skipped entry has a slot");
          if (gs.has_fill) FUZZ_CHECK(gs.fill[i] == 0, where + ": fill of a skipped entry");
          continue;
        }
        FUZZ_CHECK(slot >= 0 && slot < m_->HotLayerRows(), where + ": a valid entry has no slot");
        if (!paged) {
          if (block < 0) block = slot / per_block;
          FUZZ_CHECK(slot / per_block == block, where + ": slots of one request in two blocks");
        }
        if (repeat) {
          FUZZ_CHECK(slot == first[p], where + ": a repeat does not share its first slot");
        } else {
          FUZZ_CHECK(used.insert(slot).second, where + ": two positions share a slot");
          FUZZ_CHECK(step_slots.insert(slot).second, where + ": two requests share a slot");
          first[p] = slot;
        }
        const bool window = p >= len - o_.window;
        if (!paged && window) {
          FUZZ_CHECK(slot == block * per_block + o_.hot_slots + p % o_.window,
                     where + ": not the window slot");
        } else if (!paged) {
          FUZZ_CHECK(slot % per_block < o_.hot_slots, where + ": a window slot for an old token");
        }
        if (gs.has_fill) {
          FUZZ_CHECK(!(window && gs.fill[i] != 0), where + ": fill of a window entry");
          if (only_unfilled && gs.fill[i] != 0) continue;
        }
        const int32_t last = only_unfilled ? leader + 1 : GroupEnd(leader / lpi_);
        for (int32_t l = leader; l < last; ++l) {
          const LayerShape shape = o_.geometry.layers[l];
          const std::byte* row = m_->HotLayer(l) + static_cast<int64_t>(slot) * shape.row_stride;
          FUZZ_CHECK(RowIs(row, r.seeds[p], l, shape.row_bytes),
                     where + ": wrong bytes in layer " + std::to_string(l));
          const LayerState& ls = layer_[l];
          const bool assembled_meaningful =
              ls.assembled_when == 2 || (ls.assembled_when == 1 && gs.has_fill && gs.fill[i] == 0);
          if (!only_unfilled && assembled_meaningful) {
            FUZZ_CHECK(
                RowIs(ls.assembled.data() + i * shape.row_stride, r.seeds[p], l, shape.row_bytes),
                where + ": wrong assembled row in layer " + std::to_string(l));
          }
        }
      }
      if (block >= 0) FUZZ_CHECK(blocks.insert(block).second, "two requests share a block");
    }
    if (only_unfilled) return;
    // Skipped entries assemble to zero rows.
    for (int32_t l = leader; l < GroupEnd(leader / lpi_); ++l) {
      const LayerShape shape = o_.geometry.layers[l];
      if (layer_[l].assembled_when == 0) continue;
      for (size_t i = 0; i < batch_.size() * o_.top_k; ++i) {
        if (gs.slots[i] != kNullSlot) continue;
        const std::byte* row = layer_[l].assembled.data() + i * shape.row_stride;
        FUZZ_CHECK(
            std::all_of(row, row + shape.row_bytes, [](std::byte x) { return x == std::byte{0}; }),
            "a skipped entry's assembled row is not zero in layer " + std::to_string(l));
      }
    }
  }

  void CheckStep() {
    for (int32_t g = 0; g < groups_; ++g) CheckSlots(g * lpi_, /*only_unfilled=*/false);
    CheckKeys();
  }

  // Every indexer key of every position of the step's requests, through IndexerKeys (the CPU
  // backend's device memory is host memory).
  void CheckKeys() {
    if (keys_ == 0) return;
    std::vector<std::byte> want(keys_);
    for (int32_t l = 0; l < layers_; ++l) {
      const IndexerKeyView v = m_->IndexerKeys(l);
      FUZZ_CHECK(*v.batch_size == static_cast<int32_t>(batch_.size()), "key view batch size");
      for (size_t b = 0; b < batch_.size(); ++b) {
        const Req& r = live_.at(batch_[b]);
        for (int32_t p = 0; p < r.len(); ++p) {
          FillKey(want.data(), r.seeds[p], l, keys_);
          FUZZ_CHECK(std::memcmp(v.Key(v.batch[b].page_table_row, p), want.data(), keys_) == 0,
                     "request " + std::to_string(batch_[b]) + " layer " + std::to_string(l) +
                         " position " + std::to_string(p) + ": wrong indexer key");
        }
      }
    }
  }

  void CheckStats(const CacheStats& s) const {
    FUZZ_CHECK(static_cast<int32_t>(s.layers.size()) == layers_, "stats have no layer rows");
    for (int32_t l = 0; l < layers_; ++l) {
      const LayerStats& a = s.layers[l];
      const int32_t leader = Leader(l);
      const std::string where = "layer " + std::to_string(l);
      FUZZ_CHECK(a.hits + a.window_hits + a.resident_hits + a.misses + a.padding + a.duplicates +
                         a.out_of_range ==
                     entries_[leader],
                 where + ": stats do not count every top-k entry once");
      FUZZ_CHECK(a.padding == padding_[leader], where + ": padding count");
      FUZZ_CHECK(a.out_of_range == out_of_range_[leader], where + ": out-of-range count");
      FUZZ_CHECK(a.duplicates == duplicates_[leader], where + ": duplicate count");
      FUZZ_CHECK(a.window_hits == window_hits_[leader], where + ": window-hit count");
      FUZZ_CHECK(a.resident_hits == resident_hits_[leader], where + ": resident-hit count");
    }
    FUZZ_CHECK(s.invalid_copy_entries == 0, "copies skipped as out of bounds");
    FUZZ_CHECK(s.prefetch_lookups == prefetch_lookups_, "prefetch lookup count");
    FUZZ_CHECK(s.prefetch_rows <= s.prefetch_lookups, "prefetched rows exceed lookups");
    FUZZ_CHECK(s.prefetch_useful_rows + s.prefetch_wasted_rows <= s.prefetch_rows,
               "more prefetched rows used or wasted than prefetched");
    FUZZ_CHECK(s.hot_blocks_used + s.resident_requests == LiveBlocks(),
               "hot-cache blocks and resident requests");
    FUZZ_CHECK(s.retained_conversations == static_cast<int32_t>(retained_.size()),
               "retained conversations");
    FUZZ_CHECK(s.host_pages_used <= s.host_pages_total, "more pages used than exist");
  }

  void CheckAll() {
    StatusOr<CacheStats> s = m_->ReadStats(nullptr);
    FUZZ_CHECK(s.ok(), Code(s.status()));
    CheckStats(*s);
    CheckPool();
    for (const auto& [id, r] : live_) {
      StatusOr<int32_t> len = m_->SequenceLength(id);
      FUZZ_CHECK(len.ok() && *len == r.len(), "sequence length of " + std::to_string(id));
    }
    FUZZ_CHECK(m_->batch_size() == static_cast<int32_t>(batch_.size()) || !step_open_,
               "batch size");
  }

  FuzzedDataProvider& in_;
  const CacheOptions o_;
  std::shared_ptr<Backend> backend_;
  // The regions lent (they outlive the manager's mappings: declared before it) and those
  // imported, by index.
  std::vector<std::unique_ptr<PeerRegion>> regions_;
  std::map<int32_t, PeerRegion*> imported_;
  bool peer_ = false;
  std::unique_ptr<SparseKVCacheManager> m_;
  // The schedule that chooses for itself (its calibration spans the input's scheduled steps).
  std::unique_ptr<StepSchedule> auto_schedule_;
  const int32_t layers_, lpi_, groups_, max_batch_;
  // With hybrid residency or indexer keys, the device's pages decide admissions too: where the
  // host-side checks allow one, it may still be refused with ResourceExhausted.
  const bool hybrid_;
  const int32_t keys_;  // indexer_key_bytes
  bool device_paged() const { return hybrid_ || keys_ > 0; }
  std::map<RequestId, Req> live_;
  std::map<RequestId, std::vector<uint64_t>> retained_;  // row seeds of the retained positions
  // Token ids of tracked histories (live or retained), to continue them.
  std::map<RequestId, std::vector<int32_t>> history_ids_;
  uint64_t salt_ = 0;
  bool step_open_ = false;
  int32_t finished_steps_ = 0;  // steps FinishStep ended: a complete run phase is recorded
  std::vector<RequestId> batch_;
  std::vector<LayerState> layer_;
  std::vector<GroupState> group_;
  // Expected statistics per leading layer.
  std::vector<uint64_t> entries_, padding_, out_of_range_, duplicates_, window_hits_,
      resident_hits_;
  uint64_t prefetch_lookups_ = 0;
};

CacheOptions DecodeOptions(FuzzedDataProvider& in) {
  static const LayerShape kShapes[] = {{8, 8}, {7, 8}, {24, 32}, {3, 3}, {16, 16}};
  CacheOptions o;
  const int32_t layers = in.ConsumeIntegralInRange<int32_t>(1, 4);
  for (int32_t l = 0; l < layers; ++l) {
    o.geometry.layers.push_back(kShapes[in.ConsumeIntegralInRange<int>(0, 4)]);
  }
  o.top_k = in.ConsumeIntegralInRange<int32_t>(1, 6);
  o.hot_slots = o.top_k + in.ConsumeIntegralInRange<int32_t>(0, 5);
  o.window = in.ConsumeIntegralInRange<int32_t>(1, 3);
  // kLru, kSegmentedLru or kClock (one byte, as the choice between the first two took).
  o.eviction = static_cast<EvictionPolicy>(in.ConsumeIntegralInRange<int>(0, 2));
  // One byte: protected_percent, and the fused copy (each request's resolve copies its misses)
  // in every step, in steps of two requests or more, or never (the default's 80, above every
  // batch here) from the byte's high values (so that inputs written before it decode as they
  // did, unless their byte was one of those).
  const int32_t percent_and_fused = in.ConsumeIntegralInRange<int32_t>(0, 255);
  o.protected_percent = percent_and_fused % 101;
  if (percent_and_fused > 100) o.fused_copy_min_batch = percent_and_fused / 101;
  o.host_page_tokens = 1 << in.ConsumeIntegralInRange<int>(1, 3);
  o.max_requests = in.ConsumeIntegralInRange<int32_t>(1, 3);
  o.max_host_requests = o.max_requests + in.ConsumeIntegralInRange<int32_t>(0, 2);
  o.max_batch = in.ConsumeIntegralInRange<int32_t>(1, o.max_requests);
  o.max_context = in.ConsumeIntegralInRange<int32_t>(8, 40);
  o.host_capacity_tokens = in.ConsumeIntegralInRange<int64_t>(8, 96);
  o.layers_per_index = in.ConsumeIntegralInRange<int32_t>(1, std::min(3, layers));
  o.share_repeated_positions = in.ConsumeBool();
  o.max_prefetch = in.ConsumeIntegralInRange<int32_t>(0, std::min(3, o.hot_slots));
  o.sort_misses = in.ConsumeBool();
  o.sort_misses_min_batch = in.ConsumeIntegralInRange<int32_t>(0, 2);
  // Copy chunks of 1 .. max_batch rows (0: one miss list) for about half of the inputs.
  o.copy_chunk_rows = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, o.max_batch) : 0;
  // Hybrid residency and indexer keys (where every layer has one row_stride, a multiple of 4),
  // each for about a quarter of the inputs: the device memory in pages, exactly max_requests
  // blocks (and their keys), or a budget with room for resident requests too.
  o.hybrid_residency = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  bool uniform = true;
  for (const LayerShape& l : o.geometry.layers) {
    uniform = uniform && l.row_stride == o.geometry.layers[0].row_stride && l.row_stride % 4 == 0;
  }
  if (uniform && in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.indexer_key_bytes = 4 * in.ConsumeIntegralInRange<int32_t>(1, 2);  // <= every stride
  }
  if (o.hybrid_residency || o.indexer_key_bytes > 0) {
    o.resident_page_rows = in.ConsumeIntegralInRange<int32_t>(1, o.hot_slots + o.window);
    if (in.ConsumeBool()) {
      // The least budget that holds the blocks (and keys), then up to three times it.
      for (int64_t budget = 256; budget <= (int64_t{1} << 24); budget *= 2) {
        CacheOptions with = o;
        with.device_budget_bytes = budget;
        if (ChooseHotCacheShape(with).ok()) {
          o.device_budget_bytes = budget * in.ConsumeIntegralInRange<int64_t>(1, 3);
          break;
        }
      }
    }
  }
  return o;
}

}  // namespace
}  // namespace sparsekv

extern "C" void ManagerFuzzPrintReached() {
  const sparsekv::Reached& r = sparsekv::reached;
  std::printf(
      "%llu inputs: %llu steps, %llu split resolves, %llu chunk copies, %llu prefetches, "
      "%llu prefix hits, %llu forks, %llu retained, %llu evictions, %llu copy-on-write pages, "
      "%llu key ingests, %llu promotions, %llu peer imports, %llu peer maps, %llu failed calls, "
      "%llu scheduled steps (%llu with the planned copy), %llu failed attention calls, "
      "%llu aborted steps\n",
      static_cast<unsigned long long>(r.inputs), static_cast<unsigned long long>(r.steps),
      static_cast<unsigned long long>(r.split_resolves),
      static_cast<unsigned long long>(r.chunk_copies),
      static_cast<unsigned long long>(r.prefetches), static_cast<unsigned long long>(r.prefix_hits),
      static_cast<unsigned long long>(r.forks), static_cast<unsigned long long>(r.retained),
      static_cast<unsigned long long>(r.evictions),
      static_cast<unsigned long long>(r.copy_on_write),
      static_cast<unsigned long long>(r.key_ingests), static_cast<unsigned long long>(r.promotions),
      static_cast<unsigned long long>(r.peer_imports), static_cast<unsigned long long>(r.peer_maps),
      static_cast<unsigned long long>(r.errors), static_cast<unsigned long long>(r.scheduled_steps),
      static_cast<unsigned long long>(r.planned_steps),
      static_cast<unsigned long long>(r.failed_attention),
      static_cast<unsigned long long>(r.aborted_steps));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparsekv;
  FuzzedDataProvider in(data, size);
  ++reached.inputs;
  const CacheOptions options = DecodeOptions(in);
  const std::shared_ptr<Backend> backend = CreateCpuBackend();
  StatusOr<std::unique_ptr<SparseKVCacheManager>> m =
      SparseKVCacheManager::Create(options, backend);
  if (!m.ok()) {
    // Only options that ValidateOptions refuses may fail to create (none of the decoded should).
    if (ValidateOptions(options).ok()) Fail("Create failed for valid options: " + Code(m.status()));
    return 0;
  }
  Fuzzer(in, options, backend, std::move(*m)).Run();
  return 0;
}
