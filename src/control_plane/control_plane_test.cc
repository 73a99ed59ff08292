// The control plane against a real redis-server: membership and leases, region descriptors, the
// request-location protocol (generations, reader leases, concurrent binders), server failures.
#include "sparsekv/control_plane.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "testing/harness.h"
#include "testing/redis_server.h"
#include "testing/wait_until.h"

namespace sparsekv {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;
using testing::WaitUntil;

constexpr milliseconds kLongLease{60000};
constexpr milliseconds kDeadline{10000};

class ControlPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value().release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  // Options for the suite's server, with a key prefix of the test's own.
  static ControlPlaneOptions Options() {
    ControlPlaneOptions options;
    options.port = server_->port();
    options.key_prefix =
        std::string("test-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    return options;
  }
  static std::unique_ptr<ControlPlane> Connect() {
    auto plane = ControlPlane::Connect(Options());
    EXPECT_TRUE(plane.ok()) << plane.status().ToString();
    return plane.ok() ? std::move(plane).value() : nullptr;
  }

  // A location in region 0 of (node, incarnation).
  static RequestLocation Location(const std::string& node, uint64_t incarnation) {
    RequestLocation l;
    l.node_id = node;
    l.node_incarnation = incarnation;
    l.region_id = 0;
    l.base_offset = uint64_t{5} << 33;  // beyond 32 bits
    l.layer_stride = 656 * 4096;
    l.row_stride = 656;
    l.row_bytes = 656;
    l.layers = 61;
    l.tokens = 4000;
    return l;
  }

  static RedisServer* server_;
};

RedisServer* ControlPlaneTest::server_ = nullptr;

// A location in region 0 of ("pool", 1), for the tests with a server of their own.
RequestLocation PoolLocation() {
  RequestLocation l;
  l.node_id = "pool";
  l.node_incarnation = 1;
  l.row_stride = l.row_bytes = 656;
  l.layer_stride = 656 * 64;
  l.layers = 2;
  l.tokens = 64;
  return l;
}

TEST_F(ControlPlaneTest, ConnectRejectsBadOptions) {
  ControlPlaneOptions options = Options();
  options.port = 0;
  EXPECT_EQ(ControlPlane::Connect(options).status().code(), StatusCode::kInvalidArgument);
  options = Options();
  options.key_prefix.clear();
  EXPECT_EQ(ControlPlane::Connect(options).status().code(), StatusCode::kInvalidArgument);
  options = Options();
  options.command_timeout = milliseconds(0);
  EXPECT_EQ(ControlPlane::Connect(options).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ControlPlaneTest, ConnectWithoutServerIsUnavailable) {
  auto port = testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  ControlPlaneOptions options = Options();
  options.port = *port;
  const auto plane = ControlPlane::Connect(options);
  EXPECT_EQ(plane.status().code(), StatusCode::kUnavailable) << plane.status().ToString();
}

TEST_F(ControlPlaneTest, RegisterListGetDeregister) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  auto b = plane->RegisterNode("pool-b", "127.0.0.1 pid 2", kLongLease);
  auto a = plane->RegisterNode("pool-a", "127.0.0.1 pid 1", kLongLease);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 1u);
  EXPECT_EQ(*b, 1u);

  auto nodes = plane->ListNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].node_id, "pool-a");
  EXPECT_EQ((*nodes)[0].address, "127.0.0.1 pid 1");
  EXPECT_EQ((*nodes)[1].node_id, "pool-b");

  auto node = plane->GetNode("pool-b");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->incarnation, 1u);
  EXPECT_EQ(node->address, "127.0.0.1 pid 2");

  ASSERT_TRUE(plane->Deregister("pool-b", 1).ok());
  EXPECT_EQ(plane->GetNode("pool-b").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(plane->Deregister("pool-b", 1).code(), StatusCode::kNotFound);
  nodes = plane->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].node_id, "pool-a");
  EXPECT_EQ(plane->GetNode("never-registered").status().code(), StatusCode::kNotFound);
}

TEST_F(ControlPlaneTest, SecondRegistrationOfALiveIdIsRefused) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  ASSERT_EQ(*plane->RegisterNode("dup", "first", kLongLease), 1u);
  ASSERT_TRUE(plane->PublishRegion("dup", 1, 0, "first descriptor").ok());

  const auto second = plane->RegisterNode("dup", "second", kLongLease);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  EXPECT_NE(second.status().message().find("node id dup is taken"), std::string::npos)
      << second.status().ToString();
  EXPECT_NE(second.status().message().find("first"), std::string::npos);
  // The live member keeps its registration, its region and its heartbeats.
  auto node = plane->GetNode("dup");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->incarnation, 1u);
  EXPECT_EQ(node->address, "first");
  EXPECT_EQ(*plane->GetRegion("dup", 0), "first descriptor");
  EXPECT_TRUE(plane->Heartbeat("dup", 1, kLongLease).ok());
  // Once it has left, the id is free again, as a new incarnation.
  ASSERT_TRUE(plane->Deregister("dup", 1).ok());
  EXPECT_EQ(*plane->RegisterNode("dup", "second", kLongLease), 2u);
}

TEST_F(ControlPlaneTest, RejoinKeepsTheIncarnationOfALapsedLease) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  constexpr milliseconds kShortLease{150};
  ASSERT_EQ(*plane->RegisterNode("pool", "a", kShortLease), 1u);
  ASSERT_TRUE(plane->Publish("req", Location("pool", 1)).ok());
  ASSERT_TRUE(WaitUntil([&] { return !plane->GetNode("pool").ok(); }, kDeadline));
  EXPECT_EQ(plane->Heartbeat("pool", 1, kLongLease).code(), StatusCode::kNotFound);
  EXPECT_EQ(plane->Bind("req", "r", kLongLease).status().code(), StatusCode::kUnavailable);

  // Same process, same memory: it rejoins as incarnation 1, and its records are valid again.
  ASSERT_TRUE(plane->Rejoin("pool", 1, "a", kLongLease).ok());
  EXPECT_EQ(plane->GetNode("pool")->incarnation, 1u);
  EXPECT_TRUE(plane->Rejoin("pool", 1, "a", kLongLease).ok());  // still live: a heartbeat
  EXPECT_TRUE(plane->Bind("req", "r", kLongLease).ok());
  EXPECT_EQ(plane->Rejoin("pool", 2, "b", kLongLease).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(plane->Rejoin("pool", 0, "a", kLongLease).code(), StatusCode::kInvalidArgument);

  // A newer incarnation registered while the old one's lease had lapsed: no rejoin.
  ASSERT_TRUE(plane->Deregister("pool", 1).ok());
  ASSERT_EQ(*plane->RegisterNode("pool", "b", kLongLease), 2u);
  EXPECT_EQ(plane->Rejoin("pool", 1, "a", kLongLease).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(plane->Deregister("pool", 2).ok());
  const Status late = plane->Rejoin("pool", 1, "a", kLongLease);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.ToString();
  EXPECT_NE(late.message().find("superseded by incarnation 2"), std::string::npos);
}

TEST_F(ControlPlaneTest, ReRegistrationAfterTheLeaseSupersedesTheOldIncarnation) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  constexpr milliseconds kShortLease{150};
  ASSERT_EQ(*plane->RegisterNode("pool", "first", kShortLease), 1u);
  ASSERT_TRUE(plane->PublishRegion("pool", 1, 0, "old descriptor").ok());
  ASSERT_TRUE(WaitUntil([&] { return !plane->GetNode("pool").ok(); }, kDeadline));
  ASSERT_EQ(*plane->RegisterNode("pool", "restarted", kLongLease), 2u);

  const Status old_heartbeat = plane->Heartbeat("pool", 1, kLongLease);
  EXPECT_EQ(old_heartbeat.code(), StatusCode::kFailedPrecondition) << old_heartbeat.ToString();
  EXPECT_NE(old_heartbeat.message().find("superseded"), std::string::npos);
  EXPECT_EQ(plane->PublishRegion("pool", 1, 0, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(plane->Deregister("pool", 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(plane->Heartbeat("pool", 2, kLongLease).ok());
  // The old incarnation's regions went with it.
  EXPECT_EQ(plane->GetRegion("pool", 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(plane->GetNode("pool")->address, "restarted");
}

TEST_F(ControlPlaneTest, LeaseExpiryEndsMembershipUnlessHeartbeated) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  constexpr milliseconds kShortLease{150};
  ASSERT_TRUE(plane->RegisterNode("silent", "", kShortLease).ok());
  ASSERT_TRUE(plane->PublishRegion("silent", 1, 3, "descriptor").ok());
  ASSERT_TRUE(plane->RegisterNode("beating", "", kShortLease).ok());
  ASSERT_TRUE(plane->Heartbeat("beating", 1, kLongLease).ok());

  EXPECT_TRUE(WaitUntil([&] { return !plane->GetNode("silent").ok(); }, kDeadline));
  EXPECT_EQ(plane->GetNode("silent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(plane->GetRegion("silent", 3).status().code(), StatusCode::kNotFound);
  const Status late = plane->Heartbeat("silent", 1, kLongLease);
  EXPECT_EQ(late.code(), StatusCode::kNotFound) << late.ToString();
  // The heartbeat extended the other lease past the one that expired.
  EXPECT_TRUE(plane->GetNode("beating").ok());
  auto nodes = plane->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].node_id, "beating");
  // Registering again makes a new incarnation.
  EXPECT_EQ(*plane->RegisterNode("silent", "", kLongLease), 2u);
}

TEST_F(ControlPlaneTest, RegionDescriptorsAreBinarySafe) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(plane->RegisterNode("pool", "", kLongLease).ok());
  std::string descriptor;
  for (int i = 0; i < 4096; ++i) descriptor.push_back(static_cast<char>(i * 7 % 256));
  ASSERT_NE(descriptor.find('\0'), std::string::npos);
  ASSERT_TRUE(plane->PublishRegion("pool", 1, 7, descriptor).ok());
  ASSERT_TRUE(plane->PublishRegion("pool", 1, 8, "other").ok());

  uint64_t incarnation = 0;
  auto got = plane->GetRegion("pool", 7, &incarnation);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, descriptor);
  EXPECT_EQ(incarnation, 1u);
  EXPECT_EQ(*plane->GetRegion("pool", 8), "other");
  EXPECT_EQ(plane->GetRegion("pool", 9).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(plane->PublishRegion("nobody", 1, 0, "x").code(), StatusCode::kNotFound);
}

TEST_F(ControlPlaneTest, PublishBindDoneRelease) {
  auto writer = Connect();
  auto reader = Connect();
  ASSERT_TRUE(writer && reader);
  ASSERT_TRUE(writer->RegisterNode("prefill-0", "", kLongLease).ok());
  const RequestLocation location = Location("prefill-0", 1);

  auto generation = writer->Publish("req-1", location);
  ASSERT_TRUE(generation.ok()) << generation.status().ToString();
  EXPECT_EQ(*generation, 1u);
  auto again = writer->Publish("req-1", location);
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);

  auto binding = reader->Bind("req-1", "decode-0/7", kLongLease);
  ASSERT_TRUE(binding.ok()) << binding.status().ToString();
  EXPECT_EQ(binding->generation, 1u);
  EXPECT_EQ(binding->location, location);
  int64_t live = -1;
  ASSERT_TRUE(writer->Lookup("req-1", &live).ok());
  EXPECT_EQ(live, 1);

  const Status refused = writer->Release("req-1", 1);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("1 reader(s) still bound"), std::string::npos);

  ASSERT_TRUE(reader->Done("req-1", "decode-0/7", 1).ok());
  int64_t done = -1;
  ASSERT_TRUE(writer->Lookup("req-1", &live, &done).ok());
  EXPECT_EQ(live, 0);
  EXPECT_EQ(done, 1);
  ASSERT_TRUE(writer->Release("req-1", 1).ok());
  EXPECT_EQ(writer->Lookup("req-1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reader->Bind("req-1", "decode-0/7", kLongLease).status().code(), StatusCode::kNotFound);

  // The key can be published again, with the next generation.
  generation = writer->Publish("req-1", location);
  ASSERT_TRUE(generation.ok());
  EXPECT_EQ(*generation, 2u);
}

// A prompt sealed in a node pool: the record carries the owner and seal (node_pool.h) through
// Bind and Lookup; an owner without a seal, or a seal without an owner, is refused.
TEST_F(ControlPlaneTest, NodePoolLocationsKeepTheirOwnerAndSeal) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(plane->RegisterNode("node-a", "", kLongLease).ok());
  RequestLocation location;
  location.node_id = "node-a";
  location.node_incarnation = 1;
  location.region_id = 1;
  location.row_bytes = 656;
  location.layers = 61;
  location.tokens = 32768;
  location.node_pool_owner = 17;
  location.node_pool_seal = uint64_t{3} << 40;  // beyond 32 bits
  ASSERT_TRUE(plane->Publish("np-1", location).ok());
  auto binding = plane->Bind("np-1", "decode", kLongLease);
  ASSERT_TRUE(binding.ok()) << binding.status().ToString();
  EXPECT_EQ(binding->location, location);
  auto looked_up = plane->Lookup("np-1");
  ASSERT_TRUE(looked_up.ok());
  EXPECT_EQ(looked_up->location.node_pool_seal, location.node_pool_seal);
  // An affine location keeps -1 and 0.
  ASSERT_TRUE(plane->Publish("affine", Location("node-a", 1)).ok());
  auto affine = plane->Lookup("affine");
  ASSERT_TRUE(affine.ok());
  EXPECT_EQ(affine->location.node_pool_owner, -1);
  EXPECT_EQ(affine->location.node_pool_seal, 0u);
  RequestLocation bad = location;
  bad.node_pool_seal = 0;
  EXPECT_EQ(plane->Publish("np-2", bad).status().code(), StatusCode::kInvalidArgument);
  bad = location;
  bad.node_pool_owner = -1;
  EXPECT_EQ(plane->Publish("np-2", bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ControlPlaneTest, StaleGenerationsAreRefused) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(plane->RegisterNode("prefill-0", "", kLongLease).ok());
  ASSERT_EQ(*plane->Publish("req", Location("prefill-0", 1)), 1u);
  ASSERT_TRUE(plane->Bind("req", "slow-reader", kLongLease).ok());
  ASSERT_TRUE(plane->Done("req", "slow-reader", 1).ok());
  ASSERT_TRUE(plane->Release("req", 1).ok());

  // Generation 1 was released: every call naming it is refused, before and after the key is
  // published again.
  for (int round = 0; round < 2; ++round) {
    const Status done = plane->Done("req", "slow-reader", 1);
    EXPECT_EQ(done.code(), StatusCode::kFailedPrecondition) << done.ToString();
    EXPECT_NE(done.message().find("stale generation 1"), std::string::npos) << done.ToString();
    EXPECT_EQ(plane->RenewBinding("req", "slow-reader", 1, kLongLease).code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ(plane->Release("req", 1).code(), StatusCode::kFailedPrecondition);
    if (round == 0) {
      ASSERT_EQ(*plane->Publish("req", Location("prefill-0", 1)), 2u);
    }
  }
  // Any generation but the current one is stale while a record exists.
  EXPECT_EQ(plane->Release("req", 9).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(plane->Release("req", 2).ok());
  // A generation the key never had.
  EXPECT_EQ(plane->Release("req", 9).code(), StatusCode::kNotFound);
  EXPECT_EQ(plane->Done("other-key", "r", 1).code(), StatusCode::kNotFound);
}

TEST_F(ControlPlaneTest, BindRefusedWhenTheOwningNodeIsGone) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(plane->RegisterNode("pool", "", kLongLease).ok());
  EXPECT_EQ(plane->Publish("req", Location("pool", 2)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(plane->Publish("req", Location("nobody", 1)).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(plane->Publish("req", Location("pool", 1)).ok());
  ASSERT_TRUE(plane->Bind("req", "early", kLongLease).ok());

  // The pool server restarts: its memory is new, the record's rows are gone.
  ASSERT_TRUE(plane->Deregister("pool", 1).ok());
  ASSERT_EQ(*plane->RegisterNode("pool", "", kLongLease), 2u);
  const auto bind = plane->Bind("req", "late", kLongLease);
  EXPECT_EQ(bind.status().code(), StatusCode::kUnavailable) << bind.status().ToString();
  EXPECT_NE(bind.status().message().find("recompute"), std::string::npos);
  ASSERT_TRUE(plane->Deregister("pool", 2).ok());
  EXPECT_EQ(plane->Bind("req", "late", kLongLease).status().code(), StatusCode::kUnavailable);
  // The reader bound before the failure learns that what it read may be stale; its binding
  // ends, so the writer can release.
  const Status done = plane->Done("req", "early", 1);
  EXPECT_EQ(done.code(), StatusCode::kUnavailable) << done.ToString();
  EXPECT_NE(done.message().find("discard"), std::string::npos);
  EXPECT_TRUE(plane->Release("req", 1).ok());
}

TEST_F(ControlPlaneTest, ExpiredReaderLeasesDoNotBlockRelease) {
  auto plane = Connect();
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(plane->RegisterNode("pool", "", kLongLease).ok());
  ASSERT_TRUE(plane->Publish("req", Location("pool", 1)).ok());
  constexpr milliseconds kShortLease{150};
  ASSERT_TRUE(plane->Bind("req", "dies", kShortLease).ok());
  ASSERT_TRUE(plane->Bind("req", "renews", kShortLease).ok());
  ASSERT_TRUE(plane->Bind("req", "expires", kShortLease).ok());
  ASSERT_TRUE(plane->RenewBinding("req", "renews", 1, kLongLease).ok());
  EXPECT_EQ(plane->Release("req", 1).code(), StatusCode::kFailedPrecondition);

  int64_t live = -1;
  EXPECT_TRUE(WaitUntil([&] { return plane->Lookup("req", &live).ok() && live == 1; }, kDeadline));
  EXPECT_EQ(live, 1);
  // A reader whose lease ran out is told to discard what it read.
  const Status expired = plane->Done("req", "expires", 1);
  EXPECT_EQ(expired.code(), StatusCode::kFailedPrecondition) << expired.ToString();
  EXPECT_NE(expired.message().find("discard"), std::string::npos);
  EXPECT_EQ(plane->RenewBinding("req", "dies", 1, kLongLease).code(),
            StatusCode::kFailedPrecondition);
  // The renewed binding still blocks the release; the dead reader does not.
  const Status refused = plane->Release("req", 1);
  EXPECT_NE(refused.message().find("1 reader(s) still bound"), std::string::npos)
      << refused.ToString();
  ASSERT_TRUE(plane->Done("req", "renews", 1).ok());
  EXPECT_TRUE(plane->Release("req", 1).ok());
}

// Readers bind and finish concurrently while the writer keeps trying to release and republish:
// a release must never succeed while a reader holds a binding it was granted.
TEST_F(ControlPlaneTest, ConcurrentBindersNeverSeeARelease) {
  auto writer = Connect();
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->RegisterNode("pool", "", kLongLease).ok());
  auto first = writer->Publish("req", Location("pool", 1));
  ASSERT_TRUE(first.ok());
  std::atomic<uint64_t> generation = *first;

  constexpr int kReaders = 4;
  constexpr int kBindsPerReader = 25;
  std::atomic<int> bound_now = 0;
  std::atomic<int> readers_left = kReaders;
  std::atomic<int> violations = 0;
  std::atomic<int> reader_errors = 0;
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      auto plane = ControlPlane::Connect(Options());
      for (int done = 0; plane.ok() && done < kBindsPerReader;) {
        const std::string name = "reader-" + std::to_string(r);
        auto binding = (*plane)->Bind("req", name, kLongLease);
        if (!binding.ok()) {
          // Between a release and the next publication.
          if (binding.status().code() != StatusCode::kNotFound) ++reader_errors;
          continue;
        }
        ++bound_now;  // between a granted Bind and its Done
        --bound_now;
        if (!(*plane)->Done("req", name, binding->generation).ok()) ++reader_errors;
        ++done;
      }
      if (!plane.ok()) ++reader_errors;
      --readers_left;
    });
  }
  int releases = 0;
  while (readers_left.load() > 0) {
    if (!writer->Release("req", generation.load()).ok()) continue;
    if (bound_now.load() != 0) ++violations;
    ++releases;
    auto next = writer->Publish("req", Location("pool", 1));
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    generation = *next;
  }
  for (std::thread& t : readers) t.join();
  EXPECT_TRUE(writer->Release("req", generation.load()).ok());
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(reader_errors.load(), 0);
  EXPECT_EQ(generation.load(), static_cast<uint64_t>(releases) + 1);
}

TEST(ControlPlaneServerFailureTest, StoppedServerIsUnavailableAndRestartedOneReconnects) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ControlPlaneOptions options;
  options.port = (*server)->port();
  auto plane = ControlPlane::Connect(options);
  ASSERT_TRUE(plane.ok());
  ASSERT_TRUE((*plane)->RegisterNode("pool", "", kLongLease).ok());

  (*server)->Stop();
  const Status down = (*plane)->Heartbeat("pool", 1, kLongLease);
  EXPECT_EQ(down.code(), StatusCode::kUnavailable) << down.ToString();
  EXPECT_EQ((*plane)->ListNodes().status().code(), StatusCode::kUnavailable);

  ASSERT_TRUE((*server)->Restart().ok());
  // Nothing persisted: the node must register again, and does so on the same client.
  EXPECT_EQ((*plane)->Heartbeat("pool", 1, kLongLease).code(), StatusCode::kNotFound);
  EXPECT_TRUE((*plane)->RegisterNode("pool", "", kLongLease).ok());
}

TEST(ControlPlaneServerFailureTest, RestartLosesRecordsAndBindingsButMembersRejoin) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ControlPlaneOptions options;
  options.port = (*server)->port();
  auto connected = ControlPlane::Connect(options);
  ASSERT_TRUE(connected.ok());
  ControlPlane& plane = **connected;
  ASSERT_EQ(*plane.RegisterNode("pool", "", kLongLease), 1u);
  ASSERT_EQ(*plane.Publish("req", PoolLocation()), 1u);
  const auto bound = plane.Bind("req", "reader", kLongLease);
  ASSERT_TRUE(bound.ok());

  (*server)->Stop();
  ASSERT_TRUE((*server)->Restart().ok());
  // The reader's binding went with the record: it learns so at its next call, never OK.
  const Status renewed = plane.RenewBinding("req", "reader", bound->generation, kLongLease);
  EXPECT_EQ(renewed.code(), StatusCode::kNotFound) << renewed.ToString();
  EXPECT_EQ(plane.Done("req", "reader", bound->generation).code(), StatusCode::kNotFound);
  EXPECT_EQ(plane.Bind("req", "late", kLongLease).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(plane.Release("req", bound->generation).code(), StatusCode::kNotFound);
  EXPECT_EQ(plane.Lookup("req").status().code(), StatusCode::kNotFound);

  // The member notices at its next heartbeat and rejoins as the same incarnation; the counter
  // resumes from it, so a later registration is still a new incarnation.
  EXPECT_EQ(plane.Heartbeat("pool", 1, kLongLease).code(), StatusCode::kNotFound);
  ASSERT_TRUE(plane.Rejoin("pool", 1, "", kLongLease).ok());
  EXPECT_EQ(plane.GetNode("pool")->incarnation, 1u);
  EXPECT_EQ(plane.RegisterNode("pool", "", kLongLease).status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(plane.Deregister("pool", 1).ok());
  EXPECT_EQ(*plane.RegisterNode("pool", "", kLongLease), 2u);
}

TEST(ControlPlaneServerFailureTest, FrozenLongerThanALeaseMembersRejoinAndBindingsSurvive) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ControlPlaneOptions options;
  options.port = (*server)->port();
  options.command_timeout = milliseconds(200);
  auto connected = ControlPlane::Connect(options);
  ASSERT_TRUE(connected.ok());
  ControlPlane& plane = **connected;
  constexpr milliseconds kLease{500};
  ASSERT_EQ(*plane.RegisterNode("pool", "", kLease), 1u);
  ASSERT_TRUE(plane.Publish("req", PoolLocation()).ok());
  const auto bound = plane.Bind("req", "reader", kLongLease);
  ASSERT_TRUE(bound.ok());

  // Unreachable for longer than the member's lease (but not the reader's): the fault lasts
  // a fixed time, measured on the steady clock.
  (*server)->Freeze();
  const auto thaw_at = std::chrono::steady_clock::now() + 2 * kLease;
  EXPECT_EQ(plane.Heartbeat("pool", 1, kLease).code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(WaitUntil([&] { return std::chrono::steady_clock::now() >= thaw_at; }, kDeadline));
  (*server)->Thaw();

  // The member's lease lapsed on the server's clock. The reader's renewal is refused while no
  // incarnation is live, but its binding is kept, so the writer still cannot release.
  EXPECT_EQ(plane.Heartbeat("pool", 1, kLease).code(), StatusCode::kNotFound);
  const Status away = plane.RenewBinding("req", "reader", bound->generation, kLongLease);
  EXPECT_EQ(away.code(), StatusCode::kUnavailable) << away.ToString();
  int64_t live_readers = 0;
  ASSERT_TRUE(plane.Lookup("req", &live_readers).ok());
  EXPECT_EQ(live_readers, 1);
  EXPECT_EQ(plane.Release("req", bound->generation).code(), StatusCode::kFailedPrecondition);
  // The member rejoins as incarnation 1: the reader goes on and finishes cleanly.
  ASSERT_TRUE(plane.Rejoin("pool", 1, "", kLongLease).ok());
  EXPECT_TRUE(plane.RenewBinding("req", "reader", bound->generation, kLongLease).ok());
  EXPECT_TRUE(plane.Done("req", "reader", bound->generation).ok());
  EXPECT_TRUE(plane.Release("req", bound->generation).ok());
}

TEST(ControlPlaneServerFailureTest, UnresponsiveServerHitsTheCommandDeadline) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ControlPlaneOptions options;
  options.port = (*server)->port();
  options.command_timeout = milliseconds(200);
  auto plane = ControlPlane::Connect(options);
  ASSERT_TRUE(plane.ok());

  (*server)->Freeze();
  const auto start = std::chrono::steady_clock::now();
  const auto frozen = (*plane)->ListNodes();
  const auto waited = std::chrono::steady_clock::now() - start;
  (*server)->Thaw();
  EXPECT_EQ(frozen.status().code(), StatusCode::kDeadlineExceeded) << frozen.status().ToString();
  EXPECT_LT(waited, std::chrono::seconds(5));
  // The next call reconnects.
  EXPECT_TRUE((*plane)->ListNodes().ok());
}

}  // namespace
}  // namespace sparsekv
