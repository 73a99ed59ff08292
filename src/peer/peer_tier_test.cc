// The peer tier on the CPU and the CUDA backend (the latter skips without a GPU), in one process:
// the region is lent by the test itself (its handle names this process; the two-process path
// over CUDA IPC is peer_tier_process_test.cc). Requests whose prompts come from a region decode
// next to local ones, every delivered row checked byte for byte against the dense model; misses
// on mapped pages are shown to be read from the region; a lender that dies costs only speed.
#include "sparsekv/peer_tier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sparsekv/manager.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kLayers = 3;
constexpr int32_t kRowBytes = 80;
constexpr int32_t kTopK = 16;
constexpr int32_t kPageTokens = 16;

// testing::SmallOptions with kLayers layers of kRowBytes-byte rows, kTopK positions per step and
// kPageTokens-token pages (the peer tier maps and routes whole pages), and room for 4 requests of
// up to 512 tokens.
CacheOptions ThreeLayerOptions() {
  CacheOptions o = testing::SmallOptions();
  o.geometry = KVGeometry::Uniform(kLayers, kRowBytes);
  o.top_k = kTopK;
  o.hot_slots = 24;
  o.window = 2;
  o.host_capacity_tokens = 4096;
  o.max_requests = 4;
  o.max_context = 512;
  o.host_page_tokens = kPageTokens;
  return o;
}

// ---- RouteRows ----

struct RouteCase {
  int32_t capacity;
  int32_t count;  // may exceed the capacity or be negative
  int32_t places;
};

// Each list as a sorted multiset of (source, destination): the order within a list is
// unspecified.
std::vector<std::vector<std::pair<int32_t, int32_t>>> Lists(const std::vector<int32_t>& src,
                                                            const std::vector<int32_t>& dst,
                                                            const std::vector<int32_t>& counts,
                                                            int32_t capacity) {
  std::vector<std::vector<std::pair<int32_t, int32_t>>> lists(counts.size());
  for (size_t t = 0; t < counts.size(); ++t) {
    for (int32_t j = 0; j < counts[t]; ++j) {
      lists[t].emplace_back(src[t * capacity + j], dst[t * capacity + j]);
    }
    std::sort(lists[t].begin(), lists[t].end());
  }
  return lists;
}

class RouteRowsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RouteRowsTest, MatchesTheReferenceWithOutOfRangeRowsAndClampedCounts) {
  std::shared_ptr<Backend> backend =
      GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
  if (backend == nullptr) return;
  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  std::mt19937_64 rng(7);
  const int32_t page_rows = 16;
  const int64_t pages = 40;
  for (const RouteCase& c :
       {RouteCase{5000, 4999, 4}, RouteCase{5000, 1 << 30, 8}, RouteCase{37, 37, 2},
        RouteCase{100, 0, 3}, RouteCase{100, -4, 3}, RouteCase{3001, 3001, 1}}) {
    std::vector<int32_t> place(pages), first(pages), src(c.capacity), dst(c.capacity);
    for (int64_t q = 0; q < pages; ++q) {
      // Places outside [1, places) (0, too large, negative) keep the page in list 0.
      place[q] = std::uniform_int_distribution<int32_t>(-1, c.places + 1)(rng);
      first[q] = std::uniform_int_distribution<int32_t>(0, 1000)(rng);
    }
    for (int32_t i = 0; i < c.capacity; ++i) {
      src[i] = std::uniform_int_distribution<int32_t>(-3, pages * page_rows + 5)(rng);
      dst[i] = i;
    }
    const auto run = [&](Backend& b, std::vector<int32_t>* out_src, std::vector<int32_t>* out_dst,
                         std::vector<int32_t>* counts, unsigned long long* routed) {
      testing::DeviceBuffer d_src(b, src.size() * 4), d_dst(b, dst.size() * 4), d_count(b, 4),
          d_place(b, place.size() * 4), d_first(b, first.size() * 4),
          d_out_src(b, size_t{8} * c.capacity * 4), d_out_dst(b, size_t{8} * c.capacity * 4),
          d_counts(b, 8 * 4), d_routed(b, 8);
      d_src.Upload(src);
      d_dst.Upload(dst);
      d_count.Upload(std::vector<int32_t>{c.count});
      d_place.Upload(place);
      d_first.Upload(first);
      d_out_src.Fill(0xAB);  // poisoned: entries past the counts are never read
      d_out_dst.Fill(0xAB);
      d_counts.Fill(0xAB);
      d_routed.Fill(0);
      RouteRowsView v{};
      v.src_index = d_src.get<int32_t>();
      v.dst_index = d_dst.get<int32_t>();
      v.count = d_count.get<int32_t>();
      v.capacity = c.capacity;
      v.page_place = d_place.get<int32_t>();
      v.page_row = d_first.get<int32_t>();
      v.pages = pages;
      v.page_rows = page_rows;
      v.places = c.places;
      v.out_src = d_out_src.get<int32_t>();
      v.out_dst = d_out_dst.get<int32_t>();
      v.out_count = d_counts.get<int32_t>();
      v.routed = d_routed.get<unsigned long long>();
      ASSERT_TRUE(b.RouteRows(v, nullptr).ok());
      ASSERT_TRUE(b.Synchronize(nullptr).ok());
      *out_src = d_out_src.Download<int32_t>();
      *out_dst = d_out_dst.Download<int32_t>();
      *counts = d_counts.Download<int32_t>();
      counts->resize(c.places);
      *routed = d_routed.Download<unsigned long long>()[0];
    };
    std::vector<int32_t> want_src, want_dst, want_counts, got_src, got_dst, got_counts;
    unsigned long long want_routed = 0, got_routed = 0;
    run(*cpu, &want_src, &want_dst, &want_counts, &want_routed);
    run(*backend, &got_src, &got_dst, &got_counts, &got_routed);
    EXPECT_EQ(got_counts, want_counts) << "capacity " << c.capacity;
    EXPECT_EQ(got_routed, want_routed);
    EXPECT_EQ(Lists(got_src, got_dst, got_counts, c.capacity),
              Lists(want_src, want_dst, want_counts, c.capacity));
    // The reference itself: every entry lands once, routed ones at their page's rows.
    int64_t total = 0;
    for (int32_t n : want_counts) total += n;
    EXPECT_EQ(total, std::clamp(c.count, 0, c.capacity));
    for (int32_t t = 1; t < c.places; ++t) {
      for (int32_t j = 0; j < want_counts[t]; ++j) {
        const int32_t i = want_dst[t * c.capacity + j];
        const int32_t q = src[i] / page_rows;
        EXPECT_EQ(place[q], t);
        EXPECT_EQ(want_src[t * c.capacity + j], first[q] + src[i] % page_rows);
      }
    }
  }
}

TEST_P(RouteRowsTest, RejectsUnsupportedShapes) {
  std::shared_ptr<Backend> backend =
      GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
  if (backend == nullptr) return;
  RouteRowsView v{};
  v.places = kMaxRoutePlaces + 1;
  v.page_rows = 16;
  EXPECT_EQ(backend->RouteRows(v, nullptr).code(), StatusCode::kInvalidArgument);
  v.places = 2;
  v.page_rows = 0;
  EXPECT_EQ(backend->RouteRows(v, nullptr).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, RouteRowsTest, ::testing::Values("cpu", "cuda"));

// ---- Descriptors ----

TEST(PeerRegionDescriptorTest, RoundTripsAndRejectsOtherText) {
  PeerRegionDescriptor d;
  d.pid = 1234;
  d.start_time = 987654321;
  d.generation = 0xfeedbeefcafe;
  d.rows = 4096;
  d.row_strides = {656, 656, 1152};
  d.handle = "cuda 1234 0 140000000 00ff";
  StatusOr<PeerRegionDescriptor> back = PeerRegionDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->pid, d.pid);
  EXPECT_EQ(back->start_time, d.start_time);
  EXPECT_EQ(back->generation, d.generation);
  EXPECT_EQ(back->rows, d.rows);
  EXPECT_EQ(back->row_strides, d.row_strides);
  EXPECT_EQ(back->handle, d.handle);
  for (const std::string& bad : std::vector<std::string>{
           "", "sparsekv-node-pool/1 id=1 path=/dev/shm/x", d.Serialize().substr(0, 40),
           "sparsekv-peer-region/1 pid=1 start=2 generation=0 rows=4 strides=656 handle=x",
           "sparsekv-peer-region/1 pid=1 start=2 generation=3 rows=0 strides=656 handle=x",
           "sparsekv-peer-region/1 pid=1 start=2 generation=3 rows=4 strides=656,-1 handle=x",
           "sparsekv-peer-region/1 pid=1 start=2 generation=3 rows=4 strides=656 handle="}) {
    EXPECT_EQ(PeerRegionDescriptor::Parse(bad).status().code(), StatusCode::kInvalidArgument)
        << bad;
  }
}

// ---- The tier in a manager ----

// Decode steps over a batch, each checked against the dense model.
class Decoder {
 public:
  Decoder(SparseKVCacheManager& manager, uint64_t seed, testing::RunMode mode = {})
      : m_(manager),
        model_(manager.options().geometry),
        driver_(manager, nullptr, mode),
        rng_(seed) {}

  testing::DenseModel& model() { return model_; }
  std::mt19937_64& rng() { return rng_; }

  void Step(const std::vector<RequestId>& batch) {
    const int32_t group = m_.options().layers_per_index;
    std::vector<Bytes> new_rows(kLayers);
    std::vector<std::vector<int32_t>> topk(kLayers);
    for (int32_t l = 0; l < kLayers; ++l) {
      new_rows[l] = testing::RandomRows(rng_, static_cast<int64_t>(batch.size()), kRowBytes);
      if (l % group != 0) {
        topk[l] = topk[l - l % group];
        continue;
      }
      for (RequestId id : batch) {
        const int32_t len = model_.Length(id, l) + 1;  // with this step's token
        std::set<int32_t> picks;
        std::uniform_int_distribution<int32_t> any(0, len - 1);
        while (static_cast<int32_t>(picks.size()) < std::min(kTopK - 2, len)) {
          picks.insert(any(rng_));
        }
        std::vector<int32_t> row(picks.begin(), picks.end());
        std::shuffle(row.begin(), row.end(), rng_);
        row.push_back(len + 3);  // out of range
        row.resize(kTopK, -1);   // padding
        topk[l].insert(topk[l].end(), row.begin(), row.end());
      }
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      for (size_t b = 0; b < batch.size(); ++b) {
        model_.Append(batch[b], l, new_rows[l].data() + b * kRowBytes);
      }
    }
    const std::vector<testing::LayerResult> results = driver_.Step(batch, new_rows, topk);
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(
          testing::CheckLayer(model_, m_.options().geometry, l, batch, topk[l], results[l], kTopK),
          0)
          << "layer " << l;
    }
  }

 private:
  SparseKVCacheManager& m_;
  testing::DenseModel model_;
  testing::StepDriver driver_;
  std::mt19937_64 rng_;
};

class PeerTierTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = GetParam() == "cuda" ? testing::CudaBackendOrSkip() : CreateCpuBackend();
  }
  void TearDown() override {
    manager_.reset();  // before the region it may still map
    region_.reset();
  }

  void Create(const CacheOptions& options, int32_t region_rows = 2048, int32_t max_regions = 1) {
    manager_ = SparseKVCacheManager::Create(options, backend_).value();
    PeerTierOptions tier;
    tier.max_regions = max_regions;
    ASSERT_TRUE(AttachPeerTier(*manager_, tier).ok());
    region_ = PeerRegion::Create(options.geometry, region_rows, backend_).value();
  }
  StatusOr<int32_t> Import(std::string_view descriptor) {
    return ImportPeerRegion(*manager_, descriptor, nullptr);
  }

  // Writes a random prompt of `len` tokens at region rows [first_row, ...), as the lender would,
  // and returns it per layer.
  std::vector<Bytes> LendPrompt(int32_t first_row, int32_t len, std::mt19937_64& rng) {
    std::vector<Bytes> prompt;
    for (int32_t l = 0; l < kLayers; ++l) {
      prompt.push_back(testing::RandomRows(rng, len, kRowBytes));
      EXPECT_TRUE(region_->WriteRows(l, first_row, prompt.back().data(), len, nullptr).ok());
    }
    EXPECT_TRUE(backend_->Synchronize(nullptr).ok());
    return prompt;
  }
  void AdmitPeer(Decoder& d, RequestId id, int32_t region, int32_t first_row, int32_t len) {
    const std::vector<Bytes> prompt = LendPrompt(first_row, len, d.rng());
    const Status s = AdmitFromPeer(*manager_, id, region, first_row, len, 64, nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    d.model().Add(id, prompt, len);
  }
  void AdmitLocal(Decoder& d, RequestId id, int32_t len) {
    ASSERT_TRUE(manager_->Admit(id, len, 64, nullptr).ok());
    std::vector<Bytes> prompt;
    for (int32_t l = 0; l < kLayers; ++l) {
      prompt.push_back(testing::RandomRows(d.rng(), len, kRowBytes));
      ASSERT_TRUE(manager_->IngestPrompt(id, l, prompt.back().data(), nullptr).ok());
    }
    d.model().Add(id, prompt, len);
  }
  uint64_t RowsRead() { return PeerRowsRead(*manager_, nullptr).value(); }
  uint64_t InvalidCopies() { return manager_->ReadStats(nullptr).value().invalid_copy_entries; }

  std::shared_ptr<Backend> backend_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<PeerRegion> region_;
};

TEST_P(PeerTierTest, PeerAndLocalRequestsDecodeByteExactly) {
  if (backend_ == nullptr) return;
  Create(ThreeLayerOptions());
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  Decoder d(*manager_, 11);
  AdmitPeer(d, 1, region, 0, 300);
  AdmitLocal(d, 2, 200);
  AdmitPeer(d, 3, region, 700, 181);  // a partial last page stays read from the host pool
  for (int step = 0; step < 30; ++step) d.Step({1, 2, 3});
  EXPECT_GT(RowsRead(), 0u);
  EXPECT_EQ(InvalidCopies(), 0u);
  // Released requests give their pages back; the step without mapped pages takes the plain path.
  ASSERT_TRUE(manager_->Release(1).ok());
  ASSERT_TRUE(manager_->Release(3).ok());
  d.model().Remove(1);
  d.model().Remove(3);
  const uint64_t before = RowsRead();
  for (int step = 0; step < 5; ++step) d.Step({2});
  EXPECT_EQ(RowsRead(), before);
}

// Pages mapped twice (to two regions) take two references and give back two when the request
// goes: a page reused by the next request is read from the host pool, never from a region that
// holds the first request's rows.
TEST_P(PeerTierTest, PagesMappedToTwoRegionsAreUnmappedWhenTheRequestGoes) {
  if (backend_ == nullptr) return;
  Create(ThreeLayerOptions(), 2048, /*max_regions=*/2);
  const int32_t first = Import(region_->descriptor().Serialize()).value();
  std::unique_ptr<PeerRegion> second_region =
      PeerRegion::Create(ThreeLayerOptions().geometry, 2048, backend_).value();
  const int32_t second = Import(second_region->descriptor().Serialize()).value();
  Decoder d(*manager_, 14);
  AdmitPeer(d, 1, first, 0, 256);
  std::mt19937_64 rng(7);
  for (int32_t l = 0; l < kLayers; ++l) {  // the first request's rows, in the second region too
    const Bytes rows(d.model().Row(1, l, 0), d.model().Row(1, l, 0) + 256 * kRowBytes);
    ASSERT_TRUE(second_region->WriteRows(l, 0, rows.data(), 256, nullptr).ok());
  }
  ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
  ASSERT_TRUE(MapPeerRows(*manager_, 1, second, 0, 256, nullptr).ok());
  d.Step({1});
  ASSERT_TRUE(manager_->Release(1).ok());
  d.model().Remove(1);
  AdmitLocal(d, 2, 256);  // on the pages the first request held
  const uint64_t before = RowsRead();
  for (int step = 0; step < 5; ++step) d.Step({2});  // checks every delivered row's bytes
  EXPECT_EQ(RowsRead(), before);
  manager_.reset();  // before the second region, which it maps
}

TEST_P(PeerTierTest, SplitRunsChunksPrefetchesAndIndexGroupsReadPeerRows) {
  if (backend_ == nullptr) return;
  CacheOptions o = ThreeLayerOptions();
  o.copy_chunk_rows = 2;
  o.max_prefetch = 8;
  o.layers_per_index = 2;
  Create(o, 2048, /*max_regions=*/3);  // and two slots without a region
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  Decoder d(*manager_, 12, testing::RunMode{.split = true, .prefetch = 6, .seed = 5});
  AdmitPeer(d, 1, region, 0, 260);
  AdmitPeer(d, 2, region, 300, 260);
  AdmitLocal(d, 3, 240);
  for (int step = 0; step < 25; ++step) d.Step({3, 1, 2});
  EXPECT_GT(RowsRead(), 0u);
  EXPECT_EQ(InvalidCopies(), 0u);
}

// The region's rows are made to differ from the host pool's (which a lender must not do), so
// that the delivered bytes say where each row was read.
TEST_P(PeerTierTest, MissesOnMappedPagesAreReadFromTheRegionUntilItIsDetached) {
  if (backend_ == nullptr) return;
  Create(ThreeLayerOptions());
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  Decoder d(*manager_, 13);
  AdmitPeer(d, 1, region, 100, 256);
  std::mt19937_64 rng(99);
  const std::vector<Bytes> other = LendPrompt(100, 256, rng);  // the region now differs
  testing::StepDriver driver(*manager_);
  const auto step = [&](int32_t position) {
    std::vector<Bytes> new_rows(kLayers, Bytes(kRowBytes, std::byte{7}));
    std::vector<std::vector<int32_t>> topk(kLayers, std::vector<int32_t>(kTopK, -1));
    for (auto& t : topk) t[0] = position;
    return driver.Step({1}, new_rows, topk);
  };
  // Position 5 is in a mapped page and not hot: read from the region.
  std::vector<testing::LayerResult> results = step(5);
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(std::equal(other[l].begin() + 5 * kRowBytes, other[l].begin() + 6 * kRowBytes,
                           results[l].gathered.begin()))
        << "layer " << l;
  }
  EXPECT_EQ(RowsRead(), uint64_t{kLayers});
  ASSERT_TRUE(DetachPeerRegion(*manager_, region, nullptr).ok());
  EXPECT_EQ(PeerRegionStatus(*manager_, region).code(), StatusCode::kNotFound);
  // Position 9, never hot: read from the host pool, the prompt's own bytes.
  results = step(9);
  for (int32_t l = 0; l < kLayers; ++l) {
    const std::byte* want = d.model().Row(1, l, 9);
    EXPECT_TRUE(std::equal(want, want + kRowBytes, results[l].gathered.begin())) << "layer " << l;
  }
  EXPECT_EQ(RowsRead(), uint64_t{kLayers});
}

// The descriptor names a child process as the lender (the memory is this process's: the CPU
// backend shares within one process), so that the lender can be killed.
TEST_P(PeerTierTest, ALenderThatDiesCostsSpeedNotRows) {
  if (backend_ == nullptr) return;
  Create(ThreeLayerOptions());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  PeerRegionDescriptor lent = region_->descriptor();
  lent.pid = child;
  lent.start_time = 0;  // any process with that pid
  const int32_t region = Import(lent.Serialize()).value();
  Decoder d(*manager_, 14);
  AdmitPeer(d, 1, region, 0, 400);
  AdmitLocal(d, 2, 150);
  for (int step = 0; step < 10; ++step) d.Step({1, 2});
  EXPECT_TRUE(PeerRegionStatus(*manager_, region).ok());
  const uint64_t before = RowsRead();
  EXPECT_GT(before, 0u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (int step = 0; step < 10; ++step) d.Step({1, 2});
  EXPECT_EQ(RowsRead(), before);
  EXPECT_EQ(PeerRegionStatus(*manager_, region).code(), StatusCode::kUnavailable);
  EXPECT_EQ(InvalidCopies(), 0u);
  // The slot is free for another region.
  EXPECT_TRUE(Import(region_->descriptor().Serialize()).ok());
}

TEST_P(PeerTierTest, RefusesWhatItCannotServe) {
  if (backend_ == nullptr) return;
  Create(ThreeLayerOptions(), 1024);
  const std::string text = region_->descriptor().Serialize();
  EXPECT_EQ(Import("not a descriptor").status().code(), StatusCode::kInvalidArgument);
  PeerRegionDescriptor d = region_->descriptor();
  d.row_strides[1] += 16;
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kInvalidArgument);
  d = region_->descriptor();
  ++d.generation;  // the memory holds another region
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kNotFound);
  d = region_->descriptor();
  d.start_time += 1;  // the pid is another process now
  EXPECT_EQ(Import(d.Serialize()).status().code(), StatusCode::kNotFound);
  const int32_t region = Import(text).value();
  EXPECT_EQ(Import(text).status().code(), StatusCode::kResourceExhausted);  // max_regions = 1

  EXPECT_EQ(MapPeerRows(*manager_, 9, region, 0, 64, nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(manager_->Admit(1, 100, 10, nullptr).ok());
  EXPECT_EQ(MapPeerRows(*manager_, 1, region + 1, 0, 64, nullptr).code(), StatusCode::kNotFound);
  EXPECT_EQ(MapPeerRows(*manager_, 1, region, 0, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MapPeerRows(*manager_, 1, region, 0, 101, nullptr).code(),  // past its 100 tokens
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MapPeerRows(*manager_, 1, region, 1000, 100, nullptr).code(), StatusCode::kOutOfRange);
  // A refused admission leaves nothing behind.
  EXPECT_EQ(AdmitFromPeer(*manager_, 2, region, 1000, 100, 10, nullptr).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(AdmitFromPeer(*manager_, 2, region + 1, 0, 100, 10, nullptr).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(AdmitFromPeer(*manager_, 1, region, 0, 100, 10, nullptr).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(manager_->SequenceLength(2).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(DetachPeerRegion(*manager_, region + 1, nullptr).code(), StatusCode::kNotFound);

  // Without the tier.
  auto plain = SparseKVCacheManager::Create(ThreeLayerOptions(), backend_).value();
  EXPECT_EQ(ImportPeerRegion(*plain, text, nullptr).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(MapPeerRows(*plain, 1, 0, 0, 16, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(PeerRowsRead(*plain, nullptr).status().code(), StatusCode::kFailedPrecondition);
  PeerTierOptions too_many;
  too_many.max_regions = kMaxRoutePlaces;
  EXPECT_EQ(AttachPeerTier(*plain, too_many).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AttachPeerTier(*manager_).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(PeerRegion::Create(ThreeLayerOptions().geometry, 0, backend_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(region_->WriteRows(0, 1000, text.data(), 100, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(region_->WriteRows(kLayers, 0, text.data(), 1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// A page shared by two requests (a fork) stays mapped until both are released.
TEST_P(PeerTierTest, AForkSharesTheMappedPages) {
  if (backend_ == nullptr) return;
  Create(ThreeLayerOptions());
  const int32_t region = Import(region_->descriptor().Serialize()).value();
  Decoder d(*manager_, 15);
  AdmitPeer(d, 1, region, 0, 320);
  for (int step = 0; step < 3; ++step) d.Step({1});
  ASSERT_TRUE(manager_->Fork(1, 2, 64, nullptr).ok());
  d.model().Copy(1, 2);
  for (int step = 0; step < 5; ++step) d.Step({1, 2});
  ASSERT_TRUE(manager_->Release(1).ok());
  d.model().Remove(1);
  // The child's misses on the shared prompt pages are read from the region's copy or, once the
  // last mapping went with the parent, from the host pool: exact either way.
  for (int step = 0; step < 8; ++step) d.Step({2});
  EXPECT_EQ(InvalidCopies(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, PeerTierTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace sparsekv
