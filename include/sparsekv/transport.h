// Transport: one-sided reads and writes of byte ranges between registered memory regions of
// different processes (or machines). The remote tier moves KV rows with it; a pool server exports
// its memory through it.
//
// Model. A Transport owns one communication endpoint of this process (for UCX: one UCP context and
// one worker). Local memory is registered (RegisterRegion) and exported as an opaque descriptor
// (ExportRegion), which travels out of band (the control plane). A peer imports the descriptor
// (ImportRegion) and then reads from / writes to the region with batched one-sided operations:
// the owner of the region takes no part in a transfer beyond progressing its transport
// (Progress / WaitForEvents; see "Progress" below).
//
// Errors. A dead or unreachable peer never hangs or crashes a caller: every transfer has a
// deadline (UcxTransportOptions::operation_timeout) and fails with Unavailable (the peer closed
// or reset the connection) or DeadlineExceeded (no answer in time). After such a failure the
// connection to that peer is closed; the RemoteRegions imported through it fail with Unavailable
// until the descriptor is imported again (e.g. from a restarted peer).
//
// Thread safety: every method of Transport and TransferHandle may be called from any thread;
// calls are serialised internally. Lifetime: a Transport must outlive its TransferHandles.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv {

// One contiguous transfer: `length` bytes between `remote_offset` in the remote region and
// `local_offset` in the local region (offsets are from the regions' bases).
struct CopyRange {
  uint64_t remote_offset = 0;
  uint64_t local_offset = 0;
  uint64_t length = 0;

  friend bool operator==(const CopyRange&, const CopyRange&) = default;
};

// Sorts `ranges` by remote offset and merges each run of ranges that is contiguous both remotely
// and locally into one range (fewer, larger operations). Returns the merged list; the bytes it
// moves are those of the input. Overlapping ranges are not merged.
std::vector<CopyRange> MergeAdjacentRanges(std::span<const CopyRange> ranges);

// A region of this process's memory registered with a Transport. A small value; id 0 = none.
// Valid until Transport::UnregisterRegion or the Transport's destruction.
struct RegionHandle {
  uint64_t id = 0;
  std::byte* base = nullptr;
  uint64_t bytes = 0;

  bool valid() const { return id != 0; }
};

// A region of another process imported into a Transport. A small value; id 0 = none.
// Valid until Transport::ReleaseRemote or the Transport's destruction.
struct RemoteRegion {
  uint64_t id = 0;
  uint64_t bytes = 0;

  bool valid() const { return id != 0; }
};

// The state of one batched transfer, shared between a TransferHandle and the transport that runs
// it. Implemented by each transport backend; callers use TransferHandle.
class TransferState {
 public:
  virtual ~TransferState() = default;
  // See TransferHandle.
  virtual Status WaitFor(std::chrono::milliseconds timeout) = 0;
  virtual Status Wait() = 0;
  virtual bool Done() = 0;
};

// A batched transfer in flight, or completed. Movable, not copyable.
//
// Buffer lifetime: the local region's bytes named by the transfer's ranges (and, for a write, the
// remote ones) must stay valid and must not be touched by the caller until the transfer has
// finished: Wait returned, WaitFor returned anything other than DeadlineExceeded, or the handle
// was destroyed (destroying an unfinished handle waits as Wait does). After a failed read the
// local bytes of its ranges are unspecified and must not be used.
class TransferHandle {
 public:
  TransferHandle() = default;
  explicit TransferHandle(std::shared_ptr<TransferState> state) : state_(std::move(state)) {}
  TransferHandle(TransferHandle&&) = default;
  TransferHandle& operator=(TransferHandle&& other) {
    if (this != &other) {
      Finish();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~TransferHandle() { Finish(); }

  // Waits until the transfer completes or its deadline (set when it was issued) passes.
  // OK when every range was transferred; Unavailable if the peer failed; DeadlineExceeded if the
  // deadline passed, in which case the transfer is aborted (and the peer's connection closed)
  // before Wait returns. Either way the transfer has finished when Wait returns.
  // A handle without a transfer returns OK.
  Status Wait() { return state_ ? state_->Wait() : Status::Ok(); }
  // Waits at most `timeout` (and never past the transfer's deadline). DeadlineExceeded if the
  // transfer is still in flight: it goes on, and WaitFor or Wait may be called again.
  Status WaitFor(std::chrono::milliseconds timeout) {
    return state_ ? state_->WaitFor(timeout) : Status::Ok();
  }
  // True once the transfer has finished (successfully or not); does not progress it.
  bool Done() { return !state_ || state_->Done(); }

 private:
  void Finish() {
    if (state_) state_->Wait().IgnoreError();
    state_.reset();
  }
  std::shared_ptr<TransferState> state_;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Registers [base, base + bytes) for transfers. The memory stays owned by the caller and must
  // outlive the registration. InvalidArgument if base is null or bytes is 0.
  virtual StatusOr<RegionHandle> RegisterRegion(void* base, uint64_t bytes) = 0;
  // NotFound for an unknown handle. REQUIRES (not checked: in-flight transfers and peers' imports
  // are not tracked): no transfer that uses the region is in flight, and every exported
  // descriptor of it is no longer imported by peers that will still read it (the control plane's
  // protocol ensures this).
  virtual Status UnregisterRegion(const RegionHandle& region) = 0;

  // An opaque descriptor of a registered region: how to reach this transport (e.g. the UCP
  // worker address), the remote key, base and size. Binary (may contain NUL bytes): store it as
  // bytes. Valid as long as the region is registered and this Transport lives.
  virtual StatusOr<std::string> ExportRegion(const RegionHandle& region) = 0;
  // Connects to the descriptor's peer (reusing an open connection to the same peer) and unpacks
  // its key. InvalidArgument for a malformed descriptor. Importing does not contact the peer:
  // an unreachable peer shows up as an error of the first transfer.
  virtual StatusOr<RemoteRegion> ImportRegion(std::string_view descriptor) = 0;
  // Forgets an imported region. REQUIRES (not checked: in-flight transfers are not tracked): no
  // transfer that uses it is in flight.
  virtual Status ReleaseRemote(const RemoteRegion& remote) = 0;

  // Copies each range from `remote` to `local` (Read) or from `local` to `remote` (Write).
  // The operations are issued before these return; completion is observed through the handle.
  // OutOfRange if a range does not fit in either region; Unavailable if the connection to the
  // remote region's peer has failed (import the descriptor again). An empty list completes
  // at once. Ranges may be issued in any order and must not overlap locally.
  virtual StatusOr<TransferHandle> Read(const RemoteRegion& remote, const RegionHandle& local,
                                        std::span<const CopyRange> ranges) = 0;
  virtual StatusOr<TransferHandle> Write(const RemoteRegion& remote, const RegionHandle& local,
                                         std::span<const CopyRange> ranges) = 0;

  // Progress. A process whose regions others access (a pool server) must progress its transport,
  // because some transports (UCX over TCP) serve one-sided operations in software. Waiting on a
  // TransferHandle progresses the transport too. For wakeup mode, not busy polling:
  //   for (;;) { WaitForEvents(timeout); }   // or poll EventFd() yourself, then call Progress()
  // EventFd becomes readable when there may be work for Progress.
  virtual int EventFd() = 0;
  // Runs everything that is pending without blocking.
  virtual Status Progress() = 0;
  // Progresses, then blocks until there may be new work or `timeout` passed, then progresses
  // again. OK in both cases.
  virtual Status WaitForEvents(std::chrono::milliseconds timeout) = 0;
};

struct UcxTransportOptions {
  // ---- behaviour ----
  // UCX transports to use (the UCX "TLS" setting), e.g. "tcp", "shm", "tcp,shm"; empty = UCX's
  // default choice. Passed to UCX as configuration: the library reads no environment variable
  // (UCX itself still honours UCX_* variables for settings not given here).
  // A list of shared-memory transports only ("shm", "posix", "sysv", "cma", ...) connects
  // without UCX peer-failure detection (UCX 1.13 cannot detect a dead peer over them): there a
  // dead peer shows up as DeadlineExceeded at the transfer's deadline instead of Unavailable.
  // In such a list "shm" and "sm" mean "posix,sysv": without error handling, UCX 1.13 aborts the
  // process when a CMA read finds its peer dead, so CMA is used only where named explicitly.
  std::string transports;
  // Network devices for UCX (the "NET_DEVICES" setting), e.g. "lo"; empty = UCX's default.
  std::string net_devices;
  // The deadline of every transfer, from the moment it is issued.
  std::chrono::milliseconds operation_timeout{5000};
  // Further UCX settings as (name without the UCX_ prefix, value), applied after the above.
  std::vector<std::pair<std::string, std::string>> ucx_config;
};

// A Transport over UCX (UCP one-sided RMA), in wakeup mode. Unavailable if UCX cannot be
// initialised with the given options (e.g. a transport name that does not exist).
StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxTransportOptions& options);

}  // namespace sparsekv
