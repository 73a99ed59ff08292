#include "manager/prefix_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace sparsekv {
namespace {

using Ids = std::vector<int32_t>;

// Every key collides: only verification tells chains apart.
uint64_t ConstantHash(uint64_t, std::span<const int32_t>) { return 42; }

TEST(PrefixIndexTest, MatchesTheLongestChainOfFullPages) {
  PrefixIndex index(/*page_tokens=*/2);
  const Ids ids = {1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(index.Insert(-1, 10, Ids{1, 2}));
  EXPECT_TRUE(index.Insert(10, 11, Ids{3, 4}));
  EXPECT_TRUE(index.Insert(11, 12, Ids{5, 6}));
  EXPECT_EQ(index.Match(ids, 10), (Ids{10, 11, 12}));
  EXPECT_EQ(index.Match(ids, 2), (Ids{10, 11}));
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 9}, 10), (Ids{10}));
  EXPECT_EQ(index.Match(Ids{3, 4}, 10), Ids{});  // page 1's ids, but not after page 0
  EXPECT_EQ(index.Match(Ids{1}, 10), Ids{});     // no full page
}

TEST(PrefixIndexTest, ErasedPageIsAMissAndEndsTheChain) {
  PrefixIndex index(2);
  ASSERT_TRUE(index.Insert(-1, 0, Ids{1, 2}));
  ASSERT_TRUE(index.Insert(0, 1, Ids{3, 4}));
  index.Erase(1);
  EXPECT_FALSE(index.Contains(1));
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 4}, 4), (Ids{0}));
  index.Erase(0);
  index.Erase(0);  // no-op
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 4}, 4), Ids{});
  EXPECT_EQ(index.size(), 0u);
}

TEST(PrefixIndexTest, InsertRequiresAnIndexedParentAndRejectsCopies) {
  PrefixIndex index(2);
  EXPECT_FALSE(index.Insert(7, 8, Ids{1, 2}));  // parent 7 not indexed
  ASSERT_TRUE(index.Insert(-1, 0, Ids{1, 2}));
  EXPECT_FALSE(index.Insert(-1, 0, Ids{5, 6}));  // page 0 already indexed
  EXPECT_FALSE(index.Insert(-1, 3, Ids{1, 2}));  // an identical copy of page 0
  EXPECT_TRUE(index.Insert(0, 4, Ids{1, 2}));    // same ids, other parent: a different prefix
  EXPECT_EQ(index.Match(Ids{1, 2, 1, 2}, 4), (Ids{0, 4}));
}

TEST(PrefixIndexTest, CollidingKeysAreToldApartByVerification) {
  PrefixIndex index(2, &ConstantHash);
  // Two sequences sharing nothing, and a branch of the first one: all under the same key.
  ASSERT_TRUE(index.Insert(-1, 0, Ids{1, 2}));
  ASSERT_TRUE(index.Insert(0, 1, Ids{3, 4}));
  ASSERT_TRUE(index.Insert(0, 2, Ids{3, 5}));
  ASSERT_TRUE(index.Insert(-1, 3, Ids{3, 4}));
  ASSERT_TRUE(index.Insert(3, 5, Ids{1, 2}));
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 4}, 4), (Ids{0, 1}));
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 5}, 4), (Ids{0, 2}));
  EXPECT_EQ(index.Match(Ids{3, 4, 1, 2}, 4), (Ids{3, 5}));
  EXPECT_EQ(index.Match(Ids{3, 4, 3, 4}, 4), (Ids{3}));  // page 1 exists only after page 0
  EXPECT_EQ(index.Match(Ids{9, 9}, 4), Ids{});
  index.Erase(1);
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 4}, 4), (Ids{0}));
  EXPECT_EQ(index.Match(Ids{1, 2, 3, 5}, 4), (Ids{0, 2}));
}

TEST(PrefixIndexTest, DefaultHashDependsOnParentAndOrder) {
  const Ids a = {1, 2}, b = {2, 1};
  EXPECT_NE(PrefixIndex::DefaultHash(0, a), PrefixIndex::DefaultHash(0, b));
  EXPECT_NE(PrefixIndex::DefaultHash(0, a), PrefixIndex::DefaultHash(1, a));
}

}  // namespace
}  // namespace sparsekv
