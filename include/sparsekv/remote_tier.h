// RemoteTier: prompt KV rows that live in another process's (or machine's) memory, read row by row
// over a Transport when a decode step misses on them.
//
// Global addressing. Every host row has a global address (node, region, offset): node 0 is this
// process's host pool (region = layer, offset = host row * row stride); node n > 0 is the n-th
// remote node the tier knows, region a region imported from it, offset a byte offset in it.
//
// A remote-backed request (AdmitRemote, below) has its prompt in a remote region,
// laid out as RemotePromptLayout says. Its prompt is not copied at admission and takes no local
// host memory: the page-table entries of its prompt pages that lie wholly before the window point
// at one shared placeholder page (its "remote pages"); its other pages (the window's, and those of
// the tokens it generates) are private host pages. On a miss:
//   - a row of a remote page is read from the remote region into a pinned staging area, and a
//     second IndexCopy (staging -> hot cache) brings it in; it stays remote (a later miss reads
//     it again);
//   - a prompt row of a private page is read into its own host row the first time, then copied by
//     the ordinary IndexCopy; later misses on it are local (the window's rows are read so at
//     admission);
//   - every other row is local: the direct path, unchanged.
// Per layer and step, the rows one request misses are read with one batched transfer, runs of
// adjacent rows merged into one read (MergeAdjacentRanges); the transfers of all requests of the
// step are in flight together.
//
// Failure. A read that fails (peer dead or unreachable, deadline passed) fails the request: its
// status (RemoteStatus, below) becomes the error, its slots in this and every
// later step are -1 (skipped), and none of its misses is copied again, so no stale or partial row
// is ever delivered for it; the engine releases it (and may recompute it). Other requests of the
// batch, local or remote on other nodes, go on.
//
// Thread safety: not thread-safe; the manager it is attached to serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/status.h"
#include "sparsekv/transport.h"
#include "sparsekv/types.h"

namespace sparsekv {

class SparseKVCacheManager;

// Where a request's prompt rows are inside a remote region: the row of (layer, position) is
// row_bytes long at byte offset base_offset + layer * layer_stride + position * row_stride,
// for layer < layers and position < tokens (the fields of ControlPlane's RequestLocation).
struct RemotePromptLayout {
  uint64_t base_offset = 0;
  uint64_t layer_stride = 0;
  uint64_t row_stride = 0;
  int32_t row_bytes = 0;
  int32_t layers = 0;
  int32_t tokens = 0;  // the prompt length

  uint64_t RowOffset(int32_t layer, int32_t position) const {
    return base_offset + static_cast<uint64_t>(layer) * layer_stride +
           static_cast<uint64_t>(position) * row_stride;
  }
  // The dense layout of a region holding just this prompt: layer-major, rows back to back.
  static RemotePromptLayout Dense(int32_t layers, int32_t tokens, int32_t row_bytes);
  // One past the last byte any row occupies (0 for an empty layout).
  uint64_t ExtentBytes() const;
};

struct GlobalRowAddress {
  static constexpr uint32_t kLocalNode = 0;
  uint32_t node = kLocalNode;
  uint32_t region = 0;  // local: the layer; remote: the tier's region id
  uint64_t offset = 0;  // bytes from the region's base

  friend bool operator==(const GlobalRowAddress&, const GlobalRowAddress&) = default;
};

// Counters since creation.
struct RemoteTierStats {
  uint64_t rows_fetched = 0;   // remote rows read (into host rows or the staging area)
  uint64_t rows_staged = 0;    // of those, read into the staging area (rows of remote pages)
  uint64_t bytes_fetched = 0;  // rows_fetched * row bytes
  uint64_t reads = 0;          // one-sided reads issued, after merging adjacent rows
  uint64_t transfers = 0;      // batched transfers (one per request, layer and step with misses)
  uint64_t failed_requests = 0;
};

class RemoteTier {
 public:
  // `transport` must outlive the tier and every manager it is attached to.
  static StatusOr<std::unique_ptr<RemoteTier>> Create(Transport* transport);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Imports a region of node `node_id` from its descriptor (Transport::ExportRegion, e.g. from
  // the control plane) and returns its id in the tier. Importing the same descriptor again returns
  // the same id; a new descriptor of the same node (a restarted node) is a new region.
  // Errors as Transport::ImportRegion.
  StatusOr<uint32_t> ImportRegion(const std::string& node_id, std::string_view descriptor);
  // Forgets a region. FailedPrecondition while a request is bound to it; NotFound if unknown.
  Status ReleaseRegion(uint32_t region);

  // Writes the prompt rows of one layer ([layout.tokens, row_bytes] at `rows`, host memory) into
  // remote region `region` at the layout's offsets and waits: how a prefill instance fills a pool
  // server's memory. Errors as Transport::Write and Wait; OutOfRange if the layout does not fit.
  Status WritePromptLayer(uint32_t region, const RemotePromptLayout& layout, int32_t layer,
                          const void* rows);

  // The global address of (layer, position) of a remote-backed request: its remote row for a
  // prompt position, node 0 otherwise (`host_row` is the request's local host row of that
  // position). NotFound if the request is not bound.
  StatusOr<GlobalRowAddress> Locate(RequestId id, int32_t layer, int32_t position,
                                    int32_t host_row) const;
  // The node name of a node index (node 0: ""); NotFound if unknown.
  StatusOr<std::string> NodeName(uint32_t node) const;

  RemoteTierStats stats() const { return stats_; }
  Transport& transport() { return *transport_; }

  // ---- Used by the manager extension (AttachRemoteTier) ----

  // Registers the host pool's layers ([rows, row_stride] at layer_bases[l]) and the staging area
  // ([staging_rows, staging_stride] at `staging`) for remote reads. Once per tier, until
  // DetachPool. `row_bytes` is the bytes of a row to read.
  Status AttachPool(std::span<std::byte* const> layer_bases, std::span<const int32_t> row_strides,
                    std::span<const int32_t> row_bytes, int32_t rows, int32_t page_tokens,
                    std::byte* staging, int32_t staging_rows, int32_t staging_stride);
  // Unregisters what AttachPool registered. REQUIRES (not checked: the destructors call it, with
  // or without bound requests, to release the registrations): no request is bound.
  void DetachPool();
  // Binds request `id` to its prompt in `region`. `pages` is its page table in position order:
  // [0, remote_pages) are remote pages (placeholders), the others its own host pages, which must
  // stay its own (never shared) while it is bound.
  Status Bind(RequestId id, uint32_t region, const RemotePromptLayout& layout,
              std::span<const int32_t> pages, int32_t remote_pages);
  void Unbind(RequestId id);
  bool IsBound(RequestId id) const { return requests_.contains(id); }
  bool HasBoundRequests() const { return !requests_.empty(); }
  // OK, or the error that failed a bound request. NotFound if not bound.
  Status RequestStatus(RequestId id) const;
  bool Failed(RequestId id) const;

  // One missed row of a bound request.
  struct RowFetch {
    RequestId id = 0;
    int32_t position = 0;
    int32_t host_row = -1;     // destination: the request's own host row, or -1 for ...
    int32_t staging_row = -1;  // ... this row of the staging area
    bool ok = false;           // out: the row is at its destination
  };
  // The bound request and position whose own (private) host page holds `host_row`, if any.
  bool OwnerOfHostRow(int32_t host_row, RequestId* id, int32_t* position) const;
  // Brings each row to its destination: reads remote prompt rows (host-row destinations only if
  // not read before), all requests' transfers in flight together, and waits. Rows of requests
  // that are failed, before or by this call, get ok = false. Returns OK even if requests failed
  // (see RequestStatus); an error only for misuse.
  Status FetchRows(int32_t layer, std::span<RowFetch> rows);
  // Reads the rows of positions [first, last) of `layer` of request `id` (those still remote)
  // and waits; the request's error if it fails.
  Status FetchPositions(RequestId id, int32_t layer, int32_t first, int32_t last);

 private:
  struct Region {
    uint32_t node = 0;
    std::string descriptor;
    RemoteRegion remote;
    int32_t bound_requests = 0;
  };
  struct Bound {
    uint32_t region = 0;
    RemotePromptLayout layout;
    std::vector<int32_t> pages;            // own host pages, of page indices [first_page, ...)
    int32_t first_page = 0;                // pages before are remote pages
    std::vector<std::vector<bool>> local;  // [layer][position]: the row is in its host row
    Status status;
  };
  // One request's rows to read in one layer.
  struct Pending {
    RequestId id;
    bool to_staging;
    std::vector<CopyRange> ranges;
    std::vector<RowFetch*> rows;
  };

  explicit RemoteTier(Transport* transport) : transport_(transport) {}
  // Issues every pending read of `layer`, waits for all, marks rows local or requests failed.
  void ReadAll(int32_t layer, std::vector<Pending>& pending);
  void Fail(RequestId id, Bound& b, const Status& error);

  Transport* transport_;
  std::vector<std::string> nodes_ = {""};  // index 0: this process
  std::map<uint32_t, Region> regions_;
  uint32_t next_region_ = 1;
  std::unordered_map<RequestId, Bound> requests_;
  // host page -> (request, index of the page in the request's table), for bound requests.
  std::unordered_map<int32_t, std::pair<RequestId, int32_t>> page_owner_;
  std::vector<RegionHandle> layer_regions_;
  RegionHandle staging_;
  uint64_t staging_stride_ = 0;
  std::vector<int32_t> row_strides_;
  std::vector<int32_t> row_bytes_;
  int32_t page_tokens_ = 0;
  RemoteTierStats stats_;
};

// ---- A manager's remote tier (the manager extension of src/remote/remote_row_source.h) ----
//
// A remote-backed request's prompt rows stay in a remote region; the prompt pages wholly before
// its window take no host memory here (their page-table entries point at one placeholder page).
// Rows are read, row by row, when a resolve misses on them: CopyMisses (and RunLayer,
// PrefetchLayer) then waits for the host (synchronises `stream`, reads the miss list, reads the
// remote rows into a staging area or their host rows) before its copies. A step whose batch
// holds no remote-backed request is unchanged (and graph-capturable); one that does must run
// eagerly. A failed request's slots are -1 from the failure on (its ResolveLayer slots after
// the CopyMisses that failed it, for the split API). Fork refuses a remote-backed parent.

// Attaches `tier` (which must outlive the manager) to `manager` as an extension (beside a peer
// tier, say): takes the placeholder page from the host pool, allocates the staging area
// ([max_batch * max(top_k, max_prefetch)] rows of the largest stride, host memory) and registers
// both with the tier's transport. FailedPrecondition if the manager has a remote tier already.
Status AttachRemoteTier(SparseKVCacheManager& manager, RemoteTier* tier);
// Admits request `id` for layout.tokens prompt positions plus max_new_tokens, with its prompt
// KV in region `region` of the attached tier (RemoteTier::ImportRegion), laid out as `layout`
// (layout.layers == the geometry's layers, layout.row_bytes == every layer's row_bytes). No
// ingestion follows: the newest `window` prompt rows of every layer are read now (the call
// waits for them), the others on demand. Errors as SparseKVCacheManager::Admit, plus
// FailedPrecondition (no tier), InvalidArgument / OutOfRange for a layout that does not match
// the geometry or the region, and the transfer's error (nothing is admitted then).
Status AdmitRemote(SparseKVCacheManager& manager, RequestId id, uint32_t region,
                   const RemotePromptLayout& layout, int32_t max_new_tokens, StreamHandle stream);
// OK while a remote-backed request's reads succeed; once one fails, that error, for good
// (Release the request; its prompt may be recomputed). NotFound if `id` is not a live
// remote-backed request.
Status RemoteStatus(const SparseKVCacheManager& manager, RequestId id);

}  // namespace sparsekv
