#include "manager/page_ledger.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace sparsekv {
namespace {

constexpr int32_t kPageTokens = 4;

class PageLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool =
        HostKVPool::Create(KVGeometry::Uniform(1, 8, 8), /*capacity_tokens=*/16, kPageTokens,
                           /*max_owners=*/4, /*max_tokens_per_owner=*/16, backend_.get());
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
    ledger_ = std::make_unique<PageLedger>(pool_.get(), kPageTokens);
  }
  // Reserves `pages` pages for a fresh owner and indexes them as a chain of ids first, first+1...
  std::vector<int32_t> IndexedPages(int32_t pages, int32_t first) {
    const int32_t owner = *pool_->AcquireOwner();
    EXPECT_TRUE(pool_->Reserve(owner, pages * kPageTokens).ok());
    std::vector<int32_t> table(pool_->page_table_row(owner).begin(),
                               pool_->page_table_row(owner).begin() + pages);
    std::vector<int32_t> ids(static_cast<size_t>(pages * kPageTokens));
    std::iota(ids.begin(), ids.end(), first);
    for (int32_t i = 0; i < pages; ++i) {
      EXPECT_TRUE(ledger_->Index(i == 0 ? -1 : table[i - 1], table[i],
                                 std::span(ids).subspan(i * kPageTokens, kPageTokens)));
    }
    owners_.push_back(owner);
    return table;
  }
  std::vector<int32_t> Ids(int32_t tokens, int32_t first) {
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    std::iota(ids.begin(), ids.end(), first);
    return ids;
  }

  std::shared_ptr<Backend> backend_ = CreateCpuBackend();
  std::unique_ptr<HostKVPool> pool_;
  std::unique_ptr<PageLedger> ledger_;
  std::vector<int32_t> owners_;
};

TEST_F(PageLedgerTest, RetainedPagesOutliveTheirOwnerAndStayIndexed) {
  const std::vector<int32_t> pages = IndexedPages(2, 100);
  ledger_->Retain(7, pages);
  ledger_->ReleaseOwnerPages(owners_[0]);
  EXPECT_TRUE(ledger_->IsRetained(7));
  ASSERT_NE(ledger_->RetainedPages(7), nullptr);
  EXPECT_EQ(*ledger_->RetainedPages(7), pages);
  EXPECT_EQ(pool_->free_pages(), 2);
  EXPECT_EQ(ledger_->Match(Ids(9, 100), 2), pages);
}

// Pages whose entries cover several tokens each (an entry every 4 tokens): a page is keyed by
// all the tokens its entries cover, and a match is a whole number of such pages.
TEST_F(PageLedgerTest, PagesOfSeveralTokensPerEntryAreKeyedByEveryTokenTheyCover) {
  constexpr int32_t kTokensPerPage = kPageTokens * 4;
  PageLedger ledger(pool_.get(), kTokensPerPage);
  const int32_t owner = *pool_->AcquireOwner();
  ASSERT_TRUE(pool_->Reserve(owner, 2 * kPageTokens).ok());
  const std::span<const int32_t> table = pool_->page_table_row(owner);
  const std::vector<int32_t> ids = Ids(2 * kTokensPerPage, 100);
  ASSERT_TRUE(ledger.Index(-1, table[0], std::span(ids).first(kTokensPerPage)));
  ASSERT_TRUE(ledger.Index(table[0], table[1], std::span(ids).subspan(kTokensPerPage)));
  EXPECT_EQ(ledger.Match(ids, 2), std::vector<int32_t>(table.begin(), table.begin() + 2));
  // One token short of the second page's tokens: only the first page matches.
  EXPECT_EQ(ledger.Match(std::span(ids).first(2 * kTokensPerPage - 1), 2),
            std::vector<int32_t>{table[0]});
  // A token changed inside the first page's tokens (past its first entries): no match.
  std::vector<int32_t> changed = ids;
  changed[kTokensPerPage - 1] = 7;
  EXPECT_TRUE(ledger.Match(changed, 2).empty());
  ledger.ReleaseOwnerPages(owner);
  pool_->ReleaseOwner(owner);
  EXPECT_EQ(ledger.index().size(), 0u);
}

TEST_F(PageLedgerTest, DropFreesAndUnindexesOnlyUnsharedPages) {
  const std::vector<int32_t> pages = IndexedPages(2, 100);
  ledger_->Retain(7, pages);
  EXPECT_EQ(ledger_->Drop(7), 0);  // the owner still holds both
  EXPECT_EQ(ledger_->Drop(7), -1);
  ledger_->Retain(8, pages);
  ledger_->ReleaseOwnerPages(owners_[0]);
  EXPECT_EQ(ledger_->Drop(8), 2);
  EXPECT_EQ(pool_->free_pages(), 4);
  EXPECT_EQ(ledger_->index().size(), 0u);
  EXPECT_TRUE(ledger_->Match(Ids(9, 100), 2).empty());
}

TEST_F(PageLedgerTest, UnrefUnindexesTheLastReference) {
  const std::vector<int32_t> pages = IndexedPages(1, 100);
  pool_->AddRef(pages[0]);
  ledger_->ReleaseOwnerPages(owners_[0]);
  EXPECT_TRUE(ledger_->index().Contains(pages[0]));
  ledger_->Unref(pages[0]);
  EXPECT_FALSE(ledger_->index().Contains(pages[0]));
  EXPECT_EQ(pool_->free_pages(), 4);
}

TEST_F(PageLedgerTest, MakeRoomEvictsLeastRecentlyUsedFirst) {
  ledger_->Retain(1, IndexedPages(1, 100));
  ledger_->Retain(2, IndexedPages(1, 200));
  ledger_->Retain(3, IndexedPages(1, 300));
  for (int32_t owner : owners_) ledger_->ReleaseOwnerPages(owner);
  ledger_->Touch(ledger_->Match(Ids(5, 100), 1));  // 1 is now the most recently used
  EXPECT_EQ(pool_->free_pages(), 1);
  PageLedger::Evictions evicted;
  ASSERT_TRUE(ledger_->MakeRoom(2, "Test", evicted).ok());
  EXPECT_EQ(evicted.conversations, 1);
  EXPECT_EQ(evicted.pages, 1);
  EXPECT_FALSE(ledger_->IsRetained(2));
  EXPECT_TRUE(ledger_->IsRetained(1));
  EXPECT_TRUE(ledger_->IsRetained(3));
  ASSERT_TRUE(ledger_->MakeRoom(3, "Test", evicted).ok());
  EXPECT_FALSE(ledger_->IsRetained(3));
  EXPECT_TRUE(ledger_->IsRetained(1));
  EXPECT_EQ(evicted.conversations, 2);
}

TEST_F(PageLedgerTest, MakeRoomThatCannotSucceedEvictsNothing) {
  ledger_->Retain(1, IndexedPages(1, 100));
  const std::vector<int32_t> held = IndexedPages(1, 200);  // its owner keeps it
  ledger_->Retain(2, held);
  ledger_->ReleaseOwnerPages(owners_[0]);
  PageLedger::Evictions evicted;
  const Status s = ledger_->MakeRoom(4, "Test", evicted);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("Test: need 4 host pages"), std::string::npos) << s.ToString();
  EXPECT_EQ(evicted.conversations, 0);
  EXPECT_EQ(ledger_->retained_conversations(), 2);
  EXPECT_EQ(ledger_->DropAll(), 2);
  EXPECT_EQ(ledger_->retained_conversations(), 0);
}

TEST_F(PageLedgerTest, CopyOnWriteNamesOnlyAStillSharedPage) {
  const std::vector<int32_t> pages = IndexedPages(1, 100);
  const int32_t owner = owners_[0];
  pool_->AddRef(pages[0]);  // another holder
  EXPECT_EQ(ledger_->SharedPageToCopy(owner, 0), pages[0]);
  EXPECT_EQ(pool_->RefCount(pages[0]), 2);  // asking changes nothing
  const int32_t spare = *pool_->AllocatePage();
  EXPECT_EQ(pool_->SwapPage(owner, 0, spare), pages[0]);
  ledger_->Unref(pages[0]);
  EXPECT_EQ(pool_->page_table_row(owner)[0], spare);
  EXPECT_EQ(pool_->RefCount(pages[0]), 1);
  EXPECT_EQ(pool_->RefCount(spare), 1);
  // Sole holder: nothing to copy.
  EXPECT_EQ(ledger_->SharedPageToCopy(owner, 0), -1);
  EXPECT_EQ(pool_->page_table_row(owner)[0], spare);
}

}  // namespace
}  // namespace sparsekv
