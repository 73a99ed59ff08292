// StepSchedule: the manager's run-phase calls in the order and on the streams of the step's
// choice. The orderings it keeps (manager.h states them; docs/schedule.md draws them):
//   * a group's miss copies and the next prefetch resolve reuse state the last prefetch copy
//     writes (its victims, the one prefetch list), so the engine's stream waits for that copy
//     right after the group's resolve;
//   * a chunk's copy waits for its layer's resolve and append; attention over a slice waits for
//     its chunks; every copy of a layer is therefore complete before the engine's stream moves on
//     to the next layer (group g + 2 resolves into group g's miss list);
//   * the planned copy enqueues a group's copies on the copy stream after the group's resolve (and
//     so after the last prefetch copy the engine's stream waited for), each layer's attention
//     waits for its own layer's copy, so that the engine's stream has followed every copy of
//     group g once it leaves g's last layer, before group g + 2 resolves; the manager allows a
//     layer's copy before the layer's append (its window slot and the rows it copies are apart);
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
  if (resident) return "resident";
  std::string text;
  auto add = [&](const char* part, int32_t blocks) {
    text.append(text.empty() ? "" : "+").append(part);
    if (blocks > 0) text.append(":").append(std::to_string(blocks));
  };
  if (crosslayer_prefetch) add("prefetch", prefetch_copy_blocks);
  if (planned_copy) add("planned", planned_copy_blocks);
  if (chunk_rows > 0) add(("chunks" + std::to_string(chunk_rows)).c_str(), 0);
  return text.empty() ? "serial" : text;
}

StatusOr<StepChoice> ParseStepChoice(std::string_view text) {
  const auto refuse = [&] {
    return InvalidArgument(
        "step choice '" + std::string(text.substr(0, 100)) +
        "' is not serial, resident, or prefetch[:B], planned[:B] and chunks<N> joined "
        "by '+' in that order (B, N >= 1)");
  };
  // `digits` as a whole positive number; 0 if it is not one.
  const auto number = [](std::string_view digits) {
    int32_t n = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (error != std::errc() || end != digits.data() + digits.size() || n < 1) return 0;
    return n;
  };
  // "name" or "name:B" with B >= 1: B into *blocks (0 without it); false for other text.
  const auto named = [&](std::string_view part, std::string_view name, int32_t* blocks) {
    if (!part.starts_with(name)) return false;
    part.remove_prefix(name.size());
    if (part.empty()) return true;
    if (!part.starts_with(":")) return false;
    *blocks = number(part.substr(1));
    return *blocks > 0;
  };
  StepChoice c;
  if (text == "serial") return c;
  if (text == "resident") return StepChoice{.resident = true};
  // The parts in their order: 0 prefetch, 1 planned, 2 chunks; each at most once.
  int32_t next = 0;
  for (size_t start = 0;;) {
    const size_t plus = text.find('+', start);
    const std::string_view part =
        text.substr(start, plus == std::string_view::npos ? std::string_view::npos : plus - start);
    if (next <= 0 && part.starts_with("prefetch")) {
      if (!named(part, "prefetch", &c.prefetch_copy_blocks)) return refuse();
      c.crosslayer_prefetch = true;
      next = 1;
    } else if (next <= 1 && part.starts_with("planned")) {
      if (!named(part, "planned", &c.planned_copy_blocks)) return refuse();
      c.planned_copy = true;
      next = 2;
    } else if (next <= 2 && part.starts_with("chunks")) {
      if ((c.chunk_rows = number(part.substr(6))) == 0) return refuse();
      next = 3;
    } else {
      return refuse();
    }
    if (plus == std::string_view::npos) return c;
    start = plus + 1;
  }
}

std::vector<StepChoice> AllowedChoices(const CacheOptions& o) {
  const IndexGroups groups(o);
  const bool prefetch = o.offloaded_index_groups() > 1 && o.max_prefetch >= groups.max_top_k();
  std::vector<int32_t> chunks = {0};
  if (o.copy_chunk_rows > 0) {
    for (int32_t rows = o.copy_chunk_rows; rows < o.effective_max_batch(); rows *= 2) {
      chunks.push_back(rows);
    }
  }
  // The options' grid (0) and the bounded one, unless the options' grid is that already.
  auto grids = [](bool offered, int32_t options_grid) {
    std::vector<int32_t> out;
    if (!offered) return out;
    out.push_back(0);
    if (options_grid != kBoundedPrefetchCopyBlocks) out.push_back(kBoundedPrefetchCopyBlocks);
    return out;
  };
  const std::vector<int32_t> prefetch_grids =
      grids(prefetch, o.prefetch_copy_blocks > 0 ? o.prefetch_copy_blocks : o.copy_blocks);
  const std::vector<int32_t> planned_grids = grids(groups.shared(), o.copy_blocks);
  std::vector<StepChoice> out;
  auto add = [&](bool with_prefetch, int32_t prefetch_grid, bool planned, int32_t planned_grid) {
    for (int32_t c : chunks) {
      out.push_back(StepChoice{with_prefetch, c, prefetch_grid, planned, planned_grid});
    }
  };
  add(false, 0, false, 0);
  for (int32_t p : prefetch_grids) add(true, p, false, 0);
  for (int32_t q : planned_grids) {
    add(false, 0, true, q);
    for (int32_t p : prefetch_grids) add(true, p, true, q);
  }
  return out;
}

StatusOr<std::unique_ptr<StepSchedule>> StepSchedule::Create(SparseKVCacheManager& manager,
                                                             const ScheduleOptions& options) {
  const std::vector<StepChoice> allowed = AllowedChoices(manager.options());
  const CacheOptions& o = manager.options();
  // A choice with the prefetch or the planned copy on any grid (> 0) is that of an allowed
  // choice; a grid means nothing without its copies.
  auto normal = [](StepChoice c) {
    if (!c.crosslayer_prefetch) c.prefetch_copy_blocks = 0;
    if (!c.planned_copy) c.planned_copy_blocks = 0;
    return c;
  };
  auto listed = [&](StepChoice c) {
    if (c.prefetch_copy_blocks < 0 || c.planned_copy_blocks < 0) return false;
    c.prefetch_copy_blocks = 0;
    c.planned_copy_blocks = 0;
    return std::find(allowed.begin(), allowed.end(), c) != allowed.end();
  };
  // A fixed choice may also take chunks as large as the batch or larger (one slice).
  auto is_allowed = [&](StepChoice c) {
    if (listed(c)) return true;
    const int32_t rows = c.chunk_rows;
    c.chunk_rows = 0;
    return listed(c) && rows > 0 && o.copy_chunk_rows > 0 && rows % o.copy_chunk_rows == 0;
  };
  auto refuse = [&](const StepChoice& c, const char* what) {
    std::string list;
    for (const StepChoice& a : allowed) list += (list.empty() ? "" : ", ") + a.ToString();
    std::string why;
    if (c.planned_copy && !IndexGroups(o).shared()) {
      why = "; the planned copy needs an index group of more than one layer";
    }
    return InvalidArgument(std::string("StepSchedule: ") + what + " " + c.ToString() +
                           " is not one the manager's options allow (" + list + ")" + why);
  };
  const auto resident = [](const StepChoice& c) { return c.resident; };
  if ((options.fixed.has_value() && options.fixed->resident) ||
      std::any_of(options.candidates.begin(), options.candidates.end(), resident)) {
    return InvalidArgument(
        "StepSchedule: resident is not a choice to fix or measure; the schedule runs a step in it "
        "exactly when nothing can miss (every request of its batch resident)");
  }
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
      options.fixed.has_value() ? std::optional(normal(*options.fixed)) : std::nullopt,
      options.fixed_yields_to_resident));
  SPARSEKV_RETURN_IF_ERROR(schedule->Allocate());
  return schedule;
}

StepSchedule::StepSchedule(SparseKVCacheManager& manager, std::unique_ptr<ScheduleTuner> tuner,
                           std::optional<StepChoice> fixed, bool fixed_yields_to_resident)
    : manager_(manager),
      groups_(manager.options()),
      backend_(manager.backend()),
      tuner_(std::move(tuner)),
      fixed_(std::move(fixed)),
      fixed_yields_to_resident_(fixed_yields_to_resident) {}

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
  slices_per_layer_ = std::max(1, slices);
  if (groups_.shared()) {
    int32_t largest = 1;
    for (int32_t g = 0; g < groups_.count(); ++g) largest = std::max(largest, groups_.Size(g));
    for (int32_t i = 0; i < largest * slices_per_layer_; ++i) {
      SPARSEKV_ASSIGN_OR_RETURN(EventHandle e, backend_.CreateEvent(false));
      planned_copied_.push_back(e);
    }
  }
  copied_whole_.assign(static_cast<size_t>(groups_.layers()), false);
  chunks_copied_.assign(static_cast<size_t>(groups_.layers()), 0);
  return Status::Ok();
}

StepSchedule::~StepSchedule() {
  for (StreamHandle s : {copy_stream_, prefetch_stream_}) {
    if (s != nullptr) backend_.Synchronize(s).IgnoreError();
  }
  for (EventHandle e : slice_copied_) backend_.DestroyEvent(e);
  for (EventHandle e : planned_copied_) backend_.DestroyEvent(e);
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
  if (!manager_.StepCanMiss() && (!fixed_.has_value() || fixed_yields_to_resident_)) {
    choice_ = StepChoice{.resident = true};
    reason_ = "every request is resident: nothing can miss, no copy is enqueued";
  } else if (fixed_.has_value()) {
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
  std::fill(copied_whole_.begin(), copied_whole_.end(), false);
  std::fill(chunks_copied_.begin(), chunks_copied_.end(), 0);
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
  const CacheOptions& o = manager_.options();
  if (layer >= o.geometry.num_layers()) {
    return FailedPrecondition("StepSchedule::RunLayer: layer " + std::to_string(layer) +
                              " past the last layer (every layer of the step has run)");
  }
  const bool resolved = o.geometry.offloaded(layer);
  const bool window_only = o.geometry.layers[layer].kind == LayerKind::kWindowOnly;
  const bool leader = groups_.Leads(layer);
  const int32_t top_k = groups_.LayerTopK(layer);
  if ((work.new_rows == nullptr && !window_only) ||
      (resolved && (work.slots == nullptr || (leader && work.topk == nullptr))) || !attend) {
    return InvalidArgument(
        "StepSchedule::RunLayer: new_rows, slots, attend and (for the first layer of an index "
        "group) topk are required (of a resident layer new_rows and attend, of a window-only "
        "layer attend)");
  }
  if (o.raw_window > 0 && work.window_rows == nullptr) {
    return InvalidArgument("StepSchedule::RunLayer: window_rows is required with a raw window");
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
  if (o.raw_window > 0 || !resolved) {
    const StepRows rows{work.new_rows, work.new_keys, work.window_rows};
    SPARSEKV_RETURN_IF_ERROR(manager_.AppendToken(layer, rows, stream));
  } else {
    SPARSEKV_RETURN_IF_ERROR(manager_.AppendToken(layer, work.new_rows, work.new_keys, stream));
  }
  stage_ = LayerStage::kAppended;
  if (!resolved) {
    // Nothing to resolve or copy: its entries and window are in device memory already.
    stage_ = LayerStage::kCopied;
    const int32_t batch = static_cast<int32_t>(batch_.size());
    Status attended = attend(layer, 0, batch, stream);
    if (!attended.ok()) {
      attended = Status(attended.code(), "StepSchedule: attention of layer " +
                                             std::to_string(layer) + " over rows [0, " +
                                             std::to_string(batch) + "): " + attended.message());
    }
    ++next_layer_;
    stage_ = LayerStage::kNone;
    attention_failed_ = attention_failed_ || !attended.ok();
    return attended;
  }
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
  attention_failed_ = attention_failed_ || !attended.ok();
  return attended;
}

Status StepSchedule::Prefetch(int32_t layer, const int32_t* topk, StreamHandle stream) {
  const CacheOptions& o = manager_.options();
  // The group's copies (a victim may be a slot the last prefetch filled) and the next prefetch
  // resolve (the one prefetch list) follow the last prefetch copy.
  if (prefetch_used_) SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, prefetched_));
  // The next group the manager resolves (past resident and window-only layers).
  int32_t next = groups_.End(groups_.Of(layer));
  while (next < o.geometry.num_layers() && !o.geometry.offloaded(next))
    next = groups_.End(groups_.Of(next));
  if (next >= o.geometry.num_layers()) return Status::Ok();
  // This group's top-k, as positions the next group will likely select.
  SPARSEKV_RETURN_IF_ERROR(manager_.ResolvePrefetch(next, topk, groups_.LayerTopK(layer), stream));
  prefetch_pending_ = next;
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(prefetch_resolved_, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(prefetch_stream_, prefetch_resolved_));
  SPARSEKV_RETURN_IF_ERROR(
      manager_.CopyPrefetch(next, prefetch_stream_, choice_.prefetch_copy_blocks));
  prefetch_pending_ = -1;
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(prefetched_, prefetch_stream_));
  prefetch_used_ = true;
  return Status::Ok();
}

Status StepSchedule::CopyAndAttend(int32_t layer, const AttendFn& attend, StreamHandle stream) {
  const int32_t batch = static_cast<int32_t>(batch_.size());
  const int32_t slice = choice_.chunk_rows > 0 ? choice_.chunk_rows : batch;
  auto attend_rows = [&](int32_t first, int32_t rows) -> Status {
    Status s = attend(layer, first, rows, stream);
    if (!s.ok()) {
      return Status(s.code(), "StepSchedule: attention of layer " + std::to_string(layer) +
                                  " over rows [" + std::to_string(first) + ", " +
                                  std::to_string(first + rows) + "): " + s.message());
    }
    return s;
  };
  // Per attention slice, the event after which its rows are in; null: copied on `stream`.
  const EventHandle* copied = nullptr;
  if (choice_.resident) {
    // Nothing can miss: no copy to enqueue (the manager refuses this in a step that can miss).
    SPARSEKV_RETURN_IF_ERROR(manager_.SkipMissCopy(layer));
    copied_whole_[layer] = true;
  } else if (choice_.planned_copy) {
    // The group's copies were enqueued on the copy stream by its first layer, right after the
    // resolve; this layer waits for its own only.
    if (groups_.Leads(layer)) SPARSEKV_RETURN_IF_ERROR(CopyGroup(layer, stream));
    copied = &planned_copied_[static_cast<size_t>(layer - groups_.Leader(layer)) *
                              static_cast<size_t>(slices_per_layer_)];
  } else if (choice_.chunk_rows == 0) {
    SPARSEKV_RETURN_IF_ERROR(CopyLayer(layer, 0, nullptr, stream));
  } else {
    // The chunks of the batch, slice after slice, on the copy stream; attention over each slice
    // once its chunks are in.
    SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(resolved_, stream));
    SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(copy_stream_, resolved_));
    SPARSEKV_RETURN_IF_ERROR(CopyLayer(layer, 0, slice_copied_.data(), copy_stream_));
    copied = slice_copied_.data();
  }
  stage_ = LayerStage::kCopied;
  const int32_t slices = (batch + slice - 1) / slice;
  for (int32_t s = 0, first = 0; first < batch; ++s, first += slice) {
    if (copied != nullptr) SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, copied[s]));
    const Status attended = attend_rows(first, std::min(slice, batch - first));
    if (!attended.ok()) {
      // The layer's later slices are not attended, but the engine's stream still follows every
      // copy of the layer (the next group's resolve may reuse its miss list).
      if (copied != nullptr) {
        SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, copied[slices - 1]));
      }
      return attended;
    }
  }
  return Status::Ok();
}

Status StepSchedule::CopyGroup(int32_t leader, StreamHandle stream) {
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(resolved_, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(copy_stream_, resolved_));
  const int32_t group = groups_.Of(leader);
  for (int32_t l = leader; l < groups_.End(group); ++l) {
    const size_t first_event =
        static_cast<size_t>(l - leader) * static_cast<size_t>(slices_per_layer_);
    SPARSEKV_RETURN_IF_ERROR(
        CopyLayer(l, choice_.planned_copy_blocks, &planned_copied_[first_event], copy_stream_));
  }
  return Status::Ok();
}

Status StepSchedule::CopyLayer(int32_t layer, int32_t blocks, const EventHandle* slice_events,
                               StreamHandle stream) {
  if (choice_.chunk_rows == 0) {
    SPARSEKV_RETURN_IF_ERROR(manager_.CopyMisses(layer, stream, blocks));
    copied_whole_[layer] = true;
    if (slice_events != nullptr) {
      SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(slice_events[0], stream));
    }
    return Status::Ok();
  }
  const int32_t batch = static_cast<int32_t>(batch_.size());
  const int32_t chunk = manager_.options().copy_chunk_rows;
  const int32_t chunks = (batch + chunk - 1) / chunk;
  const int32_t per_slice = choice_.chunk_rows / chunk;
  for (int32_t c = 0, s = 0; c < chunks; ++s) {
    for (const int32_t end = std::min(chunks, c + per_slice); c < end; ++c) {
      SPARSEKV_RETURN_IF_ERROR(manager_.CopyMissChunk(layer, c, stream, blocks));
      ++chunks_copied_[layer];
    }
    SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(slice_events[s], stream));
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
  if (copied_whole_[layer]) return Status::Ok();  // a planned copy ran ahead of the layer
  if (chunks_copied_[layer] == 0) {
    SPARSEKV_RETURN_IF_ERROR(manager_.CopyMisses(layer, stream));
    copied_whole_[layer] = true;
    return Status::Ok();
  }
  // Chunks were copied (all of them ahead of the layer, or until a chunk's copy failed):
  // CopyMisses is refused after one of them.
  const int32_t batch = static_cast<int32_t>(batch_.size());
  const int32_t chunk = manager_.options().copy_chunk_rows;
  for (int32_t c = chunks_copied_[layer]; c < (batch + chunk - 1) / chunk; ++c) {
    SPARSEKV_RETURN_IF_ERROR(manager_.CopyMissChunk(layer, c, stream));
    ++chunks_copied_[layer];
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
  // The copy stream's work (the chunks of the layer RunLayer stopped in, the planned copies of
  // its group) comes first.
  SPARSEKV_RETURN_IF_ERROR(backend_.RecordEvent(resolved_, copy_stream_));
  SPARSEKV_RETURN_IF_ERROR(backend_.WaitEvent(stream, resolved_));
  if (prefetch_pending_ >= 0) {
    // A prefetch RunLayer resolved and did not copy: copied on `stream`, after its resolve, and
    // before the resolves below (the manager ends no step with a prefetch pending).
    SPARSEKV_RETURN_IF_ERROR(manager_.CopyPrefetch(prefetch_pending_, stream));
    prefetch_pending_ = -1;
  }
  for (; next_layer_ < o.geometry.num_layers(); ++next_layer_) {
    const int32_t layer = next_layer_;
    const bool resolved = o.geometry.offloaded(layer);
    if (stage_ == LayerStage::kNone) {
      if (o.raw_window > 0 || !resolved) {
        const StepRows rows{abort_rows_, abort_keys_, abort_rows_};
        SPARSEKV_RETURN_IF_ERROR(manager_.AppendToken(layer, rows, stream));
      } else {
        SPARSEKV_RETURN_IF_ERROR(manager_.AppendToken(layer, abort_rows_, abort_keys_, stream));
      }
      stage_ = resolved ? LayerStage::kAppended : LayerStage::kCopied;
    }
    if (stage_ == LayerStage::kAppended) {
      if (groups_.Leads(layer)) {
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
