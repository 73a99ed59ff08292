// Node pools (sparsekv/node_pool.h): creating and opening the segment, its descriptor, and the
// helpers of the hand-off.
#include "sparsekv/node_pool.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <span>
#include <string>
#include <utility>

#include "host_pool/node_segment.h"
#include "host_pool/pool_book.h"
#include "sparsekv/capacity.h"

namespace sparsekv {
namespace {

constexpr std::string_view kDescriptorPrefix = "sparsekv-node-pool/1 ";
constexpr int32_t kMaxProcesses = 4096;

Status CheckName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 200 && name[0] != '.';
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return Status::Ok();
  return InvalidArgument("node pool: name '" + name +
                         "' must be 1-200 characters of [A-Za-z0-9._-], not starting with '.'");
}

}  // namespace

// A HostKVPool over `segment`, not yet attached nor registered with a backend.
// (A friend's helper: the constructor and the book are private.)
class NodePoolAccess {
 public:
  static std::shared_ptr<HostKVPool> Wrap(std::unique_ptr<NodeSegment> segment,
                                          std::shared_ptr<Backend> backend) {
    const NodeSegment::Shape& shape = segment->shape();
    std::shared_ptr<HostKVPool> pool(new HostKVPool(shape.geometry, shape.rows, shape.page_tokens,
                                                    shape.max_owners, shape.pages_per_owner,
                                                    backend.get()));
    pool->backend_owner_ = std::move(backend);
    for (int32_t l = 0; l < shape.geometry.num_layers(); ++l) {
      pool->layer_base_.push_back(segment->layer_base(l));
    }
    pool->book_ = HostKVPool::Book::OverSegment(std::move(segment));
    pool->page_table_ = pool->book_->page_table();
    return pool;
  }
  static void Init(HostKVPool& pool) { pool.book_->Init(); }
  static Status Attach(HostKVPool& pool) { return pool.book_->Attach(); }
  static NodeSegment& Segment(HostKVPool& pool) { return pool.book_->segment(); }
  static bool Holds(const HostKVPool& pool, int32_t owner) { return pool.book_->HoldsOwner(owner); }
  static Status Register(HostKVPool& pool) {
    NodeSegment& s = pool.book_->segment();
    SPARSEKV_RETURN_IF_ERROR(pool.backend_->RegisterHost(s.rows_begin(), s.rows_bytes()));
    pool.book_->set_registered();
    return Status::Ok();
  }
  // For a segment that exists under the path we want: if no process attached to it is alive,
  // closes it (no one may attach any more) and removes its file. True if it did.
  static bool ClearIfStale(HostKVPool& pool) {
    if (!pool.book_->CloseIfAbandoned()) return false;
    pool.book_->segment().Unlink();
    return true;
  }
};

namespace {

// The segment's shape for CreateNodePool's arguments; InvalidArgument as it says.
StatusOr<NodeSegment::Shape> SegmentShape(const CacheOptions& options, int32_t max_owners,
                                          const NodePoolOptions& node) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  SPARSEKV_RETURN_IF_ERROR(HostKVPool::CheckShareable(options.geometry, "node pool"));
  if (max_owners < 1) return InvalidArgument("node pool: max_owners must be >= 1");
  if (node.max_processes < 1 || node.max_processes > kMaxProcesses) {
    return InvalidArgument("node pool: max_processes must be in [1, " +
                           std::to_string(kMaxProcesses) + "]");
  }
  const int32_t pt = options.host_page_tokens;
  const int64_t pages = (options.host_capacity_tokens + pt - 1) / pt;
  if (pages * pt > INT32_MAX) return InvalidArgument("node pool: capacity overflows 32-bit rows");
  NodeSegment::Shape shape;
  shape.geometry = options.geometry;
  shape.rows = static_cast<int32_t>(pages * pt);
  shape.page_tokens = pt;
  shape.pages_per_owner = (options.max_context + pt - 1) / pt;
  shape.max_owners = max_owners;
  shape.max_processes = node.max_processes;
  return shape;
}

}  // namespace

StatusOr<int64_t> NodePoolBytes(const CacheOptions& options, int32_t max_owners,
                                const NodePoolOptions& node) {
  SPARSEKV_ASSIGN_OR_RETURN(const NodeSegment::Shape shape,
                            SegmentShape(options, max_owners, node));
  return static_cast<int64_t>(NodeSegment::FileBytes(shape));
}

StatusOr<std::shared_ptr<HostKVPool>> CreateNodePool(const CacheOptions& options,
                                                     int32_t max_owners,
                                                     const NodePoolOptions& node,
                                                     std::shared_ptr<Backend> backend) {
  SPARSEKV_ASSIGN_OR_RETURN(const NodeSegment::Shape shape,
                            SegmentShape(options, max_owners, node));
  SPARSEKV_RETURN_IF_ERROR(CheckName(node.name));
  if (backend == nullptr) return InvalidArgument("node pool: backend is null");
  // Against the file system's room and the host memory, before the file is made: every byte of
  // it is written (resident) when it is created.
  const int64_t bytes = static_cast<int64_t>(NodeSegment::FileBytes(shape));
  const int64_t row_bytes = int64_t{shape.rows} * shape.geometry.token_stride_bytes();
  const std::string sizing =
      "host_capacity_tokens = " + std::to_string(options.host_capacity_tokens) + " (" +
      std::to_string(shape.rows) + " rows x " +
      std::to_string(shape.geometry.token_stride_bytes()) + " B over " +
      std::to_string(shape.geometry.num_layers()) + " layers, and " +
      FormatBytes(bytes - row_bytes) + " of bookkeeping)";
  SPARSEKV_RETURN_IF_ERROR(CheckSharedMemory(
      {.what = "node pool '" + node.name + "'",
       .sizing = sizing,
       .bytes = bytes,
       .remedy = "lower host_capacity_tokens, or put the pool on a larger file system "
                 "(NodePoolOptions::directory; a tmpfs grows with mount -o remount,size=...)"},
      node.directory));
  const std::string path = node.directory + "/" + node.name;
  SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<NodeSegment> segment,
                            NodeSegment::Create(path, shape, node.huge_pages));
  std::shared_ptr<HostKVPool> pool = NodePoolAccess::Wrap(std::move(segment), backend);
  NodePoolAccess::Init(*pool);
  // Attached before it is published: a process that opens it at once cannot find it stale.
  SPARSEKV_RETURN_IF_ERROR(NodePoolAccess::Attach(*pool));
  Status published = NodePoolAccess::Segment(*pool).Publish();
  if (published.code() == StatusCode::kAlreadyExists) {
    // A segment of that name exists: replace it if all its processes have exited.
    StatusOr<std::unique_ptr<NodeSegment>> existing = NodeSegment::Open(path, false);
    if (existing.ok()) {
      std::shared_ptr<HostKVPool> other = NodePoolAccess::Wrap(std::move(*existing), nullptr);
      if (!NodePoolAccess::ClearIfStale(*other)) {
        return AlreadyExists("node pool: " + path + " is in use by " +
                             std::to_string(other->live_processes()) + " live process(es)");
      }
    } else if (existing.status().code() == StatusCode::kFailedPrecondition) {
      return AlreadyExists("node pool: " + path + " exists and is not a node pool segment: " +
                           existing.status().ToString());
    }
    published = NodePoolAccess::Segment(*pool).Publish();
  }
  SPARSEKV_RETURN_IF_ERROR(published);
  SPARSEKV_RETURN_IF_ERROR(NodePoolAccess::Register(*pool));
  return pool;
}

namespace {

// OpenNodePool, refused before this process attaches unless the segment has `id` (0: any).
StatusOr<std::shared_ptr<HostKVPool>> Open(const std::string& path, uint64_t id,
                                           const NodePoolOptions& node,
                                           std::shared_ptr<Backend> backend) {
  if (backend == nullptr) return InvalidArgument("node pool: backend is null");
  SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<NodeSegment> segment,
                            NodeSegment::Open(path, node.huge_pages));
  if (id != 0 && segment->id() != id) {
    char want[17], have[17];
    std::snprintf(want, sizeof(want), "%016" PRIx64, id);
    std::snprintf(have, sizeof(have), "%016" PRIx64, segment->id());
    return NotFound("node pool: " + path + " holds segment " + have + ", not " + want +
                    " (the pool was created again)");
  }
  std::shared_ptr<HostKVPool> pool = NodePoolAccess::Wrap(std::move(segment), std::move(backend));
  SPARSEKV_RETURN_IF_ERROR(NodePoolAccess::Attach(*pool));
  SPARSEKV_RETURN_IF_ERROR(NodePoolAccess::Register(*pool));
  return pool;
}

}  // namespace

StatusOr<std::shared_ptr<HostKVPool>> OpenNodePool(const std::string& path,
                                                   const NodePoolOptions& node,
                                                   std::shared_ptr<Backend> backend) {
  return Open(path, 0, node, std::move(backend));
}

StatusOr<std::shared_ptr<HostKVPool>> OpenDescribedNodePool(std::string_view descriptor,
                                                            const NodePoolOptions& node,
                                                            std::shared_ptr<Backend> backend) {
  SPARSEKV_ASSIGN_OR_RETURN(NodePoolDescriptor d, NodePoolDescriptor::Parse(descriptor));
  if (d.id == 0) return InvalidArgument("node pool descriptor: id 0 names no segment");
  return Open(d.path, d.id, node, std::move(backend));
}

NodePoolDescriptor DescribeNodePool(const HostKVPool& pool) {
  return {pool.node_pool_path(), pool.node_pool_id()};
}

std::string NodePoolDescriptor::Serialize() const {
  char id_text[17];
  std::snprintf(id_text, sizeof(id_text), "%016" PRIx64, id);
  return std::string(kDescriptorPrefix) + "id=" + id_text + " path=" + path;
}

StatusOr<NodePoolDescriptor> NodePoolDescriptor::Parse(std::string_view text) {
  const auto bad = [&] {
    return InvalidArgument("node pool descriptor: '" + std::string(text.substr(0, 200)) +
                           "' is not of the form \"sparsekv-node-pool/1 id=<16 hex digits> "
                           "path=<path>\"");
  };
  if (!text.starts_with(kDescriptorPrefix)) return bad();
  text.remove_prefix(kDescriptorPrefix.size());
  if (!text.starts_with("id=") || text.size() < 3 + 16 + 6) return bad();
  const std::string_view hex = text.substr(3, 16);
  NodePoolDescriptor d;
  for (char c : hex) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return bad();
    d.id = d.id << 4 | static_cast<uint64_t>(digit);
  }
  text.remove_prefix(3 + 16);
  if (!text.starts_with(" path=") || text.size() == 6) return bad();
  d.path = std::string(text.substr(6));
  return d;
}

void UseNodePoolShape(const HostKVPool& pool, CacheOptions& options) {
  options.geometry = pool.geometry();
  options.host_page_tokens = pool.page_tokens();
  options.host_capacity_tokens = int64_t{pool.rows()};
  options.max_context = pool.pages_per_owner() * pool.page_tokens();
}

Status WritePromptLayer(HostKVPool& pool, Backend& backend, int32_t owner, int32_t layer,
                        const void* rows, int32_t tokens, StreamHandle stream) {
  if (layer < 0 || layer >= pool.geometry().num_layers()) {
    return InvalidArgument("WritePromptLayer: layer " + std::to_string(layer) + " out of range");
  }
  if (rows == nullptr || tokens < 1) {
    return InvalidArgument("WritePromptLayer: rows is null or tokens < 1");
  }
  if (owner < 0 || owner >= pool.max_owners()) {
    return InvalidArgument("WritePromptLayer: owner " + std::to_string(owner) + " out of range");
  }
  if (!NodePoolAccess::Holds(pool, owner)) {
    return FailedPrecondition("WritePromptLayer: owner " + std::to_string(owner) +
                              " is not held by this process");
  }
  if (tokens > pool.ReservedTokens(owner)) {
    return OutOfRange("WritePromptLayer: " + std::to_string(tokens) + " tokens exceed the " +
                      std::to_string(pool.ReservedTokens(owner)) + " reserved by owner " +
                      std::to_string(owner));
  }
  const int32_t pt = pool.page_tokens();
  const int64_t stride = pool.geometry().layers[layer].row_stride;
  const auto* src = static_cast<const std::byte*>(rows);
  const std::span<const int32_t> table = pool.page_table_row(owner);
  for (int32_t p = 0; p < tokens; p += pt) {
    const int32_t n = std::min(pt, tokens - p);
    SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(pool.row(layer, table[p / pt] * pt),
                                               src + p * stride, static_cast<size_t>(n * stride),
                                               stream));
  }
  return Status::Ok();
}

}  // namespace sparsekv
