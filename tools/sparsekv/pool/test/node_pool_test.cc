// The node pool across real processes of one machine: a redis-server (control plane), prefill and
// decode processes (node_pool_test_child.cc) and `sparsekv pool --node-pool`, sharing one segment
// in /dev/shm. Decode admits each prompt from the pages prefill sealed, without copying it, and
// checks every row a step delivers byte for byte against the CPU oracle; killed processes (SIGKILL)
// neither stop nor corrupt the others, their pages are freed once, and no segment is left behind.
// Each case runs with decode on the CPU backend and on the CUDA backend (skipped without a GPU).
// Every process is in its own process group and is killed and reaped by the test's destructors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "sparsekv/backend.h"
#include "sparsekv/control_plane.h"
#include "testing/harness.h"
#include "testing/subprocess.h"
#include "testing/wait_until.h"
#include "tools/sparsekv/pool/test/processes_fixture.h"

namespace sparsekv {
namespace {

using testing::Count;
using testing::Subprocess;
using testing::WaitUntil;

constexpr int64_t kLeaseMs = 1500;

// The rest of the last line of `log` that starts with `prefix` ("" if none).
std::string LastLineAfter(const std::string& log, const std::string& prefix) {
  const size_t at = log.rfind("\n" + prefix);
  const size_t from = at == std::string::npos ? (log.starts_with(prefix) ? prefix.size() : 0)
                                              : at + 1 + prefix.size();
  if (at == std::string::npos && !log.starts_with(prefix)) return "";
  return log.substr(from, log.find('\n', from) - from);
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

class NodePoolProcessTest : public testing::ProcessesTest {
 protected:
  NodePoolProcessTest() : ProcessesTest("node-pool") {}

  void SetUp() override {
    if (GetParam() == "cuda" && !CreateCudaBackend().ok()) {
      GTEST_SKIP() << "decode on the CUDA backend needs a GPU: "
                   << CreateCudaBackend().status().ToString();
    }
    ProcessesTest::SetUp();
    if (HasFatalFailure()) return;
    segment_ = "sparsekv-np-test-" + std::to_string(getpid()) + "-" +
               std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& ch : segment_) {
      if (ch == '/') ch = '-';
    }
  }
  void TearDown() override {
    ProcessesTest::TearDown();
    std::error_code ignored;
    std::filesystem::remove(SegmentPath(), ignored);
  }

  std::string SegmentPath() const { return "/dev/shm/" + segment_; }

  std::vector<std::string> ChildArgs(const std::string& mode,
                                     const std::vector<std::string>& requests) const {
    std::vector<std::string> argv = {SPARSEKV_NODE_POOL_TEST_CHILD,
                                     mode,
                                     "--control-plane",
                                     ControlPlaneAddress(),
                                     "--key-prefix",
                                     key_prefix_,
                                     "--lease-ms",
                                     std::to_string(kLeaseMs),
                                     "--layers",
                                     "4",
                                     "--tokens",
                                     "1000",
                                     "--row-bytes",
                                     "656",
                                     "--max-new-tokens",
                                     "512"};
    for (const std::string& r : requests) argv.insert(argv.end(), {"--request", r});
    return argv;
  }

  // A prefill process that serves the node pool itself (--serve) or writes into the one `node`
  // serves; returns once every request is published.
  Subprocess* StartPrefill(const std::string& name, const std::vector<std::string>& requests,
                           const std::string& pool_node = "", int64_t hold_ms = 0) {
    std::vector<std::string> argv = ChildArgs("prefill", requests);
    argv.insert(argv.end(), {"--node-id", name, "--hold-ms", std::to_string(hold_ms)});
    if (pool_node.empty()) {
      argv.insert(argv.end(), {"--serve", segment_});
    } else {
      argv.insert(argv.end(), {"--pool-node", pool_node});
    }
    Subprocess* prefill = Start(name, argv);
    EXPECT_TRUE(WaitForLog(name, "published ", static_cast<int>(requests.size())))
        << name << " did not publish";
    return prefill;
  }

  Subprocess* StartDecode(const std::string& name, const std::vector<std::string>& requests) {
    std::vector<std::string> argv = ChildArgs("decode", requests);
    argv.insert(argv.end(), {"--reader", name, "--backend", GetParam()});
    return Start(name, argv);
  }

  static int ExitCode(Subprocess* process) {
    auto code = process->WaitFor(kDeadline);
    return code.ok() ? *code : -1;
  }

  // A decode log's final pool line: every page free again once its requests were released.
  static void ExpectPoolEmpty(const std::string& log) {
    const std::string line = LastLineAfter(log, "pool free_pages ");
    ASSERT_FALSE(line.empty()) << log;
    std::istringstream in(line);
    int64_t free_pages = -1, total = -2, shared = -1;
    std::string word;
    in >> free_pages >> word >> total >> word >> shared;
    EXPECT_EQ(free_pages, total) << line;
    EXPECT_EQ(shared, 0) << line;
  }

  std::string segment_;
};

TEST_P(NodePoolProcessTest, DecodeAdmitsPrefillsPromptsWithoutCopyingAndOutlivesIt) {
  Subprocess* prefill = StartPrefill("prefill-0", {"a:11", "b:12", "c:13"});
  ASSERT_NE(prefill, nullptr);
  EXPECT_TRUE(FileExists(SegmentPath()));
  Subprocess* decode = StartDecode("decode-0", {"a:11", "b:12", "c:13"});
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(WaitForLog("decode-0", "requests 3", 5));
  // Decode called Done at admission: prefill releases every prompt and exits, and decode goes on
  // with the pages its own references keep.
  EXPECT_EQ(ExitCode(prefill), 0);
  EXPECT_EQ(Count(Log("prefill-0"), "released "), 3);
  EXPECT_EQ(plane_->Lookup("a").status().code(), StatusCode::kNotFound);
  const int steps = Count(Log("decode-0"), "requests 3");
  ASSERT_TRUE(WaitForLog("decode-0", "requests 3", steps + 10));
  EXPECT_TRUE(FileExists(SegmentPath()));  // decode is still attached

  EXPECT_EQ(Terminate(decode), 0);
  const std::string log = Log("decode-0");
  EXPECT_EQ(Count(log, "WRONG"), 0) << log;
  EXPECT_EQ(Count(log, "failed: "), 0) << log;
  EXPECT_EQ(Count(log, "admitted "), 3) << log;
  // Nothing of the prompts was copied into the pool again. 1000 tokens end in a partial page of
  // 16: a request copies it at its first append if prefill still shares it then, and writes into
  // it if prefill has released it already (whichever came first).
  std::istringstream stats(LastLineAfter(log, "stats bytes_ingested "));
  int64_t ingested = -1, copied = -1;
  std::string word;
  stats >> ingested >> word >> copied;
  EXPECT_EQ(ingested, 0) << log;
  EXPECT_GE(copied, 0) << log;
  EXPECT_LE(copied, 3) << log;
  ExpectPoolEmpty(log);
  EXPECT_FALSE(FileExists(SegmentPath()));  // the last process to detach removed it
}

TEST_P(NodePoolProcessTest, AKilledPrefillNeitherStopsNorCorruptsDecode) {
  // Prefill holds b (no reader) and stays attached after releasing a.
  Subprocess* prefill = StartPrefill("prefill-0", {"a:21", "b:22"}, "", 60000);
  Subprocess* decode = StartDecode("decode-0", {"a:21"});
  ASSERT_TRUE(prefill && decode);
  ASSERT_TRUE(WaitForLog("prefill-0", "released a"));
  ASSERT_TRUE(WaitForLog("decode-0", "requests 1", 5));
  prefill->Kill();  // SIGKILL in the middle of decoding
  // Decode finds the dead process and drops its pages (b's), and decodes a exactly on.
  ASSERT_TRUE(WaitForLog("decode-0", "reclaimed 1"));
  const int steps = Count(Log("decode-0"), "requests 1");
  ASSERT_TRUE(WaitForLog("decode-0", "requests 1", steps + 10));
  // b's seal ended with its writer: a later reader cannot admit it (its binding may still be
  // granted while the dead prefill's lease runs, but not its pages) and fails cleanly.
  Subprocess* late = StartDecode("decode-1", {"b:22"});
  ASSERT_NE(late, nullptr);
  ASSERT_TRUE(WaitForLog("decode-1", "request b failed: "));
  const std::string why = Log("decode-1");
  EXPECT_TRUE(why.find("failed: NotFound") != std::string::npos ||
              why.find("failed: Unavailable") != std::string::npos)
      << why;
  EXPECT_EQ(Terminate(late), 0);

  EXPECT_EQ(Terminate(decode), 0);
  const std::string log = Log("decode-0");
  EXPECT_EQ(Count(log, "WRONG"), 0) << log;
  EXPECT_EQ(Count(log, "failed: "), 0) << log;
  ExpectPoolEmpty(log);
  EXPECT_FALSE(FileExists(SegmentPath()));
}

TEST_P(NodePoolProcessTest, APoolServerServesTheSegmentAndReclaimsAKilledDecode) {
  Subprocess* pool = Start("pool", {SPARSEKV_TOOL,       "pool",
                                    "--node-id",         "np-node",
                                    "--control-plane",   ControlPlaneAddress(),
                                    "--key-prefix",      key_prefix_,
                                    "--lease-ms",        std::to_string(kLeaseMs),
                                    "--node-pool",       segment_,
                                    "--layers",          "4",
                                    "--row-bytes",       "656",
                                    "--page-tokens",     "16",
                                    "--capacity-tokens", "16384",
                                    "--max-context",     "1512",
                                    "--max-owners",      "32"});
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(WaitForLog("pool", "serves node pool"));
  ASSERT_TRUE(WaitUntil([&] { return plane_->GetRegion("np-node", 0).ok(); }, kDeadline));
  Subprocess* prefill = StartPrefill("prefill-0", {"a:31", "b:32"}, "np-node");
  Subprocess* decode = StartDecode("decode-0", {"a:31", "b:32"});
  ASSERT_TRUE(prefill && decode);
  ASSERT_TRUE(WaitForLog("decode-0", "requests 2", 5));
  EXPECT_EQ(ExitCode(prefill), 0);
  ASSERT_TRUE(WaitForLog("pool", "pool: free pages"));
  decode->Kill();  // SIGKILL in the middle of decoding, holding every page in use
  ASSERT_TRUE(WaitForLog("pool", "reclaimed 1 dead process(es)"));
  ASSERT_TRUE(WaitForLog("pool", "pool: free pages 1024 of 1024, free owners 32 of 32"));
  EXPECT_EQ(Count(Log("decode-0"), "WRONG"), 0);

  EXPECT_EQ(Terminate(pool), 0);
  EXPECT_FALSE(FileExists(SegmentPath()));
  auto nodes = plane_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_TRUE(nodes->empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, NodePoolProcessTest, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sparsekv
