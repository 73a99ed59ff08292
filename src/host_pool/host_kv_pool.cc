// HostKVPool's face: its memory (the rows of every layer) and its layout; the bookkeeping and,
// for a node pool, the shared-memory machinery are the Book's (pool_book.h).
#include "sparsekv/host_kv_pool.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "host_pool/node_segment.h"
#include "host_pool/pool_book.h"
#include "sparsekv/capacity.h"

namespace sparsekv {

StatusOr<std::unique_ptr<HostKVPool>> HostKVPool::Create(const KVGeometry& geometry,
                                                         int64_t capacity_tokens,
                                                         int32_t page_tokens, int32_t max_owners,
                                                         int32_t max_tokens_per_owner,
                                                         Backend* backend) {
  if (page_tokens <= 0 || capacity_tokens < page_tokens || max_owners <= 0 ||
      max_tokens_per_owner <= 0 || geometry.layers.empty()) {
    return InvalidArgument("HostKVPool: invalid shape");
  }
  const int64_t pages = (capacity_tokens + page_tokens - 1) / page_tokens;
  const int64_t rows = pages * page_tokens;
  if (rows > INT32_MAX) return InvalidArgument("HostKVPool: capacity overflows 32-bit rows");
  const int32_t pages_per_owner = (max_tokens_per_owner + page_tokens - 1) / page_tokens;
  // Against what the machine (or the backend's reserved arena) has, before any of it is
  // allocated: a pool larger than the host memory would otherwise grow toward it as its rows are
  // written, and fail late.
  int32_t offloaded = 0;
  for (int32_t l = 0; l < geometry.num_layers(); ++l) offloaded += geometry.offloaded(l);
  if (offloaded == 0) return InvalidArgument("HostKVPool: the geometry has no offloaded layer");
  const std::string sizing = "host_capacity_tokens = " + std::to_string(capacity_tokens) + " (" +
                             std::to_string(rows) + " rows x " +
                             std::to_string(geometry.token_stride_bytes()) + " B over " +
                             std::to_string(offloaded) + " offloaded layers)";
  SPARSEKV_RETURN_IF_ERROR(
      CheckHostMemory({.what = "host pool",
                       .sizing = sizing,
                       .bytes = rows * geometry.token_stride_bytes(),
                       .remedy = "lower host_capacity_tokens, or use a machine with more memory"},
                      *backend));
  // The memory first: a pool that cannot be allocated fails before any bookkeeping is built.
  // Resident and window-only layers get none (a null base).
  std::vector<std::byte*> layer_base(geometry.layers.size(), nullptr);
  for (int32_t l = 0; l < geometry.num_layers(); ++l) {
    if (!geometry.offloaded(l)) continue;
    const int64_t bytes = rows * geometry.layers[l].row_stride;
    StatusOr<void*> p = backend->AllocateHost(static_cast<size_t>(bytes));
    if (!p.ok()) {
      for (std::byte* q : layer_base) {
        if (q != nullptr) backend->FreeHost(q);
      }
      return ResourceExhausted("HostKVPool: cannot allocate " + std::to_string(bytes) +
                               " bytes of host memory for layer " + std::to_string(l) + " (" +
                               std::to_string(rows) + " rows, " +
                               std::to_string(rows * geometry.token_stride_bytes()) +
                               " bytes for all offloaded layers): " + p.status().ToString());
    }
    layer_base[l] = static_cast<std::byte*>(*p);
  }
  std::unique_ptr<HostKVPool> pool(new HostKVPool(geometry, static_cast<int32_t>(rows), page_tokens,
                                                  max_owners, pages_per_owner, backend));
  pool->layer_base_ = std::move(layer_base);
  pool->book_ =
      Book::CreatePrivate(static_cast<int32_t>(pages), page_tokens, pages_per_owner, max_owners);
  if (pool->book_ == nullptr) {
    return ResourceExhausted("HostKVPool: cannot allocate the bookkeeping of " +
                             std::to_string(pages) + " pages");
  }
  pool->page_table_ = pool->book_->page_table();
  return pool;
}

Status HostKVPool::CheckShareable(const KVGeometry& geometry, const char* op) {
  for (int32_t l = 0; l < geometry.num_layers(); ++l) {
    if (geometry.offloaded(l)) continue;
    return Unimplemented(std::string(op) + ": geometry.layers[" + std::to_string(l) + "].kind is " +
                         LayerKindName(geometry.layers[l].kind) +
                         "; a pool shared by several managers is served only for geometries whose "
                         "every layer is offloaded (docs/deepseek-v4.md)");
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<HostKVPool>> HostKVPool::CreateShared(const CacheOptions& options,
                                                               int32_t max_owners,
                                                               std::shared_ptr<Backend> backend) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  SPARSEKV_RETURN_IF_ERROR(CheckShareable(options.geometry, "HostKVPool::CreateShared"));
  if (backend == nullptr) return InvalidArgument("HostKVPool: backend is null");
  SPARSEKV_ASSIGN_OR_RETURN(
      std::shared_ptr<HostKVPool> pool,
      Create(options.geometry, options.host_capacity_tokens, options.host_page_tokens, max_owners,
             options.max_context, backend.get()));
  pool->backend_owner_ = std::move(backend);
  return pool;
}

HostKVPool::HostKVPool(const KVGeometry& geometry, int32_t rows, int32_t page_tokens,
                       int32_t max_owners, int32_t pages_per_owner, Backend* backend)
    : geometry_(geometry),
      rows_(rows),
      page_tokens_(page_tokens),
      pages_per_owner_(pages_per_owner),
      max_owners_(max_owners),
      backend_(backend) {}

HostKVPool::~HostKVPool() {
  if (book_ != nullptr && book_->is_node_pool()) {
    book_->DetachIfAttached();
    if (book_->registered_here()) backend_->UnregisterHost(book_->segment().rows_begin());
    return;  // the rows are the segment's; the book unmaps it
  }
  for (std::byte* p : layer_base_) {
    if (p != nullptr) backend_->FreeHost(p);
  }
}

bool HostKVPool::is_node_pool() const { return book_->is_node_pool(); }

StatusOr<int32_t> HostKVPool::AcquireOwner() { return book_->AcquireOwner(); }

void HostKVPool::ReleaseOwner(int32_t owner) { book_->ReleaseOwner(owner); }

int32_t HostKVPool::free_owners() const { return book_->free_owners(); }

Status HostKVPool::Reserve(int32_t owner, int32_t tokens, std::span<const int32_t> shared_prefix,
                           int32_t spare_pages, std::vector<int32_t>* spares) {
  return book_->Reserve(owner, tokens, shared_prefix, spare_pages, spares);
}

void HostKVPool::Release(int32_t owner, std::vector<int32_t>* freed) {
  book_->Release(owner, freed);
}

StatusOr<int32_t> HostKVPool::AllocatePage() { return book_->AllocatePage(); }

void HostKVPool::AddRef(int32_t page) { book_->AddRef(page); }

bool HostKVPool::Unref(int32_t page) { return book_->Unref(page); }

int32_t HostKVPool::SwapPage(int32_t owner, int32_t index, int32_t page) {
  return book_->SwapPage(owner, index, page);
}

int32_t HostKVPool::RefCount(int32_t page) const { return book_->RefCount(page); }

StatusOr<uint64_t> HostKVPool::Seal(int32_t owner, int32_t tokens) {
  return book_->Seal(owner, tokens);
}

StatusOr<HostKVPool::SealedPages> HostKVPool::ShareSealed(int32_t owner, uint64_t seal) {
  return book_->ShareSealed(owner, seal);
}

const std::string& HostKVPool::node_pool_path() const {
  static const std::string kNone;
  return is_node_pool() ? book_->segment().path() : kNone;
}

uint64_t HostKVPool::node_pool_id() const { return is_node_pool() ? book_->segment().id() : 0; }

int32_t HostKVPool::live_processes() const { return book_->live_processes(); }

int32_t HostKVPool::ReclaimDeadProcesses() { return book_->ReclaimDeadProcesses(); }

int32_t HostKVPool::HostRow(int32_t owner, int32_t position) const {
  return book_->HostRow(owner, position);
}

int32_t HostKVPool::ReservedTokens(int32_t owner) const { return book_->ReservedTokens(owner); }

int32_t HostKVPool::free_pages() const { return book_->free_pages(); }

int32_t HostKVPool::shared_pages() const { return book_->shared_pages(); }

int64_t HostKVPool::extra_references() const { return book_->extra_references(); }

}  // namespace sparsekv
