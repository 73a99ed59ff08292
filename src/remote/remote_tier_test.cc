// The remote tier on the CPU and the CUDA backend (the latter skips without a GPU): remote-backed
// requests decode next to local ones, every delivered row checked byte for byte against the dense
// model; a dead pool server fails exactly the requests whose rows it held; a restarted one serves
// new requests; managers sharing one host pool each read their own remote rows.
#include "sparsekv/remote_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/manager.h"
#include "sparsekv/peer_tier.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"
#include "testing/ucx_servers.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::Bytes;
using testing::ChildServer;
using testing::HaveUcx;
using testing::LoopbackOptions;
using testing::PatternByte;
using testing::ThreadServer;

constexpr int32_t kLayers = 2;
constexpr int32_t kRowBytes = 96;
constexpr int32_t kTopK = 8;

// testing::SmallOptions with kLayers layers of kRowBytes-byte rows, kTopK positions per step,
// 16-token pages, and room for 4 requests of up to 512 tokens.
CacheOptions TwoLayerOptions() {
  CacheOptions o = testing::SmallOptions();
  o.geometry = KVGeometry::Uniform(kLayers, kRowBytes);
  o.top_k = kTopK;
  o.hot_slots = 12;
  o.window = 2;
  o.host_capacity_tokens = 2048;
  o.max_requests = 4;
  o.max_context = 512;
  o.host_page_tokens = 16;
  return o;
}

// The prompt rows a layout names in a pattern-filled region, as the model's prompt.
std::vector<Bytes> PromptOf(const RemotePromptLayout& layout) {
  std::vector<Bytes> layers(kLayers);
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t p = 0; p < layout.tokens; ++p) {
      for (int32_t i = 0; i < kRowBytes; ++i) {
        layers[l].push_back(PatternByte(layout.RowOffset(l, p) + i));
      }
    }
  }
  return layers;
}

// Decode steps over a batch, checked against the dense model. A request whose remote reads had
// failed before the step must get only -1 slots; one that fails during the step may get exact
// rows in the layers before the failure and only -1 slots from the failure on.
class Decoder {
 public:
  Decoder(SparseKVCacheManager& manager, uint64_t seed, testing::RunMode mode = testing::RunMode())
      : m_(manager),
        model_(manager.options().geometry),
        driver_(manager, nullptr, mode),
        rng_(seed) {}

  testing::DenseModel& model() { return model_; }
  SparseKVCacheManager& manager() { return m_; }

  // One step: every request of `batch` appends a random row and reads kTopK positions, half in
  // runs of adjacent positions (merged reads), half anywhere.
  void Step(const std::vector<RequestId>& batch) {
    std::vector<Bytes> new_rows(kLayers);
    std::vector<std::vector<int32_t>> topk(kLayers);
    std::vector<bool> failed_before;
    for (RequestId id : batch) failed_before.push_back(Failed(id));
    for (int32_t l = 0; l < kLayers; ++l) {
      new_rows[l] = testing::RandomRows(rng_, static_cast<int64_t>(batch.size()), kRowBytes);
      // The layers of an index group share their first layer's top-k.
      if (l % m_.options().layers_per_index != 0) {
        topk[l] = topk[l - l % m_.options().layers_per_index];
        continue;
      }
      for (size_t b = 0; b < batch.size(); ++b) {
        const int32_t len = model_.Length(batch[b], l) + 1;  // with this step's token
        const std::vector<int32_t> picks = Pick(len);
        topk[l].insert(topk[l].end(), picks.begin(), picks.end());
      }
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      for (size_t b = 0; b < batch.size(); ++b) {
        model_.Append(batch[b], l, new_rows[l].data() + b * kRowBytes);
      }
    }
    const std::vector<testing::LayerResult> results = driver_.Step(batch, new_rows, topk);
    std::vector<std::vector<int32_t>> expected = topk;
    for (int32_t l = 0; l < kLayers; ++l) {
      for (size_t b = 0; b < batch.size(); ++b) {
        const auto first = results[l].slots.begin() + static_cast<ptrdiff_t>(b * kTopK);
        const bool blank = std::all_of(first, first + kTopK, [](int32_t s) { return s < 0; });
        if (failed_before[b] || (Failed(batch[b]) && blank)) {
          std::fill_n(expected[l].begin() + static_cast<ptrdiff_t>(b * kTopK), kTopK, -1);
        }
      }
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(testing::CheckLayer(model_, m_.options().geometry, l, batch, expected[l],
                                    results[l], kTopK),
                0)
          << "layer " << l;
    }
  }

 private:
  bool Failed(RequestId id) const {
    const Status s = RemoteStatus(m_, id);
    return !s.ok() && s.code() != StatusCode::kNotFound;
  }

  std::vector<int32_t> Pick(int32_t len) {
    std::set<int32_t> chosen;
    std::uniform_int_distribution<int32_t> any(0, len - 1);
    const int32_t start = any(rng_);
    for (int32_t p = start; p < len && static_cast<int32_t>(chosen.size()) < kTopK / 2; ++p) {
      chosen.insert(p);
    }
    for (int tries = 0; tries < 64 && static_cast<int32_t>(chosen.size()) < kTopK - 1; ++tries) {
      chosen.insert(any(rng_));
    }
    std::vector<int32_t> out(chosen.begin(), chosen.end());
    std::shuffle(out.begin(), out.end(), rng_);
    out.resize(kTopK, -1);
    return out;
  }

  SparseKVCacheManager& m_;
  testing::DenseModel model_;
  testing::StepDriver driver_;
  std::mt19937_64 rng_;
};

// (transports, backend): UCX_TLS-style transport list, "cpu" or "cuda".
using RemoteParam = std::tuple<std::string, std::string>;

class RemoteTierTest : public ::testing::TestWithParam<RemoteParam> {
 protected:
  static std::string Transports() { return std::get<0>(GetParam()); }

  void SetUp() override {
    if (!HaveUcx()) GTEST_SKIP() << "built without UCX";
    if (std::get<1>(GetParam()) == "cuda") {
      backend_ = testing::CudaBackendOrSkip();
      if (backend_ == nullptr) return;
    } else {
      backend_ = CreateCpuBackend();
    }
    auto transport = CreateUcxTransport(LoopbackOptions(Transports(), milliseconds(2000)));
    ASSERT_TRUE(transport.ok()) << transport.status().ToString();
    transport_ = std::move(*transport);
    tier_ = RemoteTier::Create(transport_.get()).value();
    Recreate(TwoLayerOptions());
  }
  // A fresh manager with `options`, attached to the tier.
  void Recreate(const CacheOptions& options) {
    manager_.reset();
    manager_ = SparseKVCacheManager::Create(options, backend_).value();
    ASSERT_TRUE(AttachRemoteTier(*manager_, tier_.get()).ok());
  }
  void TearDown() override {
    manager_.reset();
    tier_.reset();
  }

  // Admits a local request with a random prompt of `len` tokens into d's manager and model.
  static void AdmitLocal(Decoder& d, RequestId id, int32_t len, std::mt19937_64& rng) {
    ASSERT_TRUE(d.manager().Admit(id, len, 64, nullptr).ok());
    std::vector<Bytes> prompt;
    for (int32_t l = 0; l < kLayers; ++l) {
      prompt.push_back(testing::RandomRows(rng, len, kRowBytes));
      ASSERT_TRUE(d.manager().IngestPrompt(id, l, prompt.back().data(), nullptr).ok());
    }
    d.model().Add(id, prompt, len);
  }
  static void AdmitRemote(Decoder& d, RequestId id, uint32_t region,
                          const RemotePromptLayout& layout) {
    const Status s = sparsekv::AdmitRemote(d.manager(), id, region, layout, 64, nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    d.model().Add(id, PromptOf(layout), layout.tokens);
  }

  std::shared_ptr<Backend> backend_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<RemoteTier> tier_;
  std::unique_ptr<SparseKVCacheManager> manager_;
};

TEST_P(RemoteTierTest, RemoteAndLocalRequestsDecodeByteExactly) {
  ThreadServer server(Transports(), 1 << 20);
  auto region = tier_->ImportRegion("pool-a", server.descriptor());
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  EXPECT_EQ(*tier_->ImportRegion("pool-a", server.descriptor()), *region);
  RemotePromptLayout first = RemotePromptLayout::Dense(kLayers, 150, kRowBytes);
  // A second prompt further in the region, with a padded layout.
  RemotePromptLayout second = first;
  second.tokens = 90;
  second.base_offset = first.ExtentBytes() + 4096;
  second.row_stride = 128;
  second.layer_stride = 90 * 128 + 64;
  Decoder d(*manager_, 1);
  std::mt19937_64 rng(2);
  AdmitLocal(d, 1, 70, rng);
  const int32_t pages_before = manager_->ReadStats(nullptr)->host_pages_used;
  AdmitRemote(d, 2, *region, first);
  // Only the pages of the window and of the generated tokens are stored here: (150 + 64) / 16
  // pages rounded up, less the 9 pages wholly before the window (150 - 2 = 148 positions).
  EXPECT_EQ(manager_->ReadStats(nullptr)->host_pages_used - pages_before, 14 - 9);
  AdmitRemote(d, 3, *region, second);
  for (int step = 0; step < 40 && !HasFailure(); ++step) d.Step({1, 2, 3});

  const RemoteTierStats stats = tier_->stats();
  EXPECT_GT(stats.rows_staged, 0u);
  EXPECT_GT(stats.rows_fetched, stats.rows_staged) << "no prompt row of a private page was read";
  EXPECT_LT(stats.reads, stats.rows_fetched) << "adjacent rows were not merged";
  EXPECT_TRUE(RemoteStatus(*manager_, 2).ok());
  EXPECT_EQ(RemoteStatus(*manager_, 1).code(), StatusCode::kNotFound);

  // Prompt rows are remote; rows the decode wrote are local.
  auto remote_row = tier_->Locate(3, 1, 5, 0);
  ASSERT_TRUE(remote_row.ok());
  EXPECT_EQ(*tier_->NodeName(remote_row->node), "pool-a");
  EXPECT_EQ(remote_row->region, *region);
  EXPECT_EQ(remote_row->offset, second.RowOffset(1, 5));
  auto local_row = tier_->Locate(3, 1, second.tokens, 77);
  ASSERT_TRUE(local_row.ok());
  EXPECT_EQ(local_row->node, GlobalRowAddress::kLocalNode);
  EXPECT_EQ(local_row->offset, 77u * kRowBytes);

  EXPECT_EQ(tier_->ReleaseRegion(*region).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(manager_->Release(2).ok());
  ASSERT_TRUE(manager_->Release(3).ok());
  EXPECT_FALSE(tier_->IsBound(2));
  EXPECT_TRUE(tier_->ReleaseRegion(*region).ok());
}

// Both tiers in one manager: where each missed row is read from (the host pool, a peer region
// or a remote region) is decided per row, and every row is exact.
TEST_P(RemoteTierTest, RemoteAndPeerTiersServeOneBatch) {
  ASSERT_TRUE(AttachPeerTier(*manager_).ok());
  EXPECT_EQ(AttachPeerTier(*manager_).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(AttachRemoteTier(*manager_, tier_.get()).code(), StatusCode::kFailedPrecondition);
  ThreadServer server(Transports(), 1 << 20);
  auto region = tier_->ImportRegion("pool-a", server.descriptor());
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  auto lent = PeerRegion::Create(manager_->options().geometry, 512, backend_);
  ASSERT_TRUE(lent.ok()) << lent.status().ToString();
  auto peer = ImportPeerRegion(*manager_, (*lent)->descriptor().Serialize(), nullptr);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  Decoder d(*manager_, 3);
  std::mt19937_64 rng(4);
  AdmitLocal(d, 1, 70, rng);
  AdmitRemote(d, 2, *region, RemotePromptLayout::Dense(kLayers, 150, kRowBytes));
  std::vector<Bytes> prompt;
  for (int32_t l = 0; l < kLayers; ++l) {
    prompt.push_back(testing::RandomRows(rng, 200, kRowBytes));
    ASSERT_TRUE((*lent)->WriteRows(l, 100, prompt.back().data(), 200, nullptr).ok());
  }
  ASSERT_TRUE(backend_->Synchronize(nullptr).ok());
  const Status admitted = AdmitFromPeer(*manager_, 3, *peer, 100, 200, 64, nullptr);
  ASSERT_TRUE(admitted.ok()) << admitted.ToString();
  d.model().Add(3, prompt, 200);
  for (int step = 0; step < 30 && !HasFailure(); ++step) d.Step({1, 2, 3});

  EXPECT_GT(tier_->stats().rows_staged, 0u);
  EXPECT_GT(PeerRowsRead(*manager_, nullptr).value(), 0u);
  EXPECT_EQ(manager_->ReadStats(nullptr)->invalid_copy_entries, 0u);
  ASSERT_TRUE(manager_->Release(2).ok());
  ASSERT_TRUE(manager_->Release(3).ok());
  manager_.reset();  // before the region it maps
}

// A prefill instance writes a prompt into a pool server's region (WritePromptLayer); a decode
// instance then reads exactly those rows.
TEST_P(RemoteTierTest, PromptWrittenIntoAPoolServerIsReadBack) {
  ThreadServer pool(Transports(), 1 << 20);
  auto prefill_transport = CreateUcxTransport(LoopbackOptions(Transports(), milliseconds(2000)));
  ASSERT_TRUE(prefill_transport.ok());
  auto prefill = RemoteTier::Create(prefill_transport->get());
  ASSERT_TRUE(prefill.ok());
  auto prefill_region = (*prefill)->ImportRegion("pool", pool.descriptor());
  ASSERT_TRUE(prefill_region.ok());
  RemotePromptLayout layout;
  layout.base_offset = 1000;
  layout.row_stride = 128;
  layout.row_bytes = kRowBytes;
  layout.tokens = 120;
  layout.layers = kLayers;
  layout.layer_stride = 120 * 128 + 40;
  std::mt19937_64 rng(8);
  std::vector<Bytes> prompt;
  for (int32_t l = 0; l < kLayers; ++l) {
    prompt.push_back(testing::RandomRows(rng, layout.tokens, kRowBytes));
    const Status s = (*prefill)->WritePromptLayer(*prefill_region, layout, l, prompt.back().data());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  auto region = tier_->ImportRegion("pool", pool.descriptor());
  ASSERT_TRUE(region.ok());
  Decoder d(*manager_, 9);
  ASSERT_TRUE(sparsekv::AdmitRemote(*manager_, 5, *region, layout, 32, nullptr).ok());
  d.model().Add(5, prompt, layout.tokens);
  for (int step = 0; step < 20 && !HasFailure(); ++step) d.Step({5});
  EXPECT_GT(tier_->stats().rows_fetched, 0u);
  EXPECT_TRUE(manager_->Release(5).ok());
}

// Layers that share one top-k (an index group) share the miss list: every layer of the group must
// still get its own remote rows.
TEST_P(RemoteTierTest, IndexGroupsReadEveryLayersRows) {
  CacheOptions options = TwoLayerOptions();
  options.layers_per_index = 2;
  Recreate(options);
  ThreadServer server(Transports(), 1 << 20);
  auto region = tier_->ImportRegion("pool-a", server.descriptor());
  ASSERT_TRUE(region.ok());
  Decoder d(*manager_, 5);
  std::mt19937_64 rng(6);
  AdmitLocal(d, 1, 40, rng);
  AdmitRemote(d, 2, *region, RemotePromptLayout::Dense(kLayers, 130, kRowBytes));
  for (int step = 0; step < 20 && !HasFailure(); ++step) d.Step({2, 1});
  EXPECT_GT(tier_->stats().rows_staged, 0u);
}

// The split run (ResolveLayer, AssembleLayer, CopyMisses) and cross-step prefetches (their own
// miss list) read remote rows too.
TEST_P(RemoteTierTest, SplitRunsAndPrefetchesReadRemoteRows) {
  CacheOptions options = TwoLayerOptions();
  options.max_prefetch = 4;
  Recreate(options);
  ThreadServer server(Transports(), 1 << 20);
  auto region = tier_->ImportRegion("pool-a", server.descriptor());
  ASSERT_TRUE(region.ok());
  testing::RunMode mode;
  mode.split = true;
  mode.prefetch = 4;
  mode.seed = 12;
  Decoder d(*manager_, 11, mode);
  std::mt19937_64 rng(13);
  AdmitLocal(d, 1, 60, rng);
  AdmitRemote(d, 2, *region, RemotePromptLayout::Dense(kLayers, 140, kRowBytes));
  for (int step = 0; step < 20 && !HasFailure(); ++step) d.Step({1, 2});
  EXPECT_GT(manager_->ReadStats(nullptr)->prefetch_rows, 0u);
  EXPECT_GT(tier_->stats().rows_staged, 0u);
}

// Node-level sharing with the remote tier: two managers (two GPUs of one machine, each with its
// own transport and tier) over one shared host pool each decode a remote-backed and a local
// request, exactly; the pool is empty once they are gone.
TEST_P(RemoteTierTest, ManagersSharingAHostPoolEachReadTheirRemoteRows) {
  ThreadServer server(Transports(), 1 << 20);
  const CacheOptions o = TwoLayerOptions();
  auto pool = HostKVPool::CreateShared(o, 2 * o.effective_max_host_requests(), backend_);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  struct Gpu {
    std::unique_ptr<Transport> transport;
    std::unique_ptr<RemoteTier> tier;
    std::unique_ptr<SparseKVCacheManager> manager;  // destroyed first
  };
  std::vector<Gpu> gpus(2);
  std::vector<std::unique_ptr<Decoder>> decoders;
  std::mt19937_64 rng(21);
  for (size_t g = 0; g < gpus.size(); ++g) {
    Gpu& gpu = gpus[g];
    auto transport = CreateUcxTransport(LoopbackOptions(Transports(), milliseconds(2000)));
    ASSERT_TRUE(transport.ok()) << transport.status().ToString();
    gpu.transport = std::move(*transport);
    gpu.tier = RemoteTier::Create(gpu.transport.get()).value();
    auto manager = SparseKVCacheManager::Create(o, backend_, *pool);
    ASSERT_TRUE(manager.ok()) << manager.status().ToString();
    gpu.manager = std::move(*manager);
    ASSERT_TRUE(AttachRemoteTier(*gpu.manager, gpu.tier.get()).ok());
    auto region = gpu.tier->ImportRegion("pool-a", server.descriptor());
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    decoders.push_back(std::make_unique<Decoder>(*gpu.manager, 30 + g));
    Decoder& d = *decoders.back();

    // The same ids on both managers: they are separate namespaces.
    AdmitLocal(d, 1, 60 + 10 * static_cast<int32_t>(g), rng);
    RemotePromptLayout layout =
        RemotePromptLayout::Dense(kLayers, 140 + 20 * static_cast<int32_t>(g), kRowBytes);
    layout.base_offset = g * 100000;  // each GPU's prompt in its own part of the region
    AdmitRemote(d, 2, *region, layout);
  }
  for (int step = 0; step < 20 && !HasFailure(); ++step) {
    for (auto& d : decoders) d->Step({1, 2});
  }
  for (const Gpu& gpu : gpus) {
    EXPECT_GT(gpu.tier->stats().rows_fetched, 0u);
    EXPECT_TRUE(RemoteStatus(*gpu.manager, 2).ok());
  }
  decoders.clear();
  for (Gpu& gpu : gpus) gpu.manager.reset();
  EXPECT_EQ((*pool)->free_pages(), (*pool)->total_pages());
  EXPECT_EQ((*pool)->free_owners(), (*pool)->max_owners());
}

TEST_P(RemoteTierTest, RejectsLayoutsThatDoNotFit) {
  ThreadServer server(Transports(), 1 << 16);
  auto region = tier_->ImportRegion("pool-a", server.descriptor());
  ASSERT_TRUE(region.ok());
  RemotePromptLayout too_long = RemotePromptLayout::Dense(kLayers, 1000, kRowBytes);
  EXPECT_EQ(sparsekv::AdmitRemote(*manager_, 7, *region, too_long, 8, nullptr).code(),
            StatusCode::kOutOfRange);
  RemotePromptLayout wrong_rows = RemotePromptLayout::Dense(kLayers, 10, 64);
  EXPECT_EQ(sparsekv::AdmitRemote(*manager_, 7, *region, wrong_rows, 8, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sparsekv::AdmitRemote(*manager_, 7, 999,
                                  RemotePromptLayout::Dense(kLayers, 10, kRowBytes), 8, nullptr)
                .code(),
            StatusCode::kNotFound);
  // Nothing stayed admitted (the one page in use is the tier's placeholder).
  EXPECT_EQ(manager_->SequenceLength(7).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(manager_->ReadStats(nullptr)->host_pages_used, 1);
}

// A pool server dies mid-run: the requests whose prompts it held fail with a clear error and get
// only -1 slots from then on; the local request and the one on the other server go on, exact.
// A restarted server is imported again and serves a new request.
TEST_P(RemoteTierTest, DeadServerFailsOnlyItsRequestsAndARestartedOneServesAgain) {
  ThreadServer alive(Transports(), 1 << 20);
  auto dying = std::make_unique<ChildServer>(Transports(), 1 << 20);
  auto alive_region = tier_->ImportRegion("pool-alive", alive.descriptor());
  auto dying_region = tier_->ImportRegion("pool-dying", dying->descriptor());
  ASSERT_TRUE(alive_region.ok() && dying_region.ok());
  const RemotePromptLayout layout = RemotePromptLayout::Dense(kLayers, 200, kRowBytes);
  Decoder d(*manager_, 3);
  std::mt19937_64 rng(4);
  AdmitLocal(d, 1, 50, rng);
  AdmitRemote(d, 2, *alive_region, layout);
  AdmitRemote(d, 3, *dying_region, layout);
  for (int step = 0; step < 5; ++step) d.Step({1, 2, 3});
  ASSERT_FALSE(HasFailure());

  dying->Kill();
  // Request 3 fails at its first read that needs the dead server (a step may be served from its
  // hot cache); until then it is exact, from then on it gets -1 slots.
  const Clock::time_point start = Clock::now();
  int steps = 0;
  while (RemoteStatus(*manager_, 3).ok() && steps < 20) {
    d.Step({1, 2, 3});
    ++steps;
  }
  const Status failure = RemoteStatus(*manager_, 3);
  ASSERT_FALSE(failure.ok()) << "request 3 never needed its dead server";
  EXPECT_TRUE(failure.code() == StatusCode::kUnavailable ||
              failure.code() == StatusCode::kDeadlineExceeded)
      << failure.ToString();
  EXPECT_NE(failure.message().find("pool-dying"), std::string::npos) << failure.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_TRUE(RemoteStatus(*manager_, 2).ok());
  for (int step = 0; step < 5; ++step) d.Step({1, 2, 3});
  EXPECT_EQ(tier_->stats().failed_requests, 1u);

  ASSERT_TRUE(manager_->Release(3).ok());
  d.model().Remove(3);
  ASSERT_TRUE(tier_->ReleaseRegion(*dying_region).ok());
  ChildServer restarted(Transports(), 1 << 20);
  auto new_region = tier_->ImportRegion("pool-dying", restarted.descriptor());
  ASSERT_TRUE(new_region.ok()) << new_region.status().ToString();
  AdmitRemote(d, 4, *new_region, layout);
  for (int step = 0; step < 5; ++step) d.Step({1, 2, 4});
  EXPECT_TRUE(RemoteStatus(*manager_, 4).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, RemoteTierTest,
                         ::testing::Combine(::testing::Values("tcp", "shm"),
                                            ::testing::Values("cpu", "cuda")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace sparsekv
