#include "manager/step_order.h"

#include <algorithm>

namespace sparsekv {

StepOrder::StepOrder(const Shape& shape)
    : StepOrder(shape, IndexGroups::Uniform(shape.layers, shape.layers_per_index, 1)) {}

StepOrder::StepOrder(const Shape& shape, const IndexGroups& groups)
    : shape_(shape),
      groups_(groups),
      chunks_(shape.copy_chunk_rows > 0
                  ? (shape.max_batch + shape.copy_chunk_rows - 1) / shape.copy_chunk_rows
                  : 1),
      appended_(shape.layers),
      copied_(shape.layers),
      chunk_copied_(shape.layers, std::vector<bool>(chunks_)) {}

Status StepOrder::CheckPlan() const {
  if (open_) return FailedPrecondition("PlanStep: the previous step was not finished");
  return Status::Ok();
}

Status StepOrder::CheckInstallExtension() const {
  if (open_) return FailedPrecondition("InstallExtension: a step is open");
  return Status::Ok();
}

void StepOrder::Open(int32_t batch_size) {
  open_ = true;
  const int32_t rows = shape_.copy_chunk_rows > 0 ? shape_.copy_chunk_rows : shape_.max_batch;
  batch_chunks_ = (batch_size + rows - 1) / rows;
  std::fill(appended_.begin(), appended_.end(), false);
  std::fill(copied_.begin(), copied_.end(), false);
  for (std::vector<bool>& chunks : chunk_copied_) std::fill(chunks.begin(), chunks.end(), false);
  for (int32_t l = 0; l < shape_.layers; ++l) {
    if (Dense(l)) {
      copied_[l] = true;
      std::fill(chunk_copied_[l].begin(), chunk_copied_[l].end(), true);
    }
  }
  groups_resolved_ = 0;
  SkipDenseGroups();
}

void StepOrder::SkipDenseGroups() {
  while (groups_resolved_ < groups() && Dense(groups_.First(groups_resolved_))) ++groups_resolved_;
}

Status StepOrder::RefuseLayer(int32_t layer, const char* op) const {
  if (!open_) return FailedPrecondition(std::string(op) + ": no step is planned");
  return InvalidArgument(std::string(op) + ": layer " + std::to_string(layer) + " out of range");
}

Status StepOrder::RefuseAppend(int32_t layer) const {
  return FailedPrecondition("AppendToken: layer " + std::to_string(layer) +
                            " was already appended in this step");
}

int32_t StepOrder::FirstUncopied(int32_t group) const {
  for (int32_t l = groups_.First(group); l < groups_.End(group); ++l) {
    if (!copied_[l]) return l;
  }
  return -1;
}

std::string StepOrder::DescribeLayer(int32_t layer) const {
  return "layer " + std::to_string(layer) + " (index group " + std::to_string(Group(layer)) + ")";
}

Status StepOrder::CheckResolveLayer(int32_t layer) const {
  if (!groups_.Leads(layer)) {
    return FailedPrecondition("ResolveLayer: layer " + std::to_string(layer) +
                              " shares the top-k of layer " +
                              std::to_string(groups_.Leader(layer)) + " (" + groups_.option() +
                              "); that layer resolves for it");
  }
  if (!appended_[layer]) {
    return FailedPrecondition("ResolveLayer: AppendToken(" + std::to_string(layer) +
                              ") must come first in the step");
  }
  return Status::Ok();
}

Status StepOrder::CheckResolveOrder(int32_t layer) const {
  const int32_t group = Group(layer);
  if (group < groups_resolved_) {
    return FailedPrecondition("ResolveLayer: " + DescribeLayer(layer) +
                              " was already resolved in this step");
  }
  if (group > groups_resolved_) {
    return FailedPrecondition("ResolveLayer: " + DescribeLayer(layer) + " before index group " +
                              std::to_string(groups_resolved_) +
                              ": index groups resolve in order within a step");
  }
  if (const int32_t uncopied = group >= 2 ? FirstUncopied(group - 2) : -1; uncopied >= 0) {
    return FailedPrecondition("ResolveLayer: " + DescribeLayer(layer) +
                              " reuses the miss list of index group " + std::to_string(group - 2) +
                              ", whose layer " + std::to_string(uncopied) +
                              " has no CopyMisses in this step yet");
  }
  return Status::Ok();
}

Status StepOrder::CheckCopyMisses(int32_t layer) const {
  if (Group(layer) >= groups_resolved_) {
    return FailedPrecondition("CopyMisses: the top-k of " + DescribeLayer(layer) +
                              " was not resolved in this step");
  }
  // Group g + 2 resolves into this layer's miss list only after this copy, so a second copy is
  // the only way to read a list that another group's resolve has overwritten.
  if (copied_[layer]) {
    return FailedPrecondition("CopyMisses: " + DescribeLayer(layer) +
                              " was already copied in this step");
  }
  for (int32_t c = 0; c < chunks_; ++c) {
    if (chunk_copied_[layer][c]) {
      return FailedPrecondition("CopyMisses: chunk " + std::to_string(c) + " of " +
                                DescribeLayer(layer) + " was already copied in this step");
    }
  }
  return Status::Ok();
}

Status StepOrder::CheckCopyMissChunk(int32_t layer, int32_t chunk) const {
  if (shape_.copy_chunk_rows == 0) {
    return FailedPrecondition("CopyMissChunk: copy_chunk_rows is 0 (one miss list)");
  }
  if (chunk < 0 || chunk >= chunks_) {
    return InvalidArgument("CopyMissChunk: chunk " + std::to_string(chunk) + " outside [0, " +
                           std::to_string(chunks_) + ")");
  }
  if (Group(layer) >= groups_resolved_) {
    return FailedPrecondition("CopyMissChunk: the top-k of " + DescribeLayer(layer) +
                              " was not resolved in this step");
  }
  // A layer that counts as copied may still take the chunks past the batch, once each (a graph
  // captured at a smaller batch copies them, and they hold nothing): their counts are this
  // group's own, zero past the batch, even once group g + 2 resolves into the list.
  if (chunk_copied_[layer][chunk]) {
    return FailedPrecondition("CopyMissChunk: chunk " + std::to_string(chunk) + " of " +
                              DescribeLayer(layer) + " was already copied in this step");
  }
  return Status::Ok();
}

bool StepOrder::MarkChunkCopied(int32_t layer, int32_t chunk) {
  chunk_copied_[layer][chunk] = true;
  for (int32_t i = 0; i < batch_chunks_; ++i) {
    if (!chunk_copied_[layer][i]) return false;
  }
  if (copied_[layer]) return false;
  copied_[layer] = true;
  return true;
}

Status StepOrder::CheckAssemble(int32_t layer) const {
  if (Group(layer) >= groups_resolved_) {
    return FailedPrecondition("AssembleLayer: the top-k of " + DescribeLayer(layer) +
                              " was not resolved in this step (its slots would be stale)");
  }
  if (!appended_[layer]) {
    return FailedPrecondition("AssembleLayer: AppendToken(" + std::to_string(layer) +
                              ") must come first (the newest token's row is not stored yet)");
  }
  return Status::Ok();
}

Status StepOrder::CheckPrefetchLayer(int32_t layer) const {
  if (!groups_.Leads(layer)) {
    return FailedPrecondition("PrefetchLayer: layer " + std::to_string(layer) +
                              " is not the first of its index group");
  }
  return Status::Ok();
}

Status StepOrder::CheckResolvePrefetch(int32_t layer) const {
  const int32_t group = Group(layer);
  if (const int32_t uncopied = group < groups_resolved_ ? FirstUncopied(group) : -1;
      uncopied >= 0) {
    return FailedPrecondition("PrefetchLayer: index group " + std::to_string(group) +
                              " was resolved in this step and its layer " +
                              std::to_string(uncopied) +
                              " has no CopyMisses yet; a prefetch after the resolve must follow "
                              "the group's copies (its victims may be rows the step reads)");
  }
  if (prefetch_pending_ >= 0) {
    return FailedPrecondition("ResolvePrefetch: the prefetch of index group " +
                              std::to_string(prefetch_pending_) +
                              " has no CopyPrefetch yet (one prefetch list)");
  }
  return Status::Ok();
}

Status StepOrder::CheckCopyPrefetch(int32_t layer) const {
  if (prefetch_pending_ != Group(layer)) {
    return FailedPrecondition("CopyPrefetch: no prefetch of " + DescribeLayer(layer) +
                              " is pending");
  }
  return Status::Ok();
}

Status StepOrder::CheckFinish() const {
  if (!open_) return FailedPrecondition("FinishStep: no step is planned");
  for (int32_t l = 0; l < shape_.layers; ++l) {
    if (!appended_[l]) {
      return FailedPrecondition("FinishStep: layer " + std::to_string(l) +
                                " has no AppendToken in this step");
    }
  }
  if (groups_resolved_ < groups()) {
    return FailedPrecondition("FinishStep: index group " + std::to_string(groups_resolved_) +
                              " was not resolved in this step");
  }
  for (int32_t l = 0; l < shape_.layers; ++l) {
    if (!copied_[l]) {
      return FailedPrecondition("FinishStep: " + DescribeLayer(l) +
                                " has no CopyMisses in this step");
    }
  }
  if (prefetch_pending_ >= 0) {
    return FailedPrecondition("FinishStep: the prefetch of index group " +
                              std::to_string(prefetch_pending_) + " has no CopyPrefetch");
  }
  return Status::Ok();
}

Status StepOrder::CheckFinishReplayed(bool run_phase_recorded) const {
  if (!open_) return FailedPrecondition("FinishReplayedStep: no step is planned");
  if (!run_phase_recorded) {
    return FailedPrecondition("FinishReplayedStep: no complete run phase was ever recorded");
  }
  if (std::find(appended_.begin(), appended_.end(), true) != appended_.end()) {
    return FailedPrecondition(
        "FinishReplayedStep: AppendToken ran on the host in this step; a step whose run phase "
        "the host called ends with FinishStep");
  }
  // The replayed graph neither copies this prefetch nor ends it: the step would close with a
  // resolved prefetch whose rows never arrive, and the next CopyPrefetch would copy its list.
  if (prefetch_pending_ >= 0) {
    return FailedPrecondition("FinishReplayedStep: the prefetch of index group " +
                              std::to_string(prefetch_pending_) +
                              " has no CopyPrefetch (ResolvePrefetch ran on the host in this "
                              "step)");
  }
  return Status::Ok();
}

}  // namespace sparsekv
