// Peer tier: rows of the host pool that another GPU of the machine also holds in its memory, read
// from there (over NVLink where the GPUs have it) instead of from host memory over PCIe.
//
// A lender (a prefill process that keeps its finished prompts, or any process with spare HBM)
// creates a PeerRegion: device memory laid out as the host pool is (layer-major: layer l is
// [rows][row_stride(l)]), shareable with the other processes of the machine (CUDA IPC). It writes
// rows into it and publishes its descriptor, e.g. through the control plane as a region of its
// node (ControlPlane::PublishRegion). A decoding manager with the peer tier (AttachPeerTier)
// imports the region (ImportPeerRegion) and maps requests' host pages to rows of it
// (MapPeerRows; AdmitFromPeer admits a request, ingests its prompt from the region and maps it).
//
// How a step reads. Every miss list is split by a table of the host pool's pages (RouteRows,
// kernel_views.h): a miss in a mapped page is copied by a second IndexCopy whose source is the
// region's address in this process, all other misses by the usual copy from the host pool. Both
// are enqueued on the step's stream, with no host synchronisation, so a step that reads a region
// can be captured into a CUDA graph; the kernels know nothing of peers but an address. While no
// page is mapped, steps take the plain path. A captured graph holds the copies of the regions
// imported when it was captured (their addresses): capture again after ImportPeerRegion or
// DetachPeerRegion (a graph that missed an import skips and counts, in CacheStats::
// invalid_copy_entries, the misses routed to the new region; one that missed a detach and a new
// import into the same slot reads the closed mapping). The tables are read on the device, so
// mapping and unmapping pages between replays needs no new capture.
//
// The host pool stays complete: a region holds copies. So a lender that exits or is killed costs
// speed, never rows: at each PlanStep the tier checks every imported region's lender (its pid and
// start time) and, finding it gone, unmaps the region's pages (their misses are read from the
// host pool again, the same bytes); PeerRegionStatus says Unavailable from then on. A step
// already running when the lender dies still reads the region: the mapping stays open, and CUDA
// keeps the memory valid, until the region's slot is reused by an import or the tier is
// destroyed.
//
// Generations. A region's descriptor carries its generation, a random 64-bit number; the region's
// memory starts with a header holding it and the region's shape, cleared before the memory is
// freed. A descriptor comes from elsewhere (the control plane, a lender that may have died or
// restarted) and may be stale, truncated or forged, so ImportPeerRegion reads nothing through it
// before it is checked: the text, the strides against the manager's geometry, the lender's
// liveness (its pid and start time), then the handle (Backend::ImportDevice: a handle of this
// process must name one of its live allocations, known on the host), the mapping's size
// (Backend::ImportedBytes), and only then the header. It refuses (NotFound) a descriptor whose
// region is gone or whose memory now holds another region, and (InvalidArgument) one whose shape
// is not its region's.
//
// REQUIRES of the lender (not checked): rows a decoder has mapped are not rewritten while it maps
// them, and a region is destroyed only after every decoder released it (DetachPeerRegion), or by
// the lender's exit. The control plane's ownership protocol (Bind, Done, Release) is how a decoder
// tells the lender.
//
// Thread safety: a PeerRegion, like a manager and its tier, is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/manager.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

// What a decoder needs to map a region: who lends it, its shape and the backend's handle.
struct PeerRegionDescriptor {
  int pid = 0;              // the lender's process
  uint64_t start_time = 0;  // and its start time (/proc/<pid>/stat), so that a reused pid is known
  uint64_t generation = 0;  // the region's: random, >= 1
  int32_t rows = 0;         // rows per layer
  std::vector<int32_t> row_strides;  // per layer
  std::string handle;                // Backend::ExportDevice's

  // "sparsekv-peer-region/1 pid=<> start=<> generation=<> rows=<> strides=<a,b,...>
  // handle=<handle>".
  std::string Serialize() const;
  // InvalidArgument unless `text` is what Serialize writes.
  static StatusOr<PeerRegionDescriptor> Parse(std::string_view text);
};

// Device memory of this process lent to the other processes of the machine.
class PeerRegion {
 public:
  // A region of `rows` rows per layer of `geometry`, in `backend`'s device memory (zeroed), and
  // its descriptor. InvalidArgument for an invalid geometry or rows < 1; ResourceExhausted if the
  // device has no room; Unavailable if the backend cannot share device memory.
  static StatusOr<std::unique_ptr<PeerRegion>> Create(const KVGeometry& geometry, int32_t rows,
                                                      std::shared_ptr<Backend> backend);
  // Clears the header (so that the descriptor is refused from now on) and frees the memory.
  ~PeerRegion();
  PeerRegion(const PeerRegion&) = delete;
  PeerRegion& operator=(const PeerRegion&) = delete;

  const PeerRegionDescriptor& descriptor() const { return descriptor_; }
  int32_t rows() const { return descriptor_.rows; }
  // Row `row` of `layer`: device memory of the backend the region was created with.
  std::byte* row(int32_t layer, int32_t row) const;

  // Copies rows [0, tokens) of `layer` from `rows` ([tokens, row_stride(layer)], host or device
  // memory) into rows [first_row, first_row + tokens) of the region, on `stream`. `rows` must stay
  // valid until the stream reaches the copy. InvalidArgument for a bad layer, null rows or
  // tokens < 1; OutOfRange if the rows do not fit.
  Status WriteRows(int32_t layer, int32_t first_row, const void* rows, int32_t tokens,
                   StreamHandle stream);

 private:
  PeerRegion(std::shared_ptr<Backend> backend, KVGeometry geometry)
      : backend_(std::move(backend)), geometry_(std::move(geometry)) {}

  std::shared_ptr<Backend> backend_;
  KVGeometry geometry_;
  std::byte* memory_ = nullptr;
  std::vector<int64_t> layer_offset_;  // bytes from memory_ to each layer's row 0
  PeerRegionDescriptor descriptor_;
};

struct PeerTierOptions {
  // ---- Behaviour ----
  // Regions imported at once, in [1, kMaxRoutePlaces - 1].
  int32_t max_regions = 1;
};

// Installs the peer tier as an extension of `manager` (manager_extension.h; beside a remote tier,
// say). Device memory: two tables of the host pool's pages (4 bytes each per page) and, per
// miss-list lane (ExtensionHost::miss_list_lanes), a list for the host pool and one per region
// (options.max_regions): 8 bytes per entry. FailedPrecondition if it has a peer tier already;
// InvalidArgument for max_regions out of range.
Status AttachPeerTier(SparseKVCacheManager& manager, const PeerTierOptions& options = {});

// Maps the region `descriptor` names (Parse's text) into this process and returns its index
// (for MapPeerRows). FailedPrecondition without the peer tier; InvalidArgument for a descriptor
// that does not parse, whose strides are not the manager's geometry's, or whose rows and strides
// are not its region's (its header's); NotFound if the lender is gone or the region no longer
// exists (its handle names no live allocation, or its header holds another generation);
// ResourceExhausted if max_regions regions are imported; the backend's error if it cannot map it
// (ImportDevice's: e.g. InvalidArgument for another backend's handle). Nothing changes on error
// but that a lost region's mapping (PeerRegionStatus Unavailable) in the slot taken is closed.
StatusOr<int32_t> ImportPeerRegion(SparseKVCacheManager& manager, std::string_view descriptor,
                                   StreamHandle stream);

// Unmaps every page mapped to `region` and closes the mapping (after synchronising `stream`).
// NotFound for an index that is not imported.
Status DetachPeerRegion(SparseKVCacheManager& manager, int32_t region, StreamHandle stream);

// OK while `region` is imported and its lender alive; Unavailable once the lender is found gone
// (its pages were unmapped then); NotFound for an index never imported or detached.
Status PeerRegionStatus(const SparseKVCacheManager& manager, int32_t region);

// Declares that rows [first_row, first_row + tokens) of every layer of `region` hold the rows of
// positions [0, tokens) of live request `id`, and maps its whole pages among them (a page whose
// positions are partly past `tokens` stays read from the host pool): misses on them are read from
// the region until the request is released or the region detached. The table is updated on
// `stream`. FailedPrecondition without the peer tier; NotFound for an unknown request or region;
// InvalidArgument for tokens < 1 or beyond the request's length (positions it has KV for);
// OutOfRange if the rows do not fit in the region. REQUIRES (not checked): the region holds those
// bytes.
Status MapPeerRows(SparseKVCacheManager& manager, RequestId id, int32_t region, int32_t first_row,
                   int32_t tokens, StreamHandle stream);

// Rows the run phase copied from regions (misses and prefetches) since the tier was attached
// (synchronises `stream`). AdmitFromPeer's ingest of a prompt from a region is not counted here:
// it is a prompt copy, counted in CacheStats::bytes_ingested. CacheStats counts every miss, from
// wherever it was read, in its misses and bytes_host_to_device.
// FailedPrecondition without the peer tier.
StatusOr<uint64_t> PeerRowsRead(const SparseKVCacheManager& manager, StreamHandle stream);

// Admits `id` with a prompt of `prompt_len` tokens whose rows are rows [first_row, first_row +
// prompt_len) of `region`: Admit, an IngestPrompt of every layer from the region (device to host
// memory), then MapPeerRows. Errors: those of Admit, IngestPrompt and MapPeerRows; on any, nothing
// is left admitted.
Status AdmitFromPeer(SparseKVCacheManager& manager, RequestId id, int32_t region, int32_t first_row,
                     int32_t prompt_len, int32_t max_new_tokens, StreamHandle stream);

}  // namespace sparsekv
