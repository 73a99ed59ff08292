#include "sparsekv/host_kv_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "testing/counting_backend.h"

namespace sparsekv {
namespace {

class HostKVPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    geometry_ = KVGeometry::Uniform(3, 24, 32);
    auto pool = HostKVPool::Create(geometry_, /*capacity_tokens=*/100, /*page_tokens=*/16,
                                   /*max_owners=*/4, /*max_tokens_per_owner=*/64, backend_.get());
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
  }
  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  KVGeometry geometry_;
  std::unique_ptr<HostKVPool> pool_;
};

TEST_F(HostKVPoolTest, CapacityIsRoundedUpToPagesAndLayerMajor) {
  EXPECT_EQ(pool_->rows(), 112);
  EXPECT_EQ(pool_->total_pages(), 7);
  EXPECT_EQ(pool_->bytes(), 112 * 3 * 32);
  EXPECT_EQ(pool_->row(1, 5), pool_->layer_base(1) + 5 * 32);
}

TEST_F(HostKVPoolTest, PagesMapPositionsToDistinctRows) {
  ASSERT_TRUE(pool_->Reserve(0, 40).ok());
  ASSERT_TRUE(pool_->Reserve(1, 17).ok());
  EXPECT_EQ(pool_->ReservedTokens(0), 48);
  std::set<int32_t> rows;
  for (int32_t p = 0; p < 48; ++p) rows.insert(pool_->HostRow(0, p));
  for (int32_t p = 0; p < 32; ++p) rows.insert(pool_->HostRow(1, p));
  EXPECT_EQ(rows.size(), 80u);
  EXPECT_EQ(pool_->free_pages(), 2);
}

TEST_F(HostKVPoolTest, ExhaustionIsAnErrorAndChangesNothing) {
  ASSERT_TRUE(pool_->Reserve(0, 64).ok());  // 4 pages
  std::memset(pool_->row(0, pool_->HostRow(0, 3)), 0x5A, 24);
  const Status s = pool_->Reserve(1, 64);  // needs 4, 3 free
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(pool_->free_pages(), 3);
  EXPECT_EQ(pool_->ReservedTokens(1), 0);
  EXPECT_EQ(pool_->row(0, pool_->HostRow(0, 3))[7], std::byte{0x5A});
  EXPECT_TRUE(pool_->Reserve(1, 48).ok());
}

TEST_F(HostKVPoolTest, ReleaseReturnsPagesAndReservationLimitsHold) {
  ASSERT_TRUE(pool_->Reserve(2, 33).ok());
  EXPECT_EQ(pool_->Reserve(2, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool_->Reserve(3, 65).code(), StatusCode::kOutOfRange);
  pool_->Release(2);
  EXPECT_EQ(pool_->free_pages(), 7);
  EXPECT_EQ(pool_->page_table_row(2)[0], -1);
  pool_->Release(2);  // no-op
  EXPECT_EQ(pool_->free_pages(), 7);
}

TEST_F(HostKVPoolTest, SharedPrefixPagesAreReferencedNotCopied) {
  ASSERT_TRUE(pool_->Reserve(0, 40).ok());  // pages a, b, c
  const std::span<const int32_t> a = pool_->page_table_row(0);
  ASSERT_TRUE(pool_->Reserve(1, 50, a.first(2)).ok());  // a, b shared; 2 fresh
  EXPECT_EQ(pool_->page_table_row(1)[0], a[0]);
  EXPECT_EQ(pool_->page_table_row(1)[1], a[1]);
  EXPECT_NE(pool_->page_table_row(1)[2], a[2]);
  EXPECT_EQ(pool_->RefCount(a[0]), 2);
  EXPECT_EQ(pool_->RefCount(a[2]), 1);
  EXPECT_EQ(pool_->free_pages(), 2);
  EXPECT_EQ(pool_->shared_pages(), 2);
  EXPECT_EQ(pool_->extra_references(), 2);
  EXPECT_EQ(pool_->page_bytes(), 16 * 3 * 32);
  EXPECT_EQ(pool_->Reserve(2, 16, a.first(2)).code(), StatusCode::kInvalidArgument);
}

TEST_F(HostKVPoolTest, ASharedPrefixOfFreeOrBadPagesIsRefusedAndChangesNothing) {
  ASSERT_TRUE(pool_->Reserve(0, 32).ok());  // pages a, b
  const int32_t a = pool_->page_table_row(0)[0];
  const int32_t free_page = a + 2;  // never allocated
  for (const std::vector<int32_t>& prefix :
       {std::vector<int32_t>{a, free_page}, std::vector<int32_t>{-1}, std::vector<int32_t>{7}}) {
    const Status s = pool_->Reserve(1, 48, prefix);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    const std::string names = prefix.size() == 2 ? " is free" : " is out of range";
    EXPECT_NE(s.ToString().find("of the shared prefix" + names), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(pool_->RefCount(a), 1);
  EXPECT_EQ(pool_->ReservedTokens(1), 0);
  EXPECT_EQ(pool_->free_pages(), 5);
  ASSERT_TRUE(pool_->Reserve(1, 48, std::vector<int32_t>{a}).ok());
  EXPECT_EQ(pool_->page_table_row(1)[0], a);
  EXPECT_EQ(pool_->RefCount(a), 2);
  EXPECT_EQ(pool_->free_pages(), 3);
}

TEST_F(HostKVPoolTest, PageIsFreedWithItsLastReference) {
  ASSERT_TRUE(pool_->Reserve(0, 32).ok());
  const int32_t first = pool_->page_table_row(0)[0];
  ASSERT_TRUE(pool_->Reserve(1, 32, pool_->page_table_row(0).first(1)).ok());
  pool_->AddRef(first);  // e.g. a retained conversation
  std::vector<int32_t> freed;
  pool_->Release(0, &freed);
  EXPECT_EQ(freed.size(), 1u);  // the private second page
  EXPECT_EQ(pool_->RefCount(first), 2);
  pool_->Release(1, &freed);
  EXPECT_EQ(freed.size(), 2u);
  EXPECT_EQ(pool_->shared_pages(), 0);
  EXPECT_EQ(pool_->extra_references(), 0);
  EXPECT_TRUE(pool_->Unref(first));
  EXPECT_EQ(pool_->free_pages(), 7);
}

TEST_F(HostKVPoolTest, ExhaustionWithASharedPrefixChangesNothing) {
  ASSERT_TRUE(pool_->Reserve(0, 48).ok());
  ASSERT_TRUE(pool_->Reserve(1, 48).ok());                                    // 1 of 7 pages left
  const Status s = pool_->Reserve(2, 64, pool_->page_table_row(0).first(1));  // needs 3 fresh
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(pool_->RefCount(pool_->page_table_row(0)[0]), 1);
  EXPECT_EQ(pool_->free_pages(), 1);
  EXPECT_EQ(pool_->ReservedTokens(2), 0);
  EXPECT_TRUE(pool_->Reserve(2, 32, pool_->page_table_row(0).first(1)).ok());  // 1 fresh
  EXPECT_EQ(pool_->free_pages(), 0);
  EXPECT_EQ(pool_->AllocatePage().status().code(), StatusCode::kResourceExhausted);
}

TEST_F(HostKVPoolTest, SwapPageMovesReferences) {
  ASSERT_TRUE(pool_->Reserve(0, 20).ok());
  ASSERT_TRUE(pool_->Reserve(1, 20, pool_->page_table_row(0).first(2)).ok());  // both shared
  const int32_t shared = pool_->page_table_row(1)[1];
  StatusOr<int32_t> copy = pool_->AllocatePage();
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(pool_->SwapPage(1, 1, *copy), shared);
  EXPECT_EQ(pool_->page_table_row(1)[1], *copy);
  EXPECT_FALSE(pool_->Unref(shared));  // owner 0 still holds it
  EXPECT_EQ(pool_->RefCount(shared), 1);
  EXPECT_EQ(pool_->shared_pages(), 1);
  pool_->Release(0);
  pool_->Release(1);
  EXPECT_EQ(pool_->free_pages(), 7);
}

TEST_F(HostKVPoolTest, FreedPagesAreReusedLowestFirst) {
  ASSERT_TRUE(pool_->Reserve(0, 48).ok());  // pages 0, 1, 2
  ASSERT_TRUE(pool_->Reserve(1, 16).ok());  // page 3
  pool_->Release(0);
  EXPECT_EQ(pool_->free_pages(), 6);
  ASSERT_TRUE(pool_->Reserve(2, 32).ok());
  EXPECT_EQ(pool_->page_table_row(2)[0], 0);
  EXPECT_EQ(pool_->page_table_row(2)[1], 1);
  pool_->Release(1);  // page 3 is the highest used: the tail is fresh again
  StatusOr<int32_t> page = pool_->AllocatePage();
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(*page, 2);
  EXPECT_EQ(pool_->free_pages(), 4);
  EXPECT_TRUE(pool_->Unref(*page));
  pool_->Release(2);
  EXPECT_EQ(pool_->free_pages(), 7);
  ASSERT_TRUE(pool_->Reserve(3, 64).ok());
  for (int32_t i = 0; i < 4; ++i) EXPECT_EQ(pool_->page_table_row(3)[i], i);
}

// A pool far larger than the machine (2^31 - 16 rows of 8 KiB, 16 TiB) must fail at once with
// ResourceExhausted, before any memory or per-page bookkeeping is allocated. Run in a child process
// under an 8 GiB address-space limit, so that bookkeeping for every page could not be built either.
TEST(HostKVPoolLimitsTest, UnallocatablePoolFailsFast) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on a 16 TiB allocation instead of returning null";
#endif
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    const rlimit limit{8ull << 30, 8ull << 30};
    std::string report;
    if (setrlimit(RLIMIT_AS, &limit) != 0) {
      report = "setrlimit failed";
    } else {
      std::shared_ptr<Backend> backend = CreateCpuBackend();
      const auto start = std::chrono::steady_clock::now();
      auto pool = HostKVPool::Create(KVGeometry::Uniform(1, 8192), (int64_t{1} << 31) - 16,
                                     /*page_tokens=*/16, /*max_owners=*/8,
                                     /*max_tokens_per_owner=*/1 << 20, backend.get());
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      report = std::to_string(ms) + " " + pool.status().ToString();
    }
    [[maybe_unused]] ssize_t n = write(fds[1], report.data(), report.size());
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buffer[512];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;) report.append(buffer, n);
  close(fds[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child died: " << report;
  const size_t space = report.find(' ');
  ASSERT_NE(space, std::string::npos) << report;
  const double ms = std::stod(report.substr(0, space));
  const std::string status = report.substr(space + 1);
  EXPECT_LT(ms, 1000.0) << status;
  EXPECT_TRUE(status.starts_with("ResourceExhausted")) << status;
  EXPECT_NE(status.find(std::to_string((int64_t{1} << 31) - 16) + " rows"), std::string::npos)
      << status;
  // The capacity check's refusal: both sizes and the option (capacity.h).
  EXPECT_NE(status.find("needs 17.59 TB of "), std::string::npos) << status;
  EXPECT_NE(status.find("lower host_capacity_tokens"), std::string::npos) << status;
}

// DeepSeek-V4's layer kinds: offloaded layers of 24- and 32-B strides, a resident and a
// window-only layer, whose entries the manager keeps in device memory alone.
KVGeometry MixedKinds() {
  KVGeometry g;
  g.layers = {LayerShape{24, 24}, LayerShape{16, 16}, LayerShape{24, 32}, LayerShape{40, 40}};
  g.layers[1].kind = LayerKind::kResident;
  g.layers[1].entry_tokens = 128;
  g.layers[3].kind = LayerKind::kWindowOnly;
  return g;
}

TEST(HostKVPoolLayerKindsTest, OnlyOffloadedLayersHaveRows) {
  auto backend = std::make_shared<testing::CountingBackend>();
  const KVGeometry mixed = MixedKinds();
  auto pool = HostKVPool::Create(mixed, /*capacity_tokens=*/100, /*page_tokens=*/16,
                                 /*max_owners=*/4, /*max_tokens_per_owner=*/64, backend.get());
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  // 112 rows of the offloaded layers' 24 + 32 B; the others have no region.
  EXPECT_EQ(mixed.token_stride_bytes(), 24 + 32);
  EXPECT_EQ((*pool)->bytes(), 112 * (24 + 32));
  EXPECT_EQ((*pool)->page_bytes(), 16 * (24 + 32));
  EXPECT_EQ(HostKVPool::PageBytes(mixed, 16), (*pool)->page_bytes());
  EXPECT_NE((*pool)->layer_base(0), nullptr);
  EXPECT_EQ((*pool)->layer_base(1), nullptr);
  EXPECT_NE((*pool)->layer_base(2), nullptr);
  EXPECT_EQ((*pool)->layer_base(3), nullptr);
  EXPECT_EQ((*pool)->row(2, 5), (*pool)->layer_base(2) + 5 * 32);
  // What the backend holds is what the pool says it holds, one allocation per offloaded layer.
  EXPECT_EQ(backend->live_host_bytes(), (*pool)->bytes());
  EXPECT_EQ(backend->live_host_allocations(), 2);

  // The same layers all offloaded: the resident and window-only layers' 16 + 40 B per row more.
  KVGeometry all = mixed;
  for (LayerShape& l : all.layers) l.kind = LayerKind::kOffloaded;
  auto every = HostKVPool::Create(all, 100, 16, 4, 64, backend.get());
  ASSERT_TRUE(every.ok()) << every.status().ToString();
  EXPECT_EQ((*every)->bytes() - (*pool)->bytes(), 112 * (16 + 40));
  pool->reset();
  every->reset();
  EXPECT_EQ(backend->live_host_bytes(), 0);
}

TEST(HostKVPoolLayerKindsTest, APoolWithoutOffloadedLayersOrSharedOverOthersIsRefused) {
  auto backend = CreateCpuBackend();
  KVGeometry none = MixedKinds();
  none.layers[0].kind = none.layers[2].kind = LayerKind::kResident;
  EXPECT_EQ(HostKVPool::Create(none, 100, 16, 4, 64, backend.get()).status().code(),
            StatusCode::kInvalidArgument);
  const Status shared = HostKVPool::CheckShareable(MixedKinds(), "CreateShared");
  EXPECT_EQ(shared.code(), StatusCode::kUnimplemented);
  EXPECT_NE(shared.message().find("geometry.layers[1].kind is kResident"), std::string::npos)
      << shared.message();
  EXPECT_TRUE(HostKVPool::CheckShareable(KVGeometry::Uniform(3, 24), "CreateShared").ok());
}

}  // namespace
}  // namespace sparsekv
