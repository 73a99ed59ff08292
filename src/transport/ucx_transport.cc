// Transport over UCX (UCP one-sided RMA).
//
// One UCP context and one worker (thread mode single); every UCX call runs under mu_, so the
// object is thread-safe. One endpoint per peer worker address, created with peer error handling:
// a peer that dies fails the endpoint, which completes its outstanding operations with an error.
// A transfer whose deadline passes force-closes its peer's endpoint, which cancels what is still
// in flight, so that no late byte lands in the caller's buffer after Wait returned.
//
// Descriptor: "SKVUCX1\0", u64 base, u64 bytes, u32 + worker address, u32 + packed rkey.
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "sparsekv/transport.h"

namespace sparsekv {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'S', 'K', 'V', 'U', 'C', 'X', '1', '\0'};
// How long closing endpoints may take when a peer is abandoned or the transport is destroyed.
constexpr std::chrono::milliseconds kCloseTimeout{1000};
// Elements of UCX's shared-memory FIFOs (UCX's default: 64); 128 B each.
constexpr int kSharedMemoryFifoSize = 8192;
// How long a waiter keeps polling after the last progress before it sleeps on the event fd.
constexpr std::chrono::microseconds kSpin{200};

std::string UcsError(ucs_status_t status) { return ucs_status_string(status); }

void AppendU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void AppendU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

// Reads descriptor fields front to back; any read past the end makes ok() false.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool ok() const { return ok_; }
  uint64_t U64() { return Fixed<uint64_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  std::string_view Bytes(size_t n) {
    if (!ok_ || data_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    std::string_view v = data_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  bool AtEnd() const { return pos_ == data_.size(); }

 private:
  template <typename T>
  T Fixed() {
    std::string_view b = Bytes(sizeof(T));
    T v{};
    if (ok_) std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class UcxTransport;

// One remote worker, reached through one endpoint.
struct Peer {
  std::string address;  // packed worker address
  ucp_ep_h ep = nullptr;
  bool failed = false;  // the endpoint failed or was abandoned; it is (being) closed
  std::string error;
};

struct LocalRegion {
  ucp_mem_h memh = nullptr;
  std::byte* base = nullptr;
  uint64_t bytes = 0;
};

struct ImportedRegion {
  Peer* peer = nullptr;
  ucp_rkey_h rkey = nullptr;
  uint64_t base = 0;
  uint64_t bytes = 0;
};

class UcxTransfer final : public TransferState {
 public:
  UcxTransfer(UcxTransport* transport, Peer* peer, Clock::time_point deadline)
      : transport_(transport), peer_(peer), deadline_(deadline) {}

  Status Wait() override;
  Status WaitFor(std::chrono::milliseconds timeout) override;
  bool Done() override;

  // Called under the transport's mutex.
  void OnComplete(ucs_status_t status) {
    if (status != UCS_OK && status_.ok()) {
      status_ = Unavailable("remote transfer failed: " + UcsError(status));
    }
    --pending_;
  }
  void SetError(Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

 private:
  friend class UcxTransport;
  UcxTransport* transport_;
  Peer* peer_;
  Clock::time_point deadline_;
  int64_t pending_ = 0;  // issued operations not yet completed
  Status status_;        // the first error
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const UcxTransportOptions& options)
      : timeout_(options.operation_timeout), peer_errors_(DetectsPeerFailure(options.transports)) {}
  ~UcxTransport() override;

  Status Init(const UcxTransportOptions& options);

  StatusOr<RegionHandle> RegisterRegion(void* base, uint64_t bytes) override;
  Status UnregisterRegion(const RegionHandle& region) override;
  StatusOr<std::string> ExportRegion(const RegionHandle& region) override;
  StatusOr<RemoteRegion> ImportRegion(std::string_view descriptor) override;
  Status ReleaseRemote(const RemoteRegion& remote) override;
  StatusOr<TransferHandle> Read(const RemoteRegion& remote, const RegionHandle& local,
                                std::span<const CopyRange> ranges) override {
    return Issue(remote, local, ranges, /*write=*/false);
  }
  StatusOr<TransferHandle> Write(const RemoteRegion& remote, const RegionHandle& local,
                                 std::span<const CopyRange> ranges) override {
    return Issue(remote, local, ranges, /*write=*/true);
  }
  int EventFd() override { return efd_; }
  Status Progress() override {
    std::lock_guard<std::mutex> lock(mu_);
    ProgressLocked();
    return Status::Ok();
  }
  Status WaitForEvents(std::chrono::milliseconds timeout) override;

  // Waits for `transfer` until `until`; past the transfer's own deadline it is aborted.
  Status WaitTransfer(UcxTransfer* transfer, Clock::time_point until);
  bool TransferDone(UcxTransfer* transfer) {
    std::lock_guard<std::mutex> lock(mu_);
    return transfer->pending_ == 0;
  }

 private:
  static void OnOpDone(void* request, ucs_status_t status, void* user_data);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  StatusOr<TransferHandle> Issue(const RemoteRegion& remote, const RegionHandle& local,
                                 std::span<const CopyRange> ranges, bool write);
  // All below: REQUIRES mu_ held.
  // Progresses the worker until it has nothing more to do; returns whether it did anything.
  bool ProgressLocked();
  // Closes the endpoints of failed peers.
  void CloseFailedLocked();
  void AbandonPeerLocked(Peer* peer, const std::string& reason);
  // Force-closes `ep` and progresses until the close completes or kCloseTimeout passes.
  void CloseEndpointLocked(ucp_ep_h ep);
  // Arms the worker's event fd for the next event; false if events are already pending (progress
  // first). True also when arming failed: the caller's poll of the fd is bounded by its timeout.
  bool ArmLocked();

  // UCX 1.13's shared-memory transports cannot report a peer's failure, and UCX refuses to
  // connect over them with peer error handling: over them, only deadlines detect a dead peer.
  static bool DetectsPeerFailure(const std::string& transports);

  std::chrono::milliseconds timeout_;
  bool peer_errors_;  // endpoints use UCP_ERR_HANDLING_MODE_PEER
  std::mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  uint64_t next_id_ = 1;
  std::map<uint64_t, LocalRegion> locals_;
  std::map<uint64_t, ImportedRegion> remotes_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // Transfers with operations in flight, kept alive until their last completion callback.
  std::unordered_set<std::shared_ptr<UcxTransfer>> in_flight_;
};

Status UcxTransfer::Wait() { return transport_->WaitTransfer(this, deadline_); }

Status UcxTransfer::WaitFor(std::chrono::milliseconds timeout) {
  return transport_->WaitTransfer(this, std::min(deadline_, Clock::now() + timeout));
}

bool UcxTransfer::Done() { return transport_->TransferDone(this); }

// The comma-separated names of a UCX transport list.
std::vector<std::string_view> TransportNames(std::string_view transports) {
  std::vector<std::string_view> names;
  size_t start = 0;
  while (start <= transports.size()) {
    size_t end = transports.find(',', start);
    if (end == std::string_view::npos) end = transports.size();
    names.push_back(transports.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

bool IsSharedMemory(std::string_view name) {
  static constexpr std::string_view kSharedMemory[] = {"shm", "sm",   "posix", "sysv",
                                                       "cma", "knem", "xpmem", "self"};
  return std::find(std::begin(kSharedMemory), std::end(kSharedMemory), name) !=
         std::end(kSharedMemory);
}

// The TLS setting for `transports`. A list of shared-memory transports only connects without peer
// error handling (DetectsPeerFailure), and there UCX 1.13 aborts the whole process when a CMA
// read finds its peer dead (process_vm_readv fails, no error callback). So in such a list the
// aliases "shm" and "sm" stand for the mapped-memory transports alone, "posix,sysv", whose
// transfers a dead peer leaves to time out; "cma" named explicitly is kept.
std::string EffectiveTransports(const std::string& transports) {
  const std::vector<std::string_view> names = TransportNames(transports);
  if (transports.empty() || !std::all_of(names.begin(), names.end(), IsSharedMemory)) {
    return transports;
  }
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ',';
    out += name == "shm" || name == "sm" ? std::string_view("posix,sysv") : name;
  }
  return out;
}

bool UsesSharedMemory(const std::string& transports) {
  if (transports.empty()) return true;
  for (std::string_view name : TransportNames(transports)) {
    if (name == "shm" || name == "sm" || name == "posix" || name == "sysv") return true;
  }
  return false;
}

bool UcxTransport::DetectsPeerFailure(const std::string& transports) {
  if (transports.empty()) return true;
  for (std::string_view name : TransportNames(transports)) {
    if (!IsSharedMemory(name)) return true;
  }
  return false;
}

Status UcxTransport::Init(const UcxTransportOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Unavailable("UCX: cannot read its configuration: " + UcsError(st));
  std::vector<std::pair<std::string, std::string>> settings;
  if (UsesSharedMemory(options.transports)) {
    // A shared-memory FIFO that fills up stalls its sender until the receiver's next wakeup
    // (draining a FIFO raises no event): make room for a whole batch of operations.
    settings.emplace_back("MM_FIFO_SIZE", std::to_string(kSharedMemoryFifoSize));
  }
  if (!options.transports.empty()) {
    settings.emplace_back("TLS", EffectiveTransports(options.transports));
  }
  if (!options.net_devices.empty()) settings.emplace_back("NET_DEVICES", options.net_devices);
  settings.insert(settings.end(), options.ucx_config.begin(), options.ucx_config.end());
  for (const auto& [name, value] : settings) {
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return InvalidArgument("UCX setting " + name + "=" + value + ": " + UcsError(st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return Unavailable("UCX: ucp_init failed: " + UcsError(st));

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // mu_ serialises every call
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return Unavailable("UCX: cannot create a worker: " + UcsError(st));
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return Unavailable("UCX: worker has no event fd: " + UcsError(st));
  return Status::Ok();
}

UcxTransport::~UcxTransport() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, remote] : remotes_) ucp_rkey_destroy(remote.rkey);
  remotes_.clear();
  for (auto& peer : peers_) {
    if (peer->ep != nullptr) CloseEndpointLocked(peer->ep);
    peer->ep = nullptr;
  }
  for (auto& [id, local] : locals_) ucp_mem_unmap(context_, local.memh);
  locals_.clear();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

StatusOr<RegionHandle> UcxTransport::RegisterRegion(void* base, uint64_t bytes) {
  if (base == nullptr || bytes == 0) {
    return InvalidArgument("RegisterRegion: base must not be null and bytes must be positive");
  }
  std::lock_guard<std::mutex> lock(mu_);
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = bytes;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &params, &memh);
  if (st != UCS_OK) return Unavailable("UCX: cannot register memory: " + UcsError(st));
  const uint64_t id = next_id_++;
  locals_[id] = LocalRegion{memh, static_cast<std::byte*>(base), bytes};
  return RegionHandle{id, static_cast<std::byte*>(base), bytes};
}

Status UcxTransport::UnregisterRegion(const RegionHandle& region) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = locals_.find(region.id);
  if (it == locals_.end()) return NotFound("UnregisterRegion: unknown region");
  ucp_mem_unmap(context_, it->second.memh);
  locals_.erase(it);
  return Status::Ok();
}

StatusOr<std::string> UcxTransport::ExportRegion(const RegionHandle& region) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = locals_.find(region.id);
  if (it == locals_.end()) return NotFound("ExportRegion: unknown region");
  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  ucs_status_t st = ucp_worker_get_address(worker_, &address, &address_len);
  if (st != UCS_OK) return Internal("UCX: cannot get the worker address: " + UcsError(st));
  void* rkey = nullptr;
  size_t rkey_len = 0;
  st = ucp_rkey_pack(context_, it->second.memh, &rkey, &rkey_len);
  if (st != UCS_OK) {
    ucp_worker_release_address(worker_, address);
    return Internal("UCX: cannot pack the remote key: " + UcsError(st));
  }
  std::string out(kMagic, sizeof(kMagic));
  AppendU64(out, reinterpret_cast<uint64_t>(it->second.base));
  AppendU64(out, it->second.bytes);
  AppendU32(out, static_cast<uint32_t>(address_len));
  out.append(reinterpret_cast<const char*>(address), address_len);
  AppendU32(out, static_cast<uint32_t>(rkey_len));
  out.append(static_cast<const char*>(rkey), rkey_len);
  ucp_rkey_buffer_release(rkey);
  ucp_worker_release_address(worker_, address);
  return out;
}

StatusOr<RemoteRegion> UcxTransport::ImportRegion(std::string_view descriptor) {
  Reader reader(descriptor);
  const std::string_view magic = reader.Bytes(sizeof(kMagic));
  const uint64_t base = reader.U64();
  const uint64_t bytes = reader.U64();
  const std::string_view address = reader.Bytes(reader.U32());
  const std::string_view rkey_buffer = reader.Bytes(reader.U32());
  if (!reader.ok() || !reader.AtEnd() || magic != std::string_view(kMagic, sizeof(kMagic)) ||
      address.empty() || rkey_buffer.empty() || bytes == 0) {
    return InvalidArgument("ImportRegion: not a UCX region descriptor");
  }
  std::lock_guard<std::mutex> lock(mu_);
  CloseFailedLocked();
  Peer* peer = nullptr;
  for (auto& p : peers_) {
    if (!p->failed && p->address == address) peer = p.get();
  }
  if (peer == nullptr) {
    auto fresh = std::make_unique<Peer>();
    fresh->address = std::string(address);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(fresh->address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    if (peer_errors_) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      params.err_handler.cb = &UcxTransport::OnPeerError;
      params.err_handler.arg = fresh.get();
    }
    ucs_status_t st = ucp_ep_create(worker_, &params, &fresh->ep);
    if (st != UCS_OK) return Unavailable("UCX: cannot connect to the peer: " + UcsError(st));
    peer = fresh.get();
    peers_.push_back(std::move(fresh));
  }
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, rkey_buffer.data(), &rkey);
  if (st != UCS_OK) return InvalidArgument("UCX: cannot unpack the remote key: " + UcsError(st));
  const uint64_t id = next_id_++;
  remotes_[id] = ImportedRegion{peer, rkey, base, bytes};
  return RemoteRegion{id, bytes};
}

Status UcxTransport::ReleaseRemote(const RemoteRegion& remote) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = remotes_.find(remote.id);
  if (it == remotes_.end()) return NotFound("ReleaseRemote: unknown remote region");
  ucp_rkey_destroy(it->second.rkey);
  remotes_.erase(it);
  return Status::Ok();
}

void UcxTransport::OnOpDone(void* request, ucs_status_t status, void* user_data) {
  static_cast<UcxTransfer*>(user_data)->OnComplete(status);
  ucp_request_free(request);
}

void UcxTransport::OnPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
  Peer* peer = static_cast<Peer*>(arg);
  if (!peer->failed) {
    peer->failed = true;
    peer->error = "connection to the peer failed: " + UcsError(status);
  }
}

StatusOr<TransferHandle> UcxTransport::Issue(const RemoteRegion& remote, const RegionHandle& local,
                                             std::span<const CopyRange> ranges, bool write) {
  std::lock_guard<std::mutex> lock(mu_);
  auto rit = remotes_.find(remote.id);
  if (rit == remotes_.end()) return NotFound("transfer: unknown remote region");
  auto lit = locals_.find(local.id);
  if (lit == locals_.end()) return NotFound("transfer: unknown local region");
  const ImportedRegion& r = rit->second;
  const LocalRegion& l = lit->second;
  for (const CopyRange& c : ranges) {
    if (c.length > r.bytes || c.remote_offset > r.bytes - c.length || c.length > l.bytes ||
        c.local_offset > l.bytes - c.length) {
      return OutOfRange("transfer: range [" + std::to_string(c.remote_offset) + ", +" +
                        std::to_string(c.length) + ") -> " + std::to_string(c.local_offset) +
                        " does not fit the regions");
    }
  }
  CloseFailedLocked();
  if (r.peer->failed) return Unavailable(r.peer->error + " (import the region again)");

  auto transfer = std::make_shared<UcxTransfer>(this, r.peer, Clock::now() + timeout_);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  param.cb.send = &UcxTransport::OnOpDone;
  param.user_data = transfer.get();
  param.memh = l.memh;
  auto track = [&](ucs_status_ptr_t request) {
    if (request == nullptr) return true;
    if (UCS_PTR_IS_ERR(request)) {
      transfer->SetError(
          Unavailable("remote transfer failed to start: " + UcsError(UCS_PTR_STATUS(request))));
      return false;
    }
    ++transfer->pending_;
    return true;
  };
  for (const CopyRange& c : ranges) {
    if (c.length == 0) continue;
    void* buffer = l.base + c.local_offset;
    const uint64_t address = r.base + c.remote_offset;
    ucs_status_ptr_t request =
        write ? ucp_put_nbx(r.peer->ep, buffer, c.length, address, r.rkey, &param)
              : ucp_get_nbx(r.peer->ep, buffer, c.length, address, r.rkey, &param);
    if (!track(request)) break;
  }
  if (write && transfer->status_.ok() && !ranges.empty()) {
    // A put completes locally once its buffer may be reused; the flush completes once every put
    // is visible in the remote memory.
    ucp_request_param_t flush{};
    flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    flush.cb.send = &UcxTransport::OnOpDone;
    flush.user_data = transfer.get();
    track(ucp_ep_flush_nbx(r.peer->ep, &flush));
  }
  if (transfer->pending_ > 0) in_flight_.insert(transfer);
  return TransferHandle(transfer);
}

bool UcxTransport::ProgressLocked() {
  bool any = false;
  while (ucp_worker_progress(worker_) != 0) any = true;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    it = (*it)->pending_ == 0 ? in_flight_.erase(it) : std::next(it);
  }
  CloseFailedLocked();
  return any;
}

void UcxTransport::CloseFailedLocked() {
  for (auto& peer : peers_) {
    if (peer->failed && peer->ep != nullptr) {
      ucp_ep_h ep = peer->ep;
      peer->ep = nullptr;
      CloseEndpointLocked(ep);
    }
  }
}

void UcxTransport::AbandonPeerLocked(Peer* peer, const std::string& reason) {
  if (!peer->failed) {
    peer->failed = true;
    peer->error = reason;
  }
  CloseFailedLocked();
}

void UcxTransport::CloseEndpointLocked(ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  const Clock::time_point until = Clock::now() + kCloseTimeout;
  while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < until) {
    ucp_worker_progress(worker_);
  }
  ucp_request_free(request);
}

bool UcxTransport::ArmLocked() {
  // UCS_ERR_BUSY: events are pending, progress first. Any other failure (a worker whose
  // interfaces cannot be armed any more, e.g. after a peer's shared-memory segment went away)
  // must not make the callers spin: they then wait on the event fd for their timeout anyway.
  return ucp_worker_arm(worker_) != UCS_ERR_BUSY;
}

Status UcxTransport::WaitTransfer(UcxTransfer* transfer, Clock::time_point until) {
  Clock::time_point last_progress = Clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (transfer->pending_ == 0) return transfer->status_;
      if (ProgressLocked()) {
        last_progress = Clock::now();
        continue;
      }
      if (transfer->pending_ == 0) return transfer->status_;
      const Clock::time_point now = Clock::now();
      if (now >= transfer->deadline_) {
        const std::string what =
            "remote transfer did not complete within " + std::to_string(timeout_.count()) + " ms";
        transfer->SetError(DeadlineExceeded(what));
        AbandonPeerLocked(transfer->peer_, what + "; the connection to the peer was closed");
        const Clock::time_point drain_until = Clock::now() + kCloseTimeout;
        while (transfer->pending_ > 0 && Clock::now() < drain_until) ProgressLocked();
        return transfer->status_;
      }
      if (now >= until) return DeadlineExceeded("remote transfer still in flight");
      // Some progress does not raise an event here (e.g. the peer freeing room in a full
      // shared-memory FIFO): poll briefly before sleeping on the event fd.
      if (now - last_progress < kSpin || !ArmLocked()) {
        std::this_thread::yield();
        continue;
      }
    }
    const auto remaining =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count() + 1;
    // The cap bounds the wait when another thread consumed the wakeup.
    pollfd fd{efd_, POLLIN, 0};
    poll(&fd, 1, static_cast<int>(std::clamp<int64_t>(remaining, 0, 10)));
  }
}

Status UcxTransport::WaitForEvents(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ProgressLocked() || !ArmLocked()) {
      ProgressLocked();
      return Status::Ok();
    }
  }
  pollfd fd{efd_, POLLIN, 0};
  poll(&fd, 1, static_cast<int>(timeout.count()));
  std::lock_guard<std::mutex> lock(mu_);
  ProgressLocked();
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxTransportOptions& options) {
  if (options.operation_timeout.count() <= 0) {
    return InvalidArgument("UcxTransportOptions: operation_timeout must be positive");
  }
  auto transport = std::make_unique<UcxTransport>(options);
  SPARSEKV_RETURN_IF_ERROR(transport->Init(options));
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace sparsekv
