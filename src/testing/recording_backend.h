// RecordingBackend: a backend for tests that forwards every call to a base backend (the CPU
// backend by default), counts the operations enqueued on each stream, and stands in for CUDA graph
// capture on a backend that has none: between BeginCapture and EndCapture every stream reports
// that it is capturing and the enqueued operations (operators, copies, memsets) are recorded
// instead of run; Replay runs a recording again, as a graph launch runs what was captured. Views
// read their scalars and lists from memory at run time, so a replay reads the inputs of the step
// it replays for, exactly as a replayed CUDA graph does.
//
// Streams: the side stream (SideStream) is a handle of its own, so that the counts tell the
// manager's write-back apart from the work on the engine's stream. The base backend (the CPU
// backend) completes each operation when it runs, in the order they were enqueued.
//
// Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sparsekv/backend.h"
#include "testing/forwarding_backend.h"

namespace sparsekv::testing {

class RecordingBackend final : public ForwardingBackend {
 public:
  // What an enqueued operation is.
  enum class Op {
    kIndexCopy,
    kIndexCopyPair,
    kResolve,
    kAssemble,
    kRouteRows,
    kDenseAppend,
    kCopy,    // CopyAsync
    kMemset,  // MemsetAsync
  };
  static constexpr int kOps = 8;
  // Operations enqueued, by kind, on the side stream and on every other stream.
  struct Counts {
    std::array<int64_t, kOps> main{};
    std::array<int64_t, kOps> side{};
    int64_t Main(Op op) const { return main[static_cast<int>(op)]; }
    int64_t Side(Op op) const { return side[static_cast<int>(op)]; }
    int64_t MainTotal() const;
    int64_t SideTotal() const;
  };
  // Operations recorded between BeginCapture and EndCapture, in enqueue order.
  struct Recording {
    std::vector<std::function<Status()>> ops;
    std::vector<Op> kinds;
    std::vector<bool> on_side;
    int64_t Count(Op op, bool side) const;
  };

  explicit RecordingBackend(std::shared_ptr<Backend> base = CreateCpuBackend())
      : ForwardingBackend(std::move(base)) {}

  const Counts& counts() const { return counts_; }
  void ResetCounts() { counts_ = Counts{}; }

  // Starts recording: every stream captures until EndCapture, which returns what was enqueued.
  void BeginCapture();
  Recording EndCapture();
  // Runs a recording's operations in order; the first error stops it.
  static Status Replay(const Recording& recording);

  std::string name() const override { return "recording " + ForwardingBackend::name(); }
  Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle s) override;
  Status MemsetAsync(void* dst, int value, size_t bytes, StreamHandle s) override;
  StreamHandle SideStream() override { return &side_; }
  StatusOr<bool> IsCapturing(StreamHandle) override { return capturing_; }
  Status IndexCopy(const IndexCopyView& v, StreamHandle s) override;
  Status IndexCopyPair(const IndexCopyPairView& v, StreamHandle s) override;
  Status Resolve(const ResolveView& v, int32_t max_batch, StreamHandle s) override;
  Status Assemble(const AssembleView& v, int32_t max_batch, StreamHandle s) override;
  Status RouteRows(const RouteRowsView& v, StreamHandle s) override;
  Status DenseAppend(const DenseAppendView& v, int32_t max_batch, StreamHandle s) override;

 private:
  // Counts `op` on `stream`, then runs it now or records it while capturing. The side stream is
  // passed to the base backend as the null stream.
  Status Enqueue(Op op, StreamHandle stream, std::function<Status(StreamHandle)> run);

  char side_ = 0;  // its address is the side stream's handle
  Counts counts_;
  bool capturing_ = false;
  Recording recording_;
};

}  // namespace sparsekv::testing
