// StepOrder on its own: every order of a step's calls it refuses, with its code and message, and
// the orders it accepts.
#include "manager/step_order.h"

#include <gtest/gtest.h>

#include <string>

namespace sparsekv {
namespace {

void ExpectRefused(const Status& s, StatusCode code, const std::string& message) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.message(), message);
}

// Six layers in index groups of two: groups 0 (layers 0, 1), 1 (2, 3), 2 (4, 5); groups 0 and 2
// share a miss list. Four batch rows, no copy chunks.
StepOrder::Shape SixLayers() { return {.layers = 6, .layers_per_index = 2, .max_batch = 4}; }

// Appends, resolves and copies index group `group` of a two-layer-group order.
void RunGroup(StepOrder& order, int32_t group) {
  for (int32_t l = 2 * group; l < 2 * group + 2; ++l) {
    ASSERT_TRUE(order.CheckAppend(l).ok());
    order.MarkAppended(l);
  }
  ASSERT_TRUE(order.CheckResolveLayer(2 * group).ok());
  ASSERT_TRUE(order.CheckResolveOrder(2 * group).ok());
  order.MarkResolved(2 * group);
  for (int32_t l = 2 * group; l < 2 * group + 2; ++l) {
    ASSERT_TRUE(order.CheckCopyMisses(l).ok());
    EXPECT_TRUE(order.MarkChunkCopied(l, 0));
  }
}

TEST(StepOrderTest, PlanningRefusesAnOpenStep) {
  StepOrder order(SixLayers());
  EXPECT_FALSE(order.open());
  EXPECT_TRUE(order.CheckPlan().ok());
  EXPECT_TRUE(order.CheckInstallExtension().ok());
  order.Open(1);
  EXPECT_TRUE(order.open());
  ExpectRefused(order.CheckPlan(), StatusCode::kFailedPrecondition,
                "PlanStep: the previous step was not finished");
  ExpectRefused(order.CheckInstallExtension(), StatusCode::kFailedPrecondition,
                "InstallExtension: a step is open");
  order.Close();
  EXPECT_TRUE(order.CheckPlan().ok());
}

TEST(StepOrderTest, RunPhaseCallsNeedAStepAndALayerInRange) {
  StepOrder order(SixLayers());
  ExpectRefused(order.CheckLayer(0, "ResolveLayer"), StatusCode::kFailedPrecondition,
                "ResolveLayer: no step is planned");
  order.Open(1);
  EXPECT_TRUE(order.CheckLayer(0, "ResolveLayer").ok());
  EXPECT_TRUE(order.CheckLayer(5, "ResolveLayer").ok());
  ExpectRefused(order.CheckLayer(6, "CopyMisses"), StatusCode::kInvalidArgument,
                "CopyMisses: layer 6 out of range");
  ExpectRefused(order.CheckLayer(-1, "AppendToken"), StatusCode::kInvalidArgument,
                "AppendToken: layer -1 out of range");
}

TEST(StepOrderTest, EachLayerAppendsOnce) {
  StepOrder order(SixLayers());
  order.Open(1);
  ASSERT_TRUE(order.CheckAppend(3).ok());
  order.MarkAppended(3);
  EXPECT_TRUE(order.appended(3));
  ExpectRefused(order.CheckAppend(3), StatusCode::kFailedPrecondition,
                "AppendToken: layer 3 was already appended in this step");
  EXPECT_TRUE(order.CheckAppend(2).ok());
}

TEST(StepOrderTest, ResolveRefusesASharedLayerAndAMissingAppend) {
  StepOrder order(SixLayers());
  order.Open(1);
  ExpectRefused(order.CheckResolveLayer(1), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 1 shares the top-k of layer 0 (layers_per_index); that layer "
                "resolves for it");
  ExpectRefused(order.CheckResolveLayer(0), StatusCode::kFailedPrecondition,
                "ResolveLayer: AppendToken(0) must come first in the step");
  order.MarkAppended(0);
  EXPECT_TRUE(order.CheckResolveLayer(0).ok());
}

TEST(StepOrderTest, IndexGroupsResolveOnceAndInOrder) {
  StepOrder order(SixLayers());
  order.Open(1);
  ExpectRefused(order.CheckResolveOrder(2), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 2 (index group 1) before index group 0: index groups "
                "resolve in order within a step");
  ASSERT_TRUE(order.CheckResolveOrder(0).ok());
  order.MarkResolved(0);
  EXPECT_EQ(order.groups_resolved(), 1);
  ExpectRefused(order.CheckResolveOrder(0), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 0 (index group 0) was already resolved in this step");
  EXPECT_TRUE(order.CheckResolveOrder(2).ok());
}

TEST(StepOrderTest, AGroupReusingAMissListWaitsForTheCopiesOfTheGroupBefore) {
  StepOrder order(SixLayers());
  order.Open(1);
  for (int32_t l = 0; l < 6; ++l) order.MarkAppended(l);
  order.MarkResolved(0);
  order.MarkResolved(2);
  ExpectRefused(order.CheckResolveOrder(4), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 4 (index group 2) reuses the miss list of index group 0, "
                "whose layer 0 has no CopyMisses in this step yet");
  EXPECT_TRUE(order.MarkChunkCopied(0, 0));
  ExpectRefused(order.CheckResolveOrder(4), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 4 (index group 2) reuses the miss list of index group 0, "
                "whose layer 1 has no CopyMisses in this step yet");
  EXPECT_TRUE(order.MarkChunkCopied(1, 0));
  EXPECT_TRUE(order.CheckResolveOrder(4).ok());
}

TEST(StepOrderTest, CopyMissesFollowsTheResolveAndRunsOnce) {
  StepOrder order(SixLayers());
  order.Open(1);
  ExpectRefused(order.CheckCopyMisses(1), StatusCode::kFailedPrecondition,
                "CopyMisses: the top-k of layer 1 (index group 0) was not resolved in this step");
  order.MarkResolved(0);
  ASSERT_TRUE(order.CheckCopyMisses(1).ok());
  EXPECT_TRUE(order.MarkChunkCopied(1, 0));
  EXPECT_TRUE(order.copied(1));
  ExpectRefused(order.CheckCopyMisses(1), StatusCode::kFailedPrecondition,
                "CopyMisses: layer 1 (index group 0) was already copied in this step");
}

TEST(StepOrderTest, CopyMissesRefusesALayerWithACopiedChunk) {
  StepOrder order({.layers = 2, .layers_per_index = 1, .max_batch = 4, .copy_chunk_rows = 2});
  order.Open(4);
  order.MarkResolved(0);
  EXPECT_FALSE(order.MarkChunkCopied(0, 1));  // chunk 0 holds rows of the batch too
  EXPECT_FALSE(order.copied(0));
  ExpectRefused(order.CheckCopyMisses(0), StatusCode::kFailedPrecondition,
                "CopyMisses: chunk 1 of layer 0 (index group 0) was already copied in this step");
}

TEST(StepOrderTest, CopyMissChunkRefusals) {
  StepOrder unchunked(SixLayers());
  unchunked.Open(1);
  unchunked.MarkResolved(0);
  ExpectRefused(unchunked.CheckCopyMissChunk(0, 0), StatusCode::kFailedPrecondition,
                "CopyMissChunk: copy_chunk_rows is 0 (one miss list)");

  // max_batch 5 in chunks of 2 rows: chunks 0, 1, 2.
  StepOrder order({.layers = 2, .layers_per_index = 1, .max_batch = 5, .copy_chunk_rows = 2});
  EXPECT_EQ(order.chunks(), 3);
  order.Open(3);
  ExpectRefused(order.CheckCopyMissChunk(0, 3), StatusCode::kInvalidArgument,
                "CopyMissChunk: chunk 3 outside [0, 3)");
  ExpectRefused(order.CheckCopyMissChunk(0, -1), StatusCode::kInvalidArgument,
                "CopyMissChunk: chunk -1 outside [0, 3)");
  ExpectRefused(order.CheckCopyMissChunk(1, 0), StatusCode::kFailedPrecondition,
                "CopyMissChunk: the top-k of layer 1 (index group 1) was not resolved in this "
                "step");
  order.MarkResolved(0);
  ASSERT_TRUE(order.CheckCopyMissChunk(0, 1).ok());
  EXPECT_FALSE(order.MarkChunkCopied(0, 1));
  ExpectRefused(order.CheckCopyMissChunk(0, 1), StatusCode::kFailedPrecondition,
                "CopyMissChunk: chunk 1 of layer 0 (index group 0) was already copied in this "
                "step");
}

TEST(StepOrderTest, ALayerIsCopiedOnceEveryChunkOfTheBatchIs) {
  // A batch of three rows in chunks of two rows: chunks 0 and 1 hold it, chunk 2 is past it.
  StepOrder order({.layers = 1, .layers_per_index = 1, .max_batch = 6, .copy_chunk_rows = 2});
  order.Open(3);
  order.MarkResolved(0);
  EXPECT_FALSE(order.MarkChunkCopied(0, 1));
  EXPECT_FALSE(order.copied(0));
  EXPECT_TRUE(order.MarkChunkCopied(0, 0));  // the layer becomes copied here, once
  EXPECT_TRUE(order.copied(0));
  // The chunk past the batch is still accepted, once, and copies nothing new.
  ASSERT_TRUE(order.CheckCopyMissChunk(0, 2).ok());
  EXPECT_FALSE(order.MarkChunkCopied(0, 2));
  EXPECT_TRUE(order.chunk_copied(0, 2));
  EXPECT_FALSE(order.CheckCopyMissChunk(0, 2).ok());
}

// A layer marked copied whole with nothing enqueued (SkipMissCopy) counts as copied for the
// group after next and for FinishStep, and takes no copy of any chunk afterwards.
TEST(StepOrderTest, ALayerCopiedWholeTakesNoFurtherCopy) {
  StepOrder order({.layers = 3, .layers_per_index = 1, .max_batch = 6, .copy_chunk_rows = 2});
  order.Open(3);
  for (int32_t l = 0; l < 3; ++l) order.MarkAppended(l);
  order.MarkResolved(0);
  order.MarkResolved(1);
  ExpectRefused(order.CheckResolveOrder(2), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 2 (index group 2) reuses the miss list of index group 0, "
                "whose layer 0 has no CopyMisses in this step yet");
  order.MarkCopiedWhole(0);
  EXPECT_TRUE(order.copied(0));
  EXPECT_TRUE(order.CheckResolveOrder(2).ok());
  ExpectRefused(order.CheckCopyMisses(0), StatusCode::kFailedPrecondition,
                "CopyMisses: layer 0 (index group 0) was already copied in this step");
  for (int32_t c = 0; c < order.chunks(); ++c) {
    EXPECT_EQ(order.CheckCopyMissChunk(0, c).code(), StatusCode::kFailedPrecondition) << c;
  }
  order.MarkResolved(2);
  order.MarkCopiedWhole(1);
  order.MarkCopiedWhole(2);
  EXPECT_TRUE(order.CheckFinish().ok());
}

TEST(StepOrderTest, AssembleFollowsTheResolveAndTheAppend) {
  StepOrder order(SixLayers());
  order.Open(1);
  ExpectRefused(order.CheckAssemble(1), StatusCode::kFailedPrecondition,
                "AssembleLayer: the top-k of layer 1 (index group 0) was not resolved in this "
                "step (its slots would be stale)");
  order.MarkAppended(0);
  order.MarkResolved(0);
  ExpectRefused(order.CheckAssemble(1), StatusCode::kFailedPrecondition,
                "AssembleLayer: AppendToken(1) must come first (the newest token's row is not "
                "stored yet)");
  EXPECT_TRUE(order.CheckAssemble(0).ok());
}

TEST(StepOrderTest, PrefetchRefusals) {
  StepOrder order(SixLayers());
  order.Open(1);
  ExpectRefused(order.CheckPrefetchLayer(3), StatusCode::kFailedPrecondition,
                "PrefetchLayer: layer 3 is not the first of its index group");
  EXPECT_TRUE(order.CheckPrefetchLayer(2).ok());
  // Before its group resolves, a prefetch is free; after, it waits for the group's copies.
  EXPECT_TRUE(order.CheckResolvePrefetch(0).ok());
  order.MarkResolved(0);
  ExpectRefused(order.CheckResolvePrefetch(0), StatusCode::kFailedPrecondition,
                "PrefetchLayer: index group 0 was resolved in this step and its layer 0 has no "
                "CopyMisses yet; a prefetch after the resolve must follow the group's copies "
                "(its victims may be rows the step reads)");
  ExpectRefused(order.CheckCopyPrefetch(2), StatusCode::kFailedPrecondition,
                "CopyPrefetch: no prefetch of layer 2 (index group 1) is pending");
  ASSERT_TRUE(order.CheckResolvePrefetch(2).ok());
  order.MarkPrefetchResolved(2);
  EXPECT_EQ(order.prefetch_pending(), 1);
  ExpectRefused(order.CheckResolvePrefetch(4), StatusCode::kFailedPrecondition,
                "ResolvePrefetch: the prefetch of index group 1 has no CopyPrefetch yet (one "
                "prefetch list)");
  ExpectRefused(order.CheckCopyPrefetch(4), StatusCode::kFailedPrecondition,
                "CopyPrefetch: no prefetch of layer 4 (index group 2) is pending");
  EXPECT_TRUE(order.CheckCopyPrefetch(3).ok());  // any layer of the group
  order.MarkPrefetchCopied();
  EXPECT_EQ(order.prefetch_pending(), -1);
  EXPECT_TRUE(order.CheckResolvePrefetch(4).ok());
}

TEST(StepOrderTest, FinishStepRefusesAnUnfinishedRunPhase) {
  StepOrder order(SixLayers());
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: no step is planned");
  order.Open(1);
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: layer 0 has no AppendToken in this step");
  RunGroup(order, 0);
  for (int32_t l = 2; l < 6; ++l) order.MarkAppended(l);
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: index group 1 was not resolved in this step");
  order.MarkResolved(2);
  order.MarkResolved(4);
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: layer 2 (index group 1) has no CopyMisses in this step");
  for (int32_t l = 2; l < 6; ++l) EXPECT_TRUE(order.MarkChunkCopied(l, 0));
  order.MarkPrefetchResolved(4);
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: the prefetch of index group 2 has no CopyPrefetch");
  order.MarkPrefetchCopied();
  EXPECT_TRUE(order.CheckFinish().ok());
}

TEST(StepOrderTest, FinishReplayedStepRefusals) {
  StepOrder order(SixLayers());
  ExpectRefused(order.CheckFinishReplayed(true), StatusCode::kFailedPrecondition,
                "FinishReplayedStep: no step is planned");
  order.Open(1);
  ExpectRefused(order.CheckFinishReplayed(false), StatusCode::kFailedPrecondition,
                "FinishReplayedStep: no complete run phase was ever recorded");
  EXPECT_TRUE(order.CheckFinishReplayed(true).ok());
  order.MarkAppended(5);
  ExpectRefused(order.CheckFinishReplayed(true), StatusCode::kFailedPrecondition,
                "FinishReplayedStep: AppendToken ran on the host in this step; a step whose run "
                "phase the host called ends with FinishStep");
}

TEST(StepOrderTest, FinishReplayedStepIsRefusedWithAPrefetchPending) {
  StepOrder order(SixLayers());
  order.Open(1);
  order.MarkPrefetchResolved(2);
  ExpectRefused(order.CheckFinishReplayed(true), StatusCode::kFailedPrecondition,
                "FinishReplayedStep: the prefetch of index group 1 has no CopyPrefetch "
                "(ResolvePrefetch ran on the host in this step)");
  EXPECT_EQ(order.prefetch_pending(), 1);  // a refusal changes nothing
  order.MarkPrefetchCopied();
  EXPECT_TRUE(order.CheckFinishReplayed(true).ok());
}

TEST(StepOrderTest, OpeningAStepForgetsTheLastOne) {
  StepOrder order(SixLayers());
  order.Open(1);
  for (int32_t g = 0; g < 3; ++g) RunGroup(order, g);
  ASSERT_TRUE(order.CheckFinish().ok());
  order.Close();
  order.Open(1);
  EXPECT_FALSE(order.appended(0));
  EXPECT_FALSE(order.copied(5));
  EXPECT_EQ(order.groups_resolved(), 0);
  EXPECT_TRUE(order.CheckAppend(0).ok());
}

// Explicit groups (GLM-5.3's {0}, {1}, {2-5}): only a group's first layer resolves, the error
// names index_group, and group 2 waits for group 0's copies (the list they share).
TEST(StepOrderGroupsTest, ExplicitGroupsResolveOnTheirFirstLayer) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(6, 8);
  for (int32_t l = 0; l < 6; ++l) o.geometry.layers[l].index_group = l <= 2 ? l : 2;
  StepOrder order({.layers = 6, .max_batch = 4}, IndexGroups(o));
  EXPECT_EQ(order.groups(), 3);
  order.Open(2);
  for (int32_t l = 0; l < 6; ++l) order.MarkAppended(l);
  ExpectRefused(order.CheckResolveLayer(4), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 4 shares the top-k of layer 2 (index_group); that layer "
                "resolves for it");
  ASSERT_TRUE(order.CheckResolveOrder(0).ok());
  order.MarkResolved(0);
  ASSERT_TRUE(order.CheckResolveOrder(1).ok());
  order.MarkResolved(1);
  ExpectRefused(order.CheckResolveOrder(2), StatusCode::kFailedPrecondition,
                "ResolveLayer: layer 2 (index group 2) reuses the miss list of index group 0, "
                "whose layer 0 has no CopyMisses in this step yet");
  EXPECT_TRUE(order.MarkChunkCopied(0, 0));
  ASSERT_TRUE(order.CheckResolveLayer(2).ok());
  ASSERT_TRUE(order.CheckResolveOrder(2).ok());
  order.MarkResolved(2);
  EXPECT_TRUE(order.CheckCopyMisses(5).ok());
  ExpectRefused(order.CheckPrefetchLayer(3), StatusCode::kFailedPrecondition,
                "PrefetchLayer: layer 3 is not the first of its index group");
}

// Dense layers (resident, window-only) are appended only: the offloaded layers' groups resolve
// in order around them, and the step finishes once every layer is appended.
TEST(StepOrderTest, DenseLayersAreAppendedOnly) {
  // Layers 0 and 2 offloaded, 1, 3 and 4 dense: five groups of one layer.
  StepOrder order({.layers = 5,
                   .layers_per_index = 1,
                   .max_batch = 4,
                   .dense = {false, true, false, true, true}});
  order.Open(2);
  EXPECT_EQ(order.groups_resolved(), 0);
  for (int32_t l = 0; l < 5; ++l) {
    ASSERT_TRUE(order.CheckAppend(l).ok());
    order.MarkAppended(l);
  }
  EXPECT_TRUE(order.copied(1));
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: index group 0 was not resolved in this step");
  ASSERT_TRUE(order.CheckResolveOrder(0).ok());
  order.MarkResolved(0);
  EXPECT_EQ(order.groups_resolved(), 2);  // group 1 is dense
  ASSERT_TRUE(order.CheckCopyMisses(0).ok());
  order.MarkChunkCopied(0, 0);
  ASSERT_TRUE(order.CheckResolveOrder(2).ok());
  order.MarkResolved(2);
  EXPECT_EQ(order.groups_resolved(), 5);
  ExpectRefused(order.CheckFinish(), StatusCode::kFailedPrecondition,
                "FinishStep: layer 2 (index group 2) has no CopyMisses in this step");
  order.MarkChunkCopied(2, 0);
  EXPECT_TRUE(order.CheckFinish().ok());
  // A step whose first groups are dense starts past them.
  StepOrder leading({.layers = 2, .layers_per_index = 1, .max_batch = 1, .dense = {true, false}});
  leading.Open(1);
  EXPECT_EQ(leading.groups_resolved(), 1);
}

}  // namespace
}  // namespace sparsekv
