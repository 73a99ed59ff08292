// StepSchedule: the manager's run-phase calls in the order and on the streams of the step's
// choice. The orderings it keeps (manager.h states them; docs/schedule.md draws them):
//   * a group's miss copies and the next prefetch resolve reuse state the last prefetch copy
//     writes (its victims, the one prefetch list), so the engine's stream waits for that copy
//     right after the group's resolve;
//   * a chunk's copy waits for its layer's resolve and append; attention over a slice waits for
//     its chunks; every copy of a layer is therefore complete before the engine's stream moves on
//     to the next layer (group g + 2 resolves into group g's miss list);
//   * FinishStep joins the prefetch stream, so that the step ends with every copy it enqueued.
// A failed attention callback leaves the layer's copies enqueued and the engine's stream ordered
// after them, so that the step can go on or be aborted from any layer boundary; AbortStep
// completes the layer RunLayer stopped in from its stage (appended, resolved, copied).
#include "sparsekv/step_schedule.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <string_view>

#include "schedule/schedule_tuner.h"
#include "sparsekv/kernel_views.h"

namespace sparsekv {

std::string StepChoice::ToString() const {
  std::string text;
  if (crosslayer_prefetch) {
    text = "prefetch";
    if (prefetch_copy_blocks > 0) text.append(":").append(std::to_string(prefetch_copy_blocks));
    if (chunk_rows > 0) text.append("+");
  }
  if (chunk_rows > 0) text.append("chunks").append(std::to_string(chunk_rows));
  return text.empty() ? "serial" : text;
}

StatusOr<StepChoice> ParseStepChoice(std::string_view text) {
  const auto refuse = [&] {
    return InvalidArgument("step choice '" + std::string(text.substr(0, 100)) +
                           "' is not serial, prefetch[:B], chunks<N> or prefetch[:B]+chunks<N> "
                           "(B, N >= 1)");
  };
  // A whole positive number at the front of `rest`, consumed; 0 if there is none.
  const auto number = [](std::string_view& rest) {
    int32_t n = 0;
    const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), n);
    if (error != std::errc() || n < 1) return 0;
    rest.remove_prefix(static_cast<size_t>(end - rest.data()));
    return n;
  };
  StepChoice c;
  std::string_view rest = text;
  if (rest == "serial") return c;
  if (rest.starts_with("prefetch")) {
    c.crosslayer_prefetch = true;
    rest.remove_prefix(8);
    if (rest.starts_with(":")) {
      rest.remove_prefix(1);
      if (rest.starts_with("+") || (c.prefetch_copy_blocks = number(rest)) == 0) return refuse();
    }
    if (rest.empty()) return c;
    if (!rest.starts_with("+")) return refuse();
    rest.remove_prefix(1);
  }
  if (!rest.starts_with("chunks")) return refuse();
  rest.remove_prefix(6);
  if (rest.starts_with("+") || (c.chunk_rows = number(rest)) == 0 || !rest.empty()) {
    return refuse();
  }
  return c;
}

std::vector<StepChoice> AllowedChoices(const CacheOptions& o) {
  const bool prefetch = o.index_groups() > 1 && o.max_prefetch >= IndexGroups(o).max_top_k();
  std::vector<int32_t> chunks = {0};
  if (o.copy_chunk_rows > 0) {
    for (int32_t rows = o.copy_chunk_rows; rows < o.effective_max_batch(); rows *= 2) {
      chunks.push_back(rows);
    }
  }
  std::vector<StepChoice> out;
  for (int32_t c : chunks) out.push_back(StepChoice{false, c});
  if (!prefetch) return out;
  std::vector<int32_t> grids = {0};
  const int32_t options_grid = o.prefetch_copy_blocks > 0 ? o.prefetch_copy_blocks : o.copy_blocks;
  if (options_grid != kBoundedPrefetchCopyBlocks) grids.push_back(kBoundedPrefetchCopyBlocks);
  for (int32_t blocks : grids) {
    for (int32_t c : chunks) out.push_back(StepChoice{true, c, blocks});
  }
  return out;
}

StatusOr<std::unique_ptr<StepSchedule>> StepSchedule::Create(SparseKVCacheManager& manager,
                                                             const ScheduleOptions& options) {
  const std::vector<StepChoice> allowed = AllowedChoices(manager.options());
  const CacheOptions& o = manager.options();
  // A choice with the prefetch on any grid (> 0) is that of an allowed choice; the grid means
  // nothing without the prefetch.
  auto normal = [](StepChoice c) {
    if (!c.crosslayer_prefetch) c.prefetch_copy_blocks = 0;
    return c;
  };
  auto listed = [&](StepChoice c) {
    if (c.prefetch_copy_blocks < 0) return false;
    c.prefetch_copy_blocks = 0;
    return std::find(allowed.begin(), allowed.end(), c) != allowed.end();
  };
  // A fixed choice may also take chunks as large as the batch or larger (one slice).
  auto is_allowed = [&](const StepChoice& c) {
    if (listed(c)) return true;
    const bool prefetch_ok = !c.crosslayer_prefetch || allowed.back().crosslayer_prefetch;
    return prefetch_ok && c.prefetch_copy_blocks >= 0 && c.chunk_rows > 0 &&
           o.copy_chunk_rows > 0 && c.chunk_rows % o.copy_chunk_rows == 0;
  };
  auto refuse = [&](const StepChoice& c, const char* what) {
    std::string list;
    for (const StepChoice& a : allowed) list += (list.empty() ? "" : ", ") + a.ToString();
    return InvalidArgument(std::string("StepSchedule: ") + what + " " + c.ToString() +
                           " is not one the manager's options allow (" + list + ")");
  };
  if (options.fixed.has_value() && !is_allowed(normal(*options.fixed))) {
    return refuse(*options.fixed, "fixed choice");
  }
  std::vector<StepChoice> candidates = options.candidates.empty() ? allowed : options.candidates;
  for (StepChoice& c : candidates) {
    c = normal(c);
    if (!listed(c)) {
      return refuse(c, "candidate");
    }
  }
  if (std::find(candidates.begin(), candidates.end(), StepChoice{}) == candidates.end()) {
    candidates.insert(candidates.begin(), StepChoice{});  // a step with nothing to copy
  }
  if (options.trials < 1 || options.trials > 64) {
    return InvalidArgument("StepSchedule: trials " + std::to_string(options.trials) +
                           " outside [1, 64]");
  }
  auto tuner = std::make_unique<ScheduleTuner>(std::move(candidates), options.trials);
  std::unique_ptr<StepSchedule> schedule(new StepSchedule(
      manager, std::move(tuner),
      options.fixed.has_value() ? std::optional(normal(*options.fixed)) : std::nullopt));
  SPARSEKV_RETURN_IF_ERROR(schedule->Allocate());
  return schedule;
}

StepSchedule::StepSchedule(SparseKVCacheManager& manager, std::unique_ptr<ScheduleTuner> tuner,
                           std::optional<StepChoice> fixed)
    : manager_(manager),
      groups_(manager.options()),
      backend_(manager.backend()),
      tuner_(std::move(tuner)),
      fixed_(std::move(fixed)) {}

Status StepSchedule::Allocate() {
  SPARSEKV_ASSIGN_OR_RETURN(copy_stream_, backend_.CreateStream());
  SPARSEKV_ASSIGN_OR_RETURN(prefetch_stream_, backend_.CreateStream());
  for (EventHandle* e : {&resolved_, &prefetch_resolved_, &prefetched_}) {
    SPARSEKV_ASSIGN_OR_RETURN(*e, backend_.CreateEvent(false));
  }
  for (EventHandle* e : {&step_start_, &step_end_}) {
    SPARSEKV_ASSIGN_OR_RETURN(*e, backend_.CreateEvent(true));
  }
  const CacheOptions& o = manager_.options();
  const int32_t slices = o.copy_chunk_rows > 0
                             ? (o.effective_max_batch() + o.copy_chunk_rows - 1) / o.copy_chunk_rows
                             : 0;
  for (int32_t i = 0; i < slices; ++i) {
    SPARSEKV_ASSIGN_OR_RETURN(EventHandle e, backend_.CreateEvent(false));
    slice_copied_.push_back(e);
  }
  return Status::Ok();
}

StepSchedule::~StepSchedule() {
  for (StreamHandle s : {copy_stream_, prefetch_stream_}) {
    if (s != nullptr) backend_.Synchronize(s).IgnoreError();
  }
  for (EventHandle e : slice_copied_) backend_.DestroyEvent(e);
  for (EventHandle e : {resolved_, prefetch_resolved_, prefetched_, step_start_, step_end_}) {
    if (e != nullptr) backend_.DestroyEvent(e);
  }
  for (StreamHandle s : {copy_stream_, prefetch_stream_}) {
    if (s != nullptr) backend_.DestroyStream(s);
  }
  for (void* p : {abort_rows_, abort_keys_, abort_topk_, abort_slots_}) {
    if (p != nullptr) backend_.FreeDevice(p);
  }
}

Status StepSchedule::CheckStream(StreamHandle stream, const char* call) {
  const Status s = backend_.CheckStream(stream);
  if (s.ok()) return s;
  return Status(s.code(), std::string("StepSchedule::") + call + ": " + s.message());
}

Status StepSchedule::PlanStep(std::span<const RequestId> batch, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckStream(stream, "PlanStep"));
  SPARSEKV_RETURN_IF_ERROR(ObservePendingTime());
  SPARSEKV_RETURN_IF_ERROR(manager_.PlanStep(batch, stream));
  batch_.assign(batch.begin(), batch.end());
  return Choose();
}

Status StepSchedule::PlanStep(std::span<const RequestId> batch, std::span<const int32_t> token_ids,
                              StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(CheckStream(stream, "PlanStep"));
  SPARSEKV_RETURN_IF_ERROR(ObservePendingTime());
  SPARSEKV_RETURN_IF_ERROR(manager_.PlanStep(batch, token_ids, stream));
  batch_.assign(batch.begin(), batch.end());
  return Choose();
}

Status StepSchedule::Choose() {
  hot_requests_ = static_cast<int32_t>(std::count_if(
      batch_.begin(), batch_.end(), [&](RequestId id) { return !manager_.IsResident(id); }));
  const StepShape shape{static_cast<int32_t>(batch_.size()), hot_requests_};
  if (fixed_.has_value()) {
    choice_ = *fixed_;
    reason_ = "fixed by ScheduleOptions::fixed";
  } else {
    const ScheduleDecision d = tuner_->Choose(shape);
    choice_ = d.choice;
    reason_ = d.reason;
    stats_.calibration_steps += d.calibrating;
  }
  step_open_ = true;
  next_layer_ = 0;
  stage_ = LayerStage::kNone;
  chunks_copied_ = 0;
  attention_failed_ = false;
  prefetch_used_ = false;
  timing_ = false;
  ++stats_.steps;
  ++stats_.steps_by_choice[choice_.ToString()];
  stats_.last_choice = choice_;
  stats_.last_reason = reason_;
  return Status::Ok();
}

Status StepSchedule::ObservePendingTime() {
  if (!time_pending_) return Status::Ok();
  time_pending_ = false;
  SPARSEKV_ASSIGN_OR_RETURN(const double seconds, backend_.ElapsedSeconds(step_start_, step_end_));
  tuner_->Observe(StepShape{pending_batch_, pending_hot_}, pending_choice_, seconds);
  return Status::Ok();
}

Status StepSchedule::RunLayer(int32_t layer, const LayerWork& work, const AttendFn& attend,
                              StreamHandle stream) {
  if (!step_open_) return FailedPrecondition("StepSchedule::RunLayer: no step is planned");
  if (layer != next_layer_) {
    return FailedPrecondition("StepSchedule::RunLayer: layer " + std::to_string(layer) +
                              " out of order (layer " + std::to_string(next_layer_) + " is next)");
  }
  const bool leader = groups_.Leads(layer);
  const int32_t top_k = groups_.LayerTopK(layer);
  if (work.new_rows == nullptr || work.slots == nullptr || (leader && work.topk == nullptr) ||
      !attend) {
    return InvalidArgument(
        "StepSchedule::RunLayer: new_rows, slots, attend and (for the first layer of an index "
        "group) topk are required");
  }
  if (leader && choice_.crosslayer_prefetch && work.topk_stride != 0 && work.topk_stride != top_k) {
    return InvalidArgument(
        "StepSchedule::RunLayer: the cross-layer prefetch reads the top-k as "
        "[max_batch, top_k]; topk_stride " +
        std::to_string(work.topk_stride) + " is not top_k");
  }
  if (layer == 0) {
    SPARSEKV_ASSIGN_OR_RETURN(const bool capturing, backend_.IsCapturing(stream));
    timing_ = !capturing;
    if (timing_) SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(step_start_, stream));
  }
  SPARSEKV_RETURN_IF_ERROR(manager_.AppendToken(layer, work.new_rows, work.new_keys, stream));
  stage_ = LayerStage::kAppended;
  if (leader) {
    SPARSEKV_RETURN_IF_ERROR(
        manager_.ResolveLayer(layer, work.topk, work.slots, nullptr, stream, work.topk_stride));
    stage_ = LayerStage::kResolved;
    if (choice_.crosslayer_prefetch) SPARSEKV_RETURN_IF_ERROR(Prefetch(layer, work.topk, stream));
  }
  stage_ = LayerStage::kResolved;
  const Status attended = CopyAndAttend(layer, attend, stream);
  if (stage_ != LayerStage::kCopied) return attended;  // the manager's error: the layer is not run
  ++next_layer_;
  stage_ = LayerStage::kNone;
  chunks_copied_ = 0;
  attention_failed_ = attention_failed_ || !attended.ok();
  return attended;
}

Status StepSchedule::Prefetch(int32_t layer, const int32_t* topk, StreamHandle stream) {
  const CacheOptions& o = manager_.options();
  // The group's copies (a victim may be a slot the last prefetch filled) and the next prefetch
  // resolve (the one prefetch list) follow the last prefetch copy.
  if (prefetch_used_) SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, prefetched_));
  const int32_t next = groups_.End(groups_.Of(layer));
  if (next >= o.geometry.num_layers()) return Status::Ok();
  // This group's top-k, as positions the next group will likely select.
  SPARSEKV_RETURN_IF_ERROR(manager_.ResolvePrefetch(next, topk, groups_.LayerTopK(layer), stream));
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(prefetch_resolved_, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(prefetch_stream_, prefetch_resolved_));
  SPARSEKV_RETURN_IF_ERROR(
      manager_.CopyPrefetch(next, prefetch_stream_, choice_.prefetch_copy_blocks));
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(prefetched_, prefetch_stream_));
  prefetch_used_ = true;
  return Status::Ok();
}

Status StepSchedule::CopyAndAttend(int32_t layer, const AttendFn& attend, StreamHandle stream) {
  const int32_t batch = static_cast<int32_t>(batch_.size());
  const int32_t slice = choice_.chunk_rows;
  auto attend_rows = [&](int32_t first, int32_t rows) -> Status {
    Status s = attend(layer, first, rows, stream);
    if (!s.ok()) {
      return Status(s.code(), "StepSchedule: attention of layer " + std::to_string(layer) +
                                  " over rows [" + std::to_string(first) + ", " +
                                  std::to_string(first + rows) + "): " + s.message());
    }
    return s;
  };
  if (slice == 0) {
    SPARSEKV_RETURN_IF_ERROR(manager_.CopyMisses(layer, stream));
    stage_ = LayerStage::kCopied;
    return attend_rows(0, batch);
  }
  // The chunks of the batch, slice after slice, on the copy stream; attention over each slice
  // once its chunks are in.
  const int32_t chunk = manager_.options().copy_chunk_rows;
  const int32_t chunks = (batch + chunk - 1) / chunk;
  const int32_t per_slice = slice / chunk;
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(resolved_, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(copy_stream_, resolved_));
  int32_t slices = 0;
  for (int32_t c = 0; c < chunks; ++slices) {
    for (int32_t end = std::min(chunks, c + per_slice); c < end; ++c) {
      SPARSEKV_RETURN_IF_ERROR(manager_.CopyMissChunk(layer, c, copy_stream_));
      ++chunks_copied_;
    }
    SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(slice_copied_[slices], copy_stream_));
  }
  stage_ = LayerStage::kCopied;
  for (int32_t s = 0, first = 0; first < batch; ++s, first += slice) {
    SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, slice_copied_[s]));
    const Status attended = attend_rows(first, std::min(slice, batch - first));
    if (!attended.ok()) {
      // The layer's later slices are not attended, but the engine's stream still follows every
      // copy of the layer (the next group's resolve may reuse its miss list).
      SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, slice_copied_[slices - 1]));
      return attended;
    }
  }
  return Status::Ok();
}

Status StepSchedule::FinishStep(StreamHandle stream) {
  if (!step_open_) return FailedPrecondition("StepSchedule::FinishStep: no step is planned");
  if (prefetch_used_) SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, prefetched_));
  SPARSEKV_RETURN_IF_ERROR(manager_.FinishStep(stream));
  step_open_ = false;
  if (timing_) {
    SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(step_end_, stream));
    time_pending_ = !fixed_.has_value() && !attention_failed_;
    pending_batch_ = static_cast<int32_t>(batch_.size());
    pending_hot_ = hot_requests_;
    pending_choice_ = choice_;
  }
  return Status::Ok();
}

Status StepSchedule::AllocateAbortWork(StreamHandle stream) {
  if (abort_slots_ != nullptr) return Status::Ok();
  const CacheOptions& o = manager_.options();
  const size_t batch = static_cast<size_t>(o.effective_max_batch());
  int32_t stride = 0;
  for (const LayerShape& l : o.geometry.layers) stride = std::max(stride, l.row_stride);
  const size_t row_bytes = batch * static_cast<size_t>(stride);
  const size_t key_bytes = batch * static_cast<size_t>(o.indexer_key_bytes);
  const size_t topk_bytes = batch * static_cast<size_t>(o.top_k) * sizeof(int32_t);
  // Filled one by one: a failed allocation leaves the others for the destructor.
  SPARSEKV_ASSIGN_OR_RETURN(abort_rows_, backend_.AllocateDevice(row_bytes));
  SPARSEKV_RETURN_IF_ERROR(backend_.MemsetAsync(abort_rows_, 0, row_bytes, stream));
  if (key_bytes > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(abort_keys_, backend_.AllocateDevice(key_bytes));
    SPARSEKV_RETURN_IF_ERROR(backend_.MemsetAsync(abort_keys_, 0, key_bytes, stream));
  }
  SPARSEKV_ASSIGN_OR_RETURN(abort_topk_, backend_.AllocateDevice(topk_bytes));
  static_assert(kPaddingPosition == -1, "an all-ones int32 is the padding position");
  SPARSEKV_RETURN_IF_ERROR(backend_.MemsetAsync(abort_topk_, 0xFF, topk_bytes, stream));
  SPARSEKV_ASSIGN_OR_RETURN(abort_slots_, backend_.AllocateDevice(topk_bytes));
  return Status::Ok();
}

Status StepSchedule::CopyRemaining(int32_t layer, StreamHandle stream) {
  if (chunks_copied_ == 0) return manager_.CopyMisses(layer, stream);
  // Chunks were copied (a chunk's copy failed): CopyMisses is refused after one of them.
  const int32_t batch = static_cast<int32_t>(batch_.size());
  const int32_t chunk = manager_.options().copy_chunk_rows;
  for (int32_t c = chunks_copied_; c < (batch + chunk - 1) / chunk; ++c) {
    SPARSEKV_RETURN_IF_ERROR(manager_.CopyMissChunk(layer, c, stream));
    ++chunks_copied_;
  }
  return Status::Ok();
}

Status StepSchedule::AbortStep(StreamHandle stream) {
  if (!step_open_) return FailedPrecondition("StepSchedule::AbortStep: no step is planned");
  SPARSEKV_RETURN_IF_ERROR(CheckStream(stream, "AbortStep"));
  SPARSEKV_ASSIGN_OR_RETURN(const bool capturing, backend_.IsCapturing(stream));
  if (capturing) {
    return FailedPrecondition(
        "StepSchedule::AbortStep: the stream is capturing a graph; end the capture first");
  }
  SPARSEKV_RETURN_IF_ERROR(AllocateAbortWork(stream));
  const CacheOptions& o = manager_.options();
  // The copy stream's work (the chunks of the layer RunLayer stopped in) comes first.
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(resolved_, copy_stream_));
  SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, resolved_));
  for (; next_layer_ < o.geometry.num_layers(); ++next_layer_) {
    const int32_t layer = next_layer_;
    if (stage_ == LayerStage::kNone) {
      SPARSEKV_RETURN_IF_ERROR(manager_.AppendToken(layer, abort_rows_, abort_keys_, stream));
      stage_ = LayerStage::kAppended;
    }
    if (stage_ == LayerStage::kAppended) {
      if (layer % o.layers_per_index == 0) {
        // As in RunLayer: the group's resolve follows the last prefetch copy.
        if (prefetch_used_) SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, prefetched_));
        SPARSEKV_RETURN_IF_ERROR(
            manager_.ResolveLayer(layer, static_cast<const int32_t*>(abort_topk_),
                                  static_cast<int32_t*>(abort_slots_), nullptr, stream));
      }
      stage_ = LayerStage::kResolved;
    }
    if (stage_ == LayerStage::kResolved) {
      SPARSEKV_RETURN_IF_ERROR(CopyRemaining(layer, stream));
      stage_ = LayerStage::kCopied;
    }
    stage_ = LayerStage::kNone;
    chunks_copied_ = 0;
  }
  if (prefetch_used_) SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, prefetched_));
  SPARSEKV_RETURN_IF_ERROR(manager_.FinishStep(stream));
  step_open_ = false;
  timing_ = false;
  return Status::Ok();
}

Status StepSchedule::FinishReplayedStep(double seconds) {
  if (!step_open_) {
    return FailedPrecondition("StepSchedule::FinishReplayedStep: no step is planned");
  }
  SPARSEKV_RETURN_IF_ERROR(manager_.FinishReplayedStep());
  step_open_ = false;
  if (!fixed_.has_value()) {
    tuner_->Observe(StepShape{static_cast<int32_t>(batch_.size()), hot_requests_}, choice_,
                    seconds);
  }
  return Status::Ok();
}

}  // namespace sparsekv
