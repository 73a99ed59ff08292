// The scale-out pool across real processes on 127.0.0.1: a redis-server (control plane), two
// `sparsekv pool` servers, prefill and decode processes (scale_out_test_child.cc) over UCX, with
// the tcp and the shared-memory transports. Decode runs SparseKVCacheManager (CPU backend) with the
// remote tier: its prompt rows are read from where prefill wrote them when a step misses on them,
// and every row a step delivers is checked byte for byte against the CPU oracle.
// Every process is in its own process group and is killed and reaped by the test's destructors.
#include <gtest/gtest.h>

#include <tuple>

#include "sparsekv/control_plane.h"
#include "testing/harness.h"
#include "testing/subprocess.h"
#include "testing/wait_until.h"
#include "tools/sparsekv/pool/test/processes_fixture.h"

namespace sparsekv {
namespace {

using std::chrono::milliseconds;
using testing::Count;
using testing::ReadFile;
using testing::Subprocess;
using testing::WaitUntil;

constexpr int64_t kLeaseMs = 1500;         // of the pool servers' membership
constexpr int64_t kBindingLeaseMs = 5000;  // of decode's bindings: > a failed read's deadline
// Remote operations' deadline. A read from a healthy server issued with one from a dead server is
// waited on only after the dead one's deadline and close (up to 2 x this): the margin keeps a
// loaded machine from failing it too.
constexpr int64_t kTimeoutMs = 2000;

// The value of counter `name` in decode's last line "remote NAME VALUE NAME VALUE ...", or -1.
int64_t RemoteCounter(const std::string& log, const std::string& name) {
  const size_t line = log.rfind("\nremote ");
  if (line == std::string::npos) return -1;
  const size_t at = log.find(" " + name + " ", line);
  if (at == std::string::npos) return -1;
  return std::stoll(log.substr(at + name.size() + 2));
}

// The rest of the first line of `log` that starts with `prefix` ("" if none).
std::string LineAfter(const std::string& log, const std::string& prefix) {
  const size_t at = log.find(prefix);
  if (at == std::string::npos) return "";
  const size_t from = at + prefix.size();
  return log.substr(from, log.find('\n', from) - from);
}

class ScaleOutTest : public testing::ProcessesTest {
 protected:
  ScaleOutTest() : ProcessesTest("scale-out") {}

  // A pool server; returns once its region is published under `incarnation`.
  Subprocess* StartPool(const std::string& node, uint64_t incarnation) {
    Subprocess* pool = Start(node + "-" + std::to_string(incarnation), PoolArgs(node));
    EXPECT_TRUE(WaitUntil(
        [&] {
          uint64_t live = 0;
          return plane_->GetRegion(node, 0, &live).ok() && live == incarnation;
        },
        kDeadline))
        << node << " did not publish its region";
    return pool;
  }

  std::vector<std::string> PoolArgs(const std::string& node) const {
    std::vector<std::string> argv = {SPARSEKV_TOOL,     "pool",
                                     "--node-id",       node,
                                     "--control-plane", ControlPlaneAddress(),
                                     "--key-prefix",    key_prefix_,
                                     "--region-mib",    "16",
                                     "--transports",    GetParam(),
                                     "--lease-ms",      std::to_string(kLeaseMs),
                                     "--timeout-ms",    std::to_string(kTimeoutMs)};
    if (GetParam() == "tcp") argv.insert(argv.end(), {"--net-devices", "lo"});
    return argv;
  }

  std::vector<std::string> ChildArgs(const std::string& mode,
                                     int64_t lease_ms = kBindingLeaseMs) const {
    return {SPARSEKV_SCALE_OUT_TEST_CHILD,
            mode,
            "--control-plane",
            ControlPlaneAddress(),
            "--key-prefix",
            key_prefix_,
            "--transports",
            GetParam(),
            "--lease-ms",
            std::to_string(lease_ms),
            "--timeout-ms",
            std::to_string(kTimeoutMs),
            "--layers",
            "4",
            "--tokens",
            "1024",
            "--row-bytes",
            "656"};
  }

  // A prefill process for `requests` ("KEY:SEED"), into `pool`'s region at `offset` (its own
  // region if `pool` is empty); returns once every request is published.
  Subprocess* StartPrefill(const std::string& name, const std::vector<std::string>& requests,
                           const std::string& pool = "", uint64_t offset = 0) {
    std::vector<std::string> argv = ChildArgs("prefill");
    argv.insert(argv.end(), {"--node-id", name});
    if (!pool.empty()) {
      argv.insert(argv.end(), {"--pool", pool, "--pool-offset", std::to_string(offset)});
    }
    for (const std::string& r : requests) argv.insert(argv.end(), {"--request", r});
    Subprocess* prefill = Start(name, argv);
    EXPECT_TRUE(WaitUntil(
        [&] { return Count(ReadFile(LogPath(name)), "published ") == int(requests.size()); },
        kDeadline))
        << name << " did not publish";
    return prefill;
  }

  Subprocess* StartDecode(const std::string& name, const std::vector<std::string>& requests,
                          int64_t binding_lease_ms = kBindingLeaseMs) {
    std::vector<std::string> argv = ChildArgs("decode", binding_lease_ms);
    argv.insert(argv.end(), {"--reader", name});
    for (const std::string& r : requests) argv.insert(argv.end(), {"--request", r});
    return Start(name, argv);
  }
};

TEST_P(ScaleOutTest, DecodeReadsPromptsFromPrefillMemoryAndPoolServers) {
  Subprocess* pool_a = StartPool("pool-a", 1);
  Subprocess* pool_b = StartPool("pool-b", 1);
  ASSERT_TRUE(pool_a && pool_b);
  Subprocess* own = StartPrefill("prefill-0", {"own-1:11", "own-2:12"});
  Subprocess* into_a = StartPrefill("prefill-1", {"a-1:21"}, "pool-a", 0);
  Subprocess* into_b = StartPrefill("prefill-2", {"b-1:31"}, "pool-b", 1 << 20);
  ASSERT_TRUE(own && into_a && into_b);

  Subprocess* decode = StartDecode("decode-0", {"own-1:11", "own-2:12", "a-1:21", "b-1:31"});
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 4 failed 0", 5));
  EXPECT_EQ(Count(ReadFile(LogPath("decode-0")), "admitted "), 4);
  // While decode is bound, the writers cannot release.
  int64_t readers = 0;
  ASSERT_TRUE(plane_->Lookup("a-1", &readers).ok());
  EXPECT_EQ(readers, 1);

  EXPECT_EQ(Terminate(decode), 0);
  const std::string log = ReadFile(LogPath("decode-0"));
  EXPECT_EQ(Count(log, "WRONG"), 0) << log;
  EXPECT_EQ(Count(log, "failed: "), 0) << log;
  EXPECT_EQ(Count(log, ": OK"), 4) << log;
  // The misses read remote prompt rows, staged (remote pages) and into host rows (the pages of
  // the window), adjacent ones merged into one read: each top-k holds a run of 16 adjacent
  // prompt positions among 62, so merging saves about a fifth of the reads.
  const int64_t fetched = RemoteCounter(log, "rows_fetched");
  EXPECT_GT(RemoteCounter(log, "rows_staged"), 0) << log;
  EXPECT_GT(fetched, RemoteCounter(log, "rows_staged")) << log;
  EXPECT_LT(RemoteCounter(log, "reads") * 10, fetched * 9) << log;
  EXPECT_EQ(RemoteCounter(log, "failed_requests"), 0) << log;
  // Decode is done: every writer releases its requests and exits.
  for (Subprocess* prefill : {own, into_a, into_b}) {
    auto code = prefill->WaitFor(kDeadline);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0);
  }
  EXPECT_EQ(plane_->Lookup("a-1").status().code(), StatusCode::kNotFound);
  // Pool servers stop cleanly on SIGTERM and leave the membership.
  EXPECT_EQ(Terminate(pool_a), 0);
  EXPECT_EQ(Terminate(pool_b), 0);
  auto nodes = plane_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_TRUE(nodes->empty());
}

TEST_P(ScaleOutTest, KilledPoolServerFailsOnlyItsRequestsAndRejoins) {
  Subprocess* pool_a = StartPool("pool-a", 1);
  ASSERT_NE(StartPool("pool-b", 1), nullptr);
  ASSERT_NE(pool_a, nullptr);
  Subprocess* into_a = StartPrefill("prefill-a", {"a-1:21"}, "pool-a", 0);
  Subprocess* into_b = StartPrefill("prefill-b", {"b-1:31"}, "pool-b", 0);
  ASSERT_TRUE(into_a && into_b);
  Subprocess* decode = StartDecode("decode-0", {"a-1:21", "b-1:31"});
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 2 failed 0", 3));

  pool_a->Kill();
  // a-1 fails through the manager's RemoteStatus with a clear error, gets only skipped entries
  // in the next step and is released; b-1 goes on decoding.
  ASSERT_TRUE(WaitForLog("decode-0", "request a-1 failed: "));
  ASSERT_TRUE(WaitForLog("decode-0", "request a-1 skipped in step "));
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 1 failed 1", 5));
  const std::string log = ReadFile(LogPath("decode-0"));
  const std::string reason = LineAfter(log, "request a-1 failed: ");
  EXPECT_TRUE(reason.starts_with("Unavailable") || reason.starts_with("DeadlineExceeded"))
      << reason;
  EXPECT_NE(reason.find("remote prompt rows of request"), std::string::npos) << reason;
  EXPECT_NE(reason.find("'pool-a'"), std::string::npos) << reason;
  EXPECT_EQ(Count(log, "request b-1 failed"), 0);

  // Once pool-a's lease ran out, no one can bind its requests any more.
  ASSERT_TRUE(WaitUntil([&] { return !plane_->GetNode("pool-a").ok(); }, kDeadline));
  const auto late = plane_->Bind("a-1", "late-reader", milliseconds(kLeaseMs));
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable) << late.status().ToString();

  EXPECT_EQ(Terminate(decode), 0);
  const std::string final_log = ReadFile(LogPath("decode-0"));
  EXPECT_EQ(Count(final_log, "WRONG"), 0) << final_log;
  EXPECT_EQ(RemoteCounter(final_log, "failed_requests"), 1) << final_log;
  EXPECT_EQ(Count(final_log, "done b-1: OK"), 1) << final_log;
  EXPECT_EQ(Count(final_log, "done a-1: Unavailable"), 1) << final_log;
  // Both writers can release: decode's binding of a-1 ended with its Done.
  EXPECT_EQ(*into_a->WaitFor(kDeadline), 0);
  EXPECT_EQ(*into_b->WaitFor(kDeadline), 0);

  // pool-a restarts as incarnation 2: it serves new requests, never the lost ones.
  ASSERT_NE(StartPool("pool-a", 2), nullptr);
  ASSERT_NE(StartPrefill("prefill-a2", {"a-2:41"}, "pool-a", 0), nullptr);
  Subprocess* again = StartDecode("decode-1", {"a-2:41"});
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(WaitForLog("decode-1", "healthy 1 failed 0", 3));
  EXPECT_EQ(Terminate(again), 0);
  const std::string again_log = ReadFile(LogPath("decode-1"));
  EXPECT_EQ(Count(again_log, "WRONG"), 0) << again_log;
  EXPECT_EQ(Count(again_log, "done a-2: OK"), 1) << again_log;
  EXPECT_GT(RemoteCounter(again_log, "rows_fetched"), 0) << again_log;
}

TEST_P(ScaleOutTest, SecondPoolServerWithALiveNodeIdIsRefused) {
  Subprocess* first = StartPool("dup", 1);
  ASSERT_NE(first, nullptr);
  Subprocess* second = Start("dup-second", PoolArgs("dup"));
  ASSERT_NE(second, nullptr);
  // It fails at registration, without serving, and says which id is taken by whom.
  auto code = second->WaitFor(kDeadline);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 1);
  const std::string log = ReadFile(LogPath("dup-second"));
  EXPECT_NE(log.find("joining the pool as node 'dup'"), std::string::npos) << log;
  EXPECT_NE(log.find("AlreadyExists"), std::string::npos) << log;
  EXPECT_NE(log.find("node id dup is taken: incarnation 1"), std::string::npos) << log;
  EXPECT_NE(log.find("pid " + std::to_string(first->pid())), std::string::npos) << log;
  EXPECT_EQ(Count(log, " serves region "), 0) << log;
  // The first one keeps its registration and leaves cleanly as incarnation 1.
  auto node = plane_->GetNode("dup");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->incarnation, 1u);
  EXPECT_NE(node->address.find("pid " + std::to_string(first->pid())), std::string::npos);
  EXPECT_EQ(Terminate(first), 0);
  EXPECT_EQ(Count(ReadFile(LogPath("dup-1")), "taken over"), 0);
  EXPECT_EQ(plane_->GetNode("dup").status().code(), StatusCode::kNotFound);
}

// The control plane restarts without its data in the middle of a decode (a-1 bound and decoding)
// and of a hand-off (b-1 published, not yet bound): both requests fail cleanly, nothing stale is
// read, the writers learn that their records are lost, the pool server rejoins as the same
// incarnation, and a new hand-off through it works.
TEST_P(ScaleOutTest, ControlPlaneRestartFailsItsRecordsCleanlyAndPoolsRejoin) {
  Subprocess* pool = StartPool("pool-a", 1);
  ASSERT_NE(pool, nullptr);
  Subprocess* into_a = StartPrefill("prefill-a", {"a-1:21"}, "pool-a", 0);
  Subprocess* into_b = StartPrefill("prefill-b", {"b-1:31"}, "pool-a", 4 << 20);
  ASSERT_TRUE(into_a && into_b);
  Subprocess* decode = StartDecode("decode-0", {"a-1:21"});
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 1 failed 0", 3));

  redis_->Stop();
  ASSERT_TRUE(redis_->Restart().ok());
  // The bound reader's next renewal finds its binding gone: it stops reading a-1.
  ASSERT_TRUE(WaitForLog("decode-0", "request a-1 failed: "));
  const std::string reason = LineAfter(ReadFile(LogPath("decode-0")), "request a-1 failed: ");
  EXPECT_TRUE(reason.starts_with("NotFound") || reason.starts_with("FailedPrecondition")) << reason;
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 0 failed 1"));
  // The writers cannot release what the server forgot; they say so and exit.
  for (auto [process, name, key] :
       {std::tuple(into_a, "prefill-a", "a-1"), std::tuple(into_b, "prefill-b", "b-1")}) {
    auto code = process->WaitFor(kDeadline);
    ASSERT_TRUE(code.ok()) << name << ": " << code.status().ToString();
    EXPECT_EQ(*code, 3) << name;
    EXPECT_EQ(Count(ReadFile(LogPath(name)), std::string("lost ") + key + ": NotFound"), 1);
  }
  // The pool server rejoins as incarnation 1 and publishes its region again.
  ASSERT_TRUE(WaitUntil(
      [&] {
        uint64_t live = 0;
        return plane_->GetRegion("pool-a", 0, &live).ok() && live == 1;
      },
      kDeadline));
  EXPECT_TRUE(WaitForLog("pool-a-1", "rejoined as incarnation 1"));

  // The interrupted hand-off cannot be bound; a new one decodes exactly.
  ASSERT_NE(StartPrefill("prefill-c", {"c-1:41"}, "pool-a", 8 << 20), nullptr);
  Subprocess* again = StartDecode("decode-1", {"b-1:31", "c-1:41"});
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(WaitForLog("decode-1", "healthy 1 failed 1", 3));
  EXPECT_EQ(Terminate(again), 0);
  const std::string again_log = ReadFile(LogPath("decode-1"));
  EXPECT_NE(LineAfter(again_log, "request b-1 failed: ").find("NotFound"), std::string::npos)
      << again_log;
  EXPECT_EQ(Count(again_log, "done c-1: OK"), 1) << again_log;
  EXPECT_EQ(Count(again_log, "WRONG"), 0) << again_log;

  EXPECT_EQ(Terminate(decode), 0);
  const std::string log = ReadFile(LogPath("decode-0"));
  EXPECT_EQ(Count(log, "WRONG"), 0) << log;
  EXPECT_EQ(Count(log, "done a-1: OK"), 0) << log;
  EXPECT_EQ(Terminate(pool), 0);
}

// The control plane is unreachable (frozen) for longer than the pool server's lease in the
// middle of a decode: the data path does not need it, so decoding goes on exactly; the pool
// server rejoins as the same incarnation and the hand-off ends normally.
TEST_P(ScaleOutTest, ControlPlaneUnreachableLongerThanALeaseDecodeGoesOn) {
  Subprocess* pool = StartPool("pool-a", 1);
  ASSERT_NE(pool, nullptr);
  Subprocess* prefill = StartPrefill("prefill-a", {"a-1:21"}, "pool-a", 0);
  ASSERT_NE(prefill, nullptr);
  // A binding lease with room for a renewal stuck behind the frozen server's command deadline.
  Subprocess* decode = StartDecode("decode-0", {"a-1:21"}, 2 * kBindingLeaseMs);
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 1 failed 0", 3));

  redis_->Freeze();
  // The fault lasts a fixed time (measured on the steady clock): longer than the pool's lease.
  const auto thaw_at = std::chrono::steady_clock::now() + milliseconds(kLeaseMs + 500);
  EXPECT_TRUE(WaitUntil([&] { return std::chrono::steady_clock::now() >= thaw_at; }, kDeadline));
  redis_->Thaw();
  const int steps_before = Count(ReadFile(LogPath("decode-0")), "healthy 1 failed 0");
  ASSERT_TRUE(WaitForLog("pool-a-1", "rejoined as incarnation 1"));
  ASSERT_TRUE(WaitForLog("decode-0", "healthy 1 failed 0", steps_before + 20));
  auto node = plane_->GetNode("pool-a");
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->incarnation, 1u);

  EXPECT_EQ(Terminate(decode), 0);
  const std::string log = ReadFile(LogPath("decode-0"));
  EXPECT_EQ(Count(log, "WRONG"), 0) << log;
  EXPECT_EQ(Count(log, "failed: "), 0) << log;
  EXPECT_EQ(Count(log, "done a-1: OK"), 1) << log;
  auto code = prefill->WaitFor(kDeadline);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);
  EXPECT_EQ(Terminate(pool), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, ScaleOutTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sparsekv
