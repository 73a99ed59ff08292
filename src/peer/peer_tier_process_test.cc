// The peer tier across processes. On a GPU: a lender process (peer_tier_process_test_child) lends a
// region over CUDA IPC; this process's manager admits prompts from it and decodes in captured,
// replayed steps, every row checked byte for byte against the CPU oracle; the lender is killed
// while a step reads its region, and decoding goes on exactly from the host pool; a region lent
// again has a new generation, and the old descriptor is refused. The descriptors go through a real
// redis-server (the control plane) where one is installed, else through the lender's output. On the
// CPU: a descriptor published through the control plane is imported and read (in one process: the
// CPU backend shares memory within its process only).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "sparsekv/control_plane.h"
#include "sparsekv/manager.h"
#include "sparsekv/peer_tier.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"
#include "testing/redis_server.h"
#include "testing/subprocess.h"
#include "testing/wait_until.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsekv {
namespace {

using std::chrono::milliseconds;
using testing::Bytes;

constexpr int32_t kLayers = 3;
constexpr int32_t kRowBytes = 96;
constexpr int32_t kTopK = 64;
constexpr int32_t kLenderRows = 1024;
constexpr int32_t kLenderTokens = 600;
constexpr uint64_t kLenderSeed = 77;
constexpr milliseconds kDeadline{20000};

CacheOptions Options() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kRowBytes);
  o.top_k = kTopK;
  o.hot_slots = 96;
  o.window = 4;
  o.host_capacity_tokens = 8192;
  o.max_requests = 4;
  o.max_context = 1024;
  o.host_page_tokens = 16;
  return o;
}

// The rows the lender writes: rows [0, kLenderTokens) of every layer.
std::vector<Bytes> LenderRows() {
  std::vector<Bytes> rows;
  std::mt19937_64 rng(kLenderSeed);
  for (int32_t l = 0; l < kLayers; ++l) {
    rows.push_back(testing::RandomRows(rng, kLenderTokens, kRowBytes));
  }
  return rows;
}

// A lender process and the descriptors it published.
class Lender {
 public:
  // Starts the lender (peer_tier_process_test_child); with a redis server, it publishes through the
  // control plane too.
  static std::unique_ptr<Lender> Start(const std::string& name, testing::RedisServer* redis) {
    auto lender = std::unique_ptr<Lender>(new Lender);
    lender->log_ = ::testing::TempDir() + "peer_lender_" + name + "_" + std::to_string(getpid());
    std::remove(lender->log_.c_str());
    std::vector<std::string> argv = {
        SPARSEKV_PEER_TIER_TEST_CHILD, "--rows",      std::to_string(kLenderRows), "--layers",
        std::to_string(kLayers),       "--row-bytes", std::to_string(kRowBytes),   "--tokens",
        std::to_string(kLenderTokens), "--seed",      std::to_string(kLenderSeed)};
    if (redis != nullptr) {
      lender->prefix_ = "peer-test-" + name + "-" + std::to_string(getpid());
      argv.insert(argv.end(), {"--redis-port", std::to_string(redis->port()), "--node-id", "lender",
                               "--key-prefix", lender->prefix_});
      ControlPlaneOptions o;
      o.port = redis->port();
      o.key_prefix = lender->prefix_;
      auto plane = ControlPlane::Connect(o);
      EXPECT_TRUE(plane.ok()) << plane.status().ToString();
      if (plane.ok()) lender->plane_ = std::move(*plane);
    }
    auto process = testing::Subprocess::Start(argv, {}, lender->log_);
    EXPECT_TRUE(process.ok()) << process.status().ToString();
    if (!process.ok()) return nullptr;
    lender->process_ = std::move(*process);
    return lender;
  }

  // The n-th descriptor (n from 1): from the control plane if there is one (the latest published
  // region 0, once the lender printed its n-th), else from the lender's output.
  std::string Descriptor(int n) {
    const std::string tag = "descriptor " + std::to_string(n) + " ";
    std::string text;
    const bool found = testing::WaitUntil(
        [&] {
          const std::string log = testing::ReadFile(log_);
          const size_t at = log.find(tag);
          if (at == std::string::npos) return false;
          const size_t end = log.find('\n', at);
          if (end == std::string::npos) return false;
          text = log.substr(at + tag.size(), end - at - tag.size());
          return true;
        },
        kDeadline);
    EXPECT_TRUE(found) << "no descriptor " << n << " from the lender: " << testing::ReadFile(log_);
    if (found && plane_ != nullptr) {
      StatusOr<std::string> published = plane_->GetRegion("lender", 0);
      EXPECT_TRUE(published.ok()) << published.status().ToString();
      if (published.ok()) {
        EXPECT_EQ(*published, text);  // the control plane carried it unchanged
        return *published;
      }
    }
    return text;
  }
  void Signal(int signal) { process_->Signal(signal); }
  void Kill() { process_->Kill(); }

 private:
  Lender() = default;
  std::string log_;
  std::string prefix_;
  std::unique_ptr<ControlPlane> plane_;
  std::unique_ptr<testing::Subprocess> process_;
};

std::unique_ptr<testing::RedisServer> RedisOrNull() {
  auto redis = testing::RedisServer::Start();
  return redis.ok() ? std::move(*redis) : nullptr;
}

// Random top-k rows: recent positions (hits), random history (misses) and bad entries.
std::vector<int32_t> TopK(std::mt19937_64& rng, int32_t len) {
  std::vector<int32_t> row;
  for (int32_t k = 0; k < kTopK; ++k) {
    const uint64_t r = rng() % 100;
    int32_t p = static_cast<int32_t>(std::max<int64_t>(0, len - 60) + rng() % 60);
    if (r < 40) p = static_cast<int32_t>(rng() % len);
    if (r >= 95) p = r % 2 ? -1 : len + 3;
    row.push_back(std::min(p, len + 3));
  }
  return row;
}

// `steps` eager steps of request `id` alone, each checked against the model.
void DecodeAlone(SparseKVCacheManager& m, testing::DenseModel& model, RequestId id, int steps,
                 uint64_t seed) {
  testing::StepDriver driver(m);
  std::mt19937_64 rng(seed);
  for (int step = 0; step < steps; ++step) {
    std::vector<Bytes> new_rows;
    std::vector<std::vector<int32_t>> topk;
    for (int32_t l = 0; l < kLayers; ++l) {
      new_rows.push_back(testing::RandomRows(rng, 1, kRowBytes));
      model.Append(id, l, new_rows[l].data());
      topk.push_back(TopK(rng, model.Length(id, l)));
    }
    const auto got = driver.Step({id}, new_rows, topk);
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(testing::CheckLayer(model, m.options().geometry, l, {id}, topk[l], got[l], kTopK),
                0);
    }
  }
}

#if defined(SPARSEKV_WITH_CUDA)
// Rows [first, first + len) of each layer of `rows`.
std::vector<Bytes> Slice(const std::vector<Bytes>& rows, int32_t first, int32_t len) {
  std::vector<Bytes> out;
  for (const Bytes& layer : rows) {
    out.emplace_back(layer.begin() + int64_t{first} * kRowBytes,
                     layer.begin() + int64_t{first + len} * kRowBytes);
  }
  return out;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

TEST(PeerTierProcessTest, CapturedStepsReadALenderProcessExactlyAndOutliveIt) {
  SPARSEKV_REQUIRE_GPU(gpu);
  std::unique_ptr<testing::RedisServer> redis = RedisOrNull();
  std::unique_ptr<Lender> lender = Lender::Start("captured", redis.get());
  ASSERT_NE(lender, nullptr);
  const std::string descriptor = lender->Descriptor(1);
  ASSERT_FALSE(descriptor.empty());

  const CacheOptions o = Options();
  auto cpu = SparseKVCacheManager::Create(o, CreateCpuBackend()).value();
  auto dev = SparseKVCacheManager::Create(o, gpu).value();
  ASSERT_TRUE(AttachPeerTier(*dev).ok());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  StatusOr<int32_t> region = ImportPeerRegion(*dev, descriptor, stream);
  ASSERT_TRUE(region.ok()) << region.status().ToString();

  // Requests 1 and 2 from the lender's rows (2 from an offset), 3 local.
  testing::DenseModel model(o.geometry);
  std::mt19937_64 rng(5);
  const std::vector<Bytes> lent = LenderRows();
  const struct {
    RequestId id;
    int32_t first, len;
  } peers[] = {{1, 0, kLenderTokens}, {2, 64, 400}};
  for (const auto& p : peers) {
    const Status s = AdmitFromPeer(*dev, p.id, *region, p.first, p.len, 200, stream);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<Bytes> rows = Slice(lent, p.first, p.len);
    ASSERT_TRUE(cpu->Admit(p.id, p.len, 200, nullptr).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cpu->IngestPrompt(p.id, l, rows[l].data(), nullptr).ok());
    }
    model.Add(p.id, rows, p.len);
  }
  std::vector<Bytes> local;
  for (int32_t l = 0; l < kLayers; ++l) local.push_back(testing::RandomRows(rng, 300, kRowBytes));
  for (SparseKVCacheManager* m : {cpu.get(), dev.get()}) {
    ASSERT_TRUE(m->Admit(3, 300, 200, m == dev.get() ? stream : nullptr).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(m->IngestPrompt(3, l, local[l].data(), m == dev.get() ? stream : nullptr).ok());
    }
  }
  model.Add(3, local, 300);
  ASSERT_TRUE(gpu->Synchronize(stream).ok());

  testing::StepDriver cpu_driver(*cpu);
  testing::StepDriver dev_driver(*dev, stream);
  const std::vector<RequestId> batch = {1, 2, 3};
  auto run_phase = std::make_unique<testing::CapturedRunPhase>(*dev, dev_driver, stream);
  uint64_t read_before_kill = 0;
  for (int step = 0; step < 40; ++step) {
    std::vector<Bytes> new_rows;
    std::vector<std::vector<int32_t>> topk(kLayers);
    for (int32_t l = 0; l < kLayers; ++l) {
      new_rows.push_back(testing::RandomRows(rng, static_cast<int64_t>(batch.size()), kRowBytes));
      for (size_t b = 0; b < batch.size(); ++b) {
        model.Append(batch[b], l, new_rows[l].data() + b * kRowBytes);
        const std::vector<int32_t> row = TopK(rng, model.Length(batch[b], l));
        topk[l].insert(topk[l].end(), row.begin(), row.end());
      }
    }
    const auto want = cpu_driver.Step(batch, new_rows, topk);
    ASSERT_TRUE(dev->PlanStep(batch, stream).ok());
    dev_driver.UploadInputs(static_cast<int32_t>(batch.size()), new_rows, topk);
    const Status ran = run_phase->Run();
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    if (step == 20) lender->Kill();  // while (or just after) this step reads its region
    const auto got = dev_driver.DownloadOutputs(static_cast<int32_t>(batch.size()));
    for (int32_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("step " + std::to_string(step) + " layer " + std::to_string(l));
      EXPECT_TRUE(testing::SameRows(got[l], want[l], batch.size() * kTopK, o.geometry.layers[l]));
      EXPECT_EQ(testing::CheckLayer(model, o.geometry, l, batch, topk[l], got[l], kTopK), 0);
    }
    if (::testing::Test::HasFailure()) break;
    if (step == 21) {
      EXPECT_GT(PeerRowsRead(*dev, stream).value(), 0u);
      EXPECT_EQ(PeerRegionStatus(*dev, *region).code(), StatusCode::kUnavailable);
      read_before_kill = PeerRowsRead(*dev, stream).value();
    }
  }
  // From the step after the kill on, every miss is read from the host pool.
  EXPECT_EQ(PeerRowsRead(*dev, stream).value(), read_before_kill);
  EXPECT_EQ(dev->ReadStats(stream).value().invalid_copy_entries, 0u);
  EXPECT_EQ(cpu->ReadStats(nullptr).value().total.misses,
            dev->ReadStats(stream).value().total.misses);
  run_phase.reset();
  dev.reset();
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(PeerTierProcessTest, ARegionLentAgainHasANewGenerationAndTheOldDescriptorIsRefused) {
  SPARSEKV_REQUIRE_GPU(gpu);
  std::unique_ptr<testing::RedisServer> redis = RedisOrNull();
  std::unique_ptr<Lender> lender = Lender::Start("generation", redis.get());
  ASSERT_NE(lender, nullptr);
  const std::string first = lender->Descriptor(1);
  lender->Signal(SIGUSR1);
  const std::string second = lender->Descriptor(2);
  ASSERT_FALSE(first.empty() || second.empty());
  EXPECT_NE(PeerRegionDescriptor::Parse(first)->generation,
            PeerRegionDescriptor::Parse(second)->generation);

  const CacheOptions o = Options();
  auto dev = SparseKVCacheManager::Create(o, gpu).value();
  ASSERT_TRUE(AttachPeerTier(*dev).ok());
  // The first region's memory is freed: its handle does not open, or opens memory whose header
  // names another generation.
  EXPECT_FALSE(ImportPeerRegion(*dev, first, nullptr).ok());
  StatusOr<int32_t> region = ImportPeerRegion(*dev, second, nullptr);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  ASSERT_TRUE(AdmitFromPeer(*dev, 1, *region, 100, 300, 50, nullptr).ok());
  testing::DenseModel model(o.geometry);
  model.Add(1, Slice(LenderRows(), 100, 300), 300);
  DecodeAlone(*dev, model, 1, 5, 9);
  EXPECT_GT(PeerRowsRead(*dev, nullptr).value(), 0u);
  ASSERT_TRUE(dev->Release(1).ok());
  ASSERT_TRUE(DetachPeerRegion(*dev, *region, nullptr).ok());
  lender->Signal(SIGTERM);
}
#endif  // SPARSEKV_WITH_CUDA

TEST(PeerTierControlPlaneTest, ADescriptorPublishedThroughTheControlPlaneIsImported) {
  std::unique_ptr<testing::RedisServer> redis = RedisOrNull();
  if (redis == nullptr) GTEST_SKIP() << "redis-server is not installed";
  ControlPlaneOptions po;
  po.port = redis->port();
  po.key_prefix = "peer-control-plane-" + std::to_string(getpid());
  auto lender_plane = ControlPlane::Connect(po);
  if (!lender_plane.ok() && lender_plane.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << lender_plane.status().ToString();
  }
  ASSERT_TRUE(lender_plane.ok()) << lender_plane.status().ToString();
  auto decoder_plane = ControlPlane::Connect(po).value();

  std::shared_ptr<Backend> cpu = CreateCpuBackend();
  const CacheOptions o = Options();
  auto region = PeerRegion::Create(o.geometry, kLenderRows, cpu).value();
  const std::vector<Bytes> lent = LenderRows();
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(region->WriteRows(l, 0, lent[l].data(), kLenderTokens, nullptr).ok());
  }
  const uint64_t incarnation =
      (*lender_plane)->RegisterNode("lender", "in-process", std::chrono::seconds(60)).value();
  ASSERT_TRUE((*lender_plane)
                  ->PublishRegion("lender", incarnation, 0, region->descriptor().Serialize())
                  .ok());

  auto dev = SparseKVCacheManager::Create(o, cpu).value();
  ASSERT_TRUE(AttachPeerTier(*dev).ok());
  const std::string descriptor = decoder_plane->GetRegion("lender", 0).value();
  const int32_t index = ImportPeerRegion(*dev, descriptor, nullptr).value();
  ASSERT_TRUE(AdmitFromPeer(*dev, 1, index, 0, kLenderTokens, 20, nullptr).ok());
  testing::DenseModel model(o.geometry);
  model.Add(1, lent, kLenderTokens);
  DecodeAlone(*dev, model, 1, 5, 3);
  EXPECT_GT(PeerRowsRead(*dev, nullptr).value(), 0u);
  dev.reset();
}

}  // namespace
}  // namespace sparsekv
