// ExtensionChain on its own, with extensions that log what they hear: which hooks run on which
// extensions, in what order, how BeforeCopy hands lists on, and the order of destruction.
#include "manager/extension_chain.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace sparsekv {
namespace {

using Log = std::vector<std::string>;

// An extension named `name` that logs every call into `log`, is active in a step iff `active`
// is, and whose BeforeCopy advances the list's host_row pointer by `shift`.
class LoggingExtension final : public ManagerExtension {
 public:
  LoggingExtension(std::string name, Log* log, bool active, int32_t shift = 0)
      : name_(std::move(name)), log_(log), active_(active), shift_(shift) {}
  ~LoggingExtension() override { log_->push_back(name_ + " destroyed"); }

  bool BeginStep(std::span<const RequestId> batch, StreamHandle) override {
    log_->push_back(name_ + " BeginStep " + std::to_string(batch.size()));
    return active_;
  }
  StatusOr<MissList> BeforeCopy(int32_t layer, const MissList& list, int32_t capacity, int32_t lane,
                                StreamHandle) override {
    log_->push_back(name_ + " BeforeCopy " + std::to_string(layer) + " " +
                    std::to_string(capacity) + " " + std::to_string(lane));
    if (fail_copy_) return Unavailable(name_ + " cannot copy");
    MissList out = list;
    out.host_row += shift_;
    return out;
  }
  Status AfterCopy(int32_t layer, StreamHandle) override {
    log_->push_back(name_ + " AfterCopy " + std::to_string(layer));
    return Status::Ok();
  }
  Status AfterResolve(int32_t layer, int32_t*, StreamHandle) override {
    log_->push_back(name_ + " AfterResolve " + std::to_string(layer));
    return Status::Ok();
  }
  Status AfterMissCopy(int32_t layer, StreamHandle) override {
    log_->push_back(name_ + " AfterMissCopy " + std::to_string(layer));
    return Status::Ok();
  }
  void OnDrop(RequestId id) override { log_->push_back(name_ + " OnDrop " + std::to_string(id)); }
  Status CheckFork(RequestId parent) const override {
    if (refuse_fork_) return FailedPrecondition(name_ + " refuses " + std::to_string(parent));
    return Status::Ok();
  }

  bool fail_copy_ = false;
  bool refuse_fork_ = false;

 private:
  std::string name_;
  Log* log_;
  bool active_;
  int32_t shift_;
};

// A host the factories ignore.
class UnusedHost final : public ExtensionHost {
 public:
  const CacheOptions& options() const override { std::abort(); }
  Backend& backend() const override { std::abort(); }
  HostKVPool& pool() const override { std::abort(); }
  const HotCache& hot_cache() const override { std::abort(); }
  std::span<const RequestId> batch() const override { return {}; }
  int32_t BlockOf(RequestId) const override { return -1; }
  int32_t OwnerOf(RequestId) const override { return -1; }
  int32_t LengthOf(RequestId) const override { return 0; }
  bool IsLive(RequestId) const override { return false; }
  unsigned long long* invalid_copy_counter() const override { return nullptr; }
  int32_t miss_list_lanes() const override { return 1; }
  int32_t miss_list_lane_capacity() const override { return 0; }
  Status AdmitWithPages(RequestId, int32_t, int32_t, std::span<const int32_t>,
                        StreamHandle) override {
    return Status::Ok();
  }
  Status CompleteLayer(RequestId, int32_t, StreamHandle) override { return Status::Ok(); }
  void Drop(RequestId) override {}
};

class ExtensionChainTest : public ::testing::Test {
 protected:
  // Installs an extension and returns it (owned by the chain).
  LoggingExtension* Install(const std::string& name, bool active, int32_t shift = 0) {
    LoggingExtension* made = nullptr;
    const Status s = chain_.Install(
        [&](ExtensionHost& host) -> StatusOr<std::unique_ptr<ManagerExtension>> {
          EXPECT_EQ(&host, &host_);
          auto e = std::make_unique<LoggingExtension>(name, &log_, active, shift);
          made = e.get();
          return std::unique_ptr<ManagerExtension>(std::move(e));
        },
        host_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return made;
  }

  Log log_;
  UnusedHost host_;
  ExtensionChain chain_;
};

TEST_F(ExtensionChainTest, InstallKeepsTheOrderAndReportsAFactorysError) {
  LoggingExtension* a = Install("a", true);
  LoggingExtension* b = Install("b", false);
  EXPECT_EQ(chain_.all(), (std::vector<ManagerExtension*>{a, b}));
  const Status s = chain_.Install(
      [](ExtensionHost&) -> StatusOr<std::unique_ptr<ManagerExtension>> {
        return InvalidArgument("no tier");
      },
      host_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "no tier");
  EXPECT_EQ(chain_.all().size(), 2u);
}

TEST_F(ExtensionChainTest, StepHooksRunOnlyOnTheActiveExtensionsInOrder) {
  Install("a", true);
  Install("b", false);
  Install("c", true);
  EXPECT_FALSE(chain_.active());
  const std::vector<RequestId> batch = {7, 8};
  chain_.BeginStep(batch, nullptr);
  EXPECT_TRUE(chain_.active());
  ASSERT_TRUE(chain_.AfterResolve(2, nullptr, nullptr).ok());
  ASSERT_TRUE(chain_.AfterCopy(2, nullptr).ok());
  ASSERT_TRUE(chain_.AfterMissCopy(3, nullptr).ok());
  EXPECT_EQ(log_, (Log{"a BeginStep 2", "b BeginStep 2", "c BeginStep 2", "a AfterResolve 2",
                       "c AfterResolve 2", "a AfterCopy 2", "c AfterCopy 2", "a AfterMissCopy 3",
                       "c AfterMissCopy 3"}));
}

TEST_F(ExtensionChainTest, ANewStepForgetsWhichWereActive) {
  Install("a", true);
  chain_.BeginStep({}, nullptr);
  EXPECT_TRUE(chain_.active());
  ExtensionChain none;
  none.BeginStep({}, nullptr);
  EXPECT_FALSE(none.active());
  ASSERT_TRUE(none.AfterCopy(0, nullptr).ok());
}

TEST_F(ExtensionChainTest, BeforeCopyHandsEachTheListTheOneBeforeReturned) {
  Install("a", true, 1);
  Install("b", true, 10);
  chain_.BeginStep({}, nullptr);
  int32_t rows[16] = {};
  const MissList list{rows, rows, nullptr};
  StatusOr<MissList> out = chain_.BeforeCopy(4, list, 16, 3, nullptr);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->host_row, rows + 11);
  EXPECT_EQ(log_.back(), "b BeforeCopy 4 16 3");
}

TEST_F(ExtensionChainTest, AFailingBeforeCopyStopsTheChain) {
  LoggingExtension* a = Install("a", true);
  Install("b", true);
  a->fail_copy_ = true;
  chain_.BeginStep({}, nullptr);
  log_.clear();
  int32_t rows[4] = {};
  StatusOr<MissList> out = chain_.BeforeCopy(0, MissList{rows, rows, nullptr}, 4, 0, nullptr);
  EXPECT_EQ(out.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(log_, (Log{"a BeforeCopy 0 4 0"}));
}

TEST_F(ExtensionChainTest, ForkAndDropConcernEveryExtension) {
  Install("a", false);
  LoggingExtension* b = Install("b", false);
  EXPECT_TRUE(chain_.CheckFork(5).ok());
  b->refuse_fork_ = true;
  const Status s = chain_.CheckFork(5);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "b refuses 5");
  chain_.OnDrop(9);
  EXPECT_EQ(log_, (Log{"a OnDrop 9", "b OnDrop 9"}));
}

TEST_F(ExtensionChainTest, ClearDestroysTheLastInstalledFirst) {
  Install("a", true);
  Install("b", true);
  chain_.BeginStep({}, nullptr);
  log_.clear();
  chain_.Clear();
  EXPECT_EQ(log_, (Log{"b destroyed", "a destroyed"}));
  EXPECT_TRUE(chain_.all().empty());
  EXPECT_FALSE(chain_.active());
}

}  // namespace
}  // namespace sparsekv
