#include "testing/recording_backend.h"

#include <numeric>
#include <utility>

namespace sparsekv::testing {

int64_t RecordingBackend::Counts::MainTotal() const {
  return std::accumulate(main.begin(), main.end(), int64_t{0});
}

int64_t RecordingBackend::Counts::SideTotal() const {
  return std::accumulate(side.begin(), side.end(), int64_t{0});
}

int64_t RecordingBackend::Recording::Count(Op op, bool side) const {
  int64_t n = 0;
  for (size_t i = 0; i < kinds.size(); ++i) n += kinds[i] == op && on_side[i] == side;
  return n;
}

void RecordingBackend::BeginCapture() {
  capturing_ = true;
  recording_ = Recording{};
}

RecordingBackend::Recording RecordingBackend::EndCapture() {
  capturing_ = false;
  return std::exchange(recording_, Recording{});
}

Status RecordingBackend::Replay(const Recording& recording) {
  for (const std::function<Status()>& op : recording.ops) SPARSEKV_RETURN_IF_ERROR(op());
  return Status::Ok();
}

Status RecordingBackend::Enqueue(Op op, StreamHandle stream,
                                 std::function<Status(StreamHandle)> run) {
  const bool side = stream == &side_;
  (side ? counts_.side : counts_.main)[static_cast<int>(op)]++;
  const StreamHandle base_stream = side ? nullptr : stream;
  if (!capturing_) return run(base_stream);
  recording_.ops.push_back([run = std::move(run), base_stream] { return run(base_stream); });
  recording_.kinds.push_back(op);
  recording_.on_side.push_back(side);
  return Status::Ok();
}

Status RecordingBackend::CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle s) {
  return Enqueue(Op::kCopy, s, [this, dst, src, bytes](StreamHandle b) {
    return base().CopyAsync(dst, src, bytes, b);
  });
}

Status RecordingBackend::MemsetAsync(void* dst, int value, size_t bytes, StreamHandle s) {
  return Enqueue(Op::kMemset, s, [this, dst, value, bytes](StreamHandle b) {
    return base().MemsetAsync(dst, value, bytes, b);
  });
}

Status RecordingBackend::IndexCopy(const IndexCopyView& v, StreamHandle s) {
  return Enqueue(Op::kIndexCopy, s, [this, v](StreamHandle b) { return base().IndexCopy(v, b); });
}

Status RecordingBackend::IndexCopyPair(const IndexCopyPairView& v, StreamHandle s) {
  return Enqueue(Op::kIndexCopyPair, s,
                 [this, v](StreamHandle b) { return base().IndexCopyPair(v, b); });
}

Status RecordingBackend::Resolve(const ResolveView& v, int32_t max_batch, StreamHandle s) {
  return Enqueue(Op::kResolve, s,
                 [this, v, max_batch](StreamHandle b) { return base().Resolve(v, max_batch, b); });
}

Status RecordingBackend::Assemble(const AssembleView& v, int32_t max_batch, StreamHandle s) {
  return Enqueue(Op::kAssemble, s,
                 [this, v, max_batch](StreamHandle b) { return base().Assemble(v, max_batch, b); });
}

Status RecordingBackend::RouteRows(const RouteRowsView& v, StreamHandle s) {
  return Enqueue(Op::kRouteRows, s, [this, v](StreamHandle b) { return base().RouteRows(v, b); });
}

Status RecordingBackend::DenseAppend(const DenseAppendView& v, int32_t max_batch, StreamHandle s) {
  return Enqueue(Op::kDenseAppend, s, [this, v, max_batch](StreamHandle b) {
    return base().DenseAppend(v, max_batch, b);
  });
}

}  // namespace sparsekv::testing
