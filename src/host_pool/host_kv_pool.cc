#include "sparsekv/host_kv_pool.h"

#include <cassert>
#include <iterator>
#include <string>

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
  // The memory first: a pool that cannot be allocated fails before any bookkeeping is built.
  std::vector<std::byte*> layer_base;
  for (size_t l = 0; l < geometry.layers.size(); ++l) {
    const int64_t bytes = rows * geometry.layers[l].row_stride;
    StatusOr<void*> p = backend->AllocateHost(static_cast<size_t>(bytes));
    if (!p.ok()) {
      for (std::byte* q : layer_base) backend->FreeHost(q);
      return ResourceExhausted("HostKVPool: cannot allocate " + std::to_string(bytes) +
                               " bytes of host memory for layer " + std::to_string(l) + " (" +
                               std::to_string(rows) + " rows, " +
                               std::to_string(rows * geometry.token_stride_bytes()) +
                               " bytes for all layers): " + p.status().ToString());
    }
    layer_base.push_back(static_cast<std::byte*>(*p));
  }
  std::unique_ptr<HostKVPool> pool(new HostKVPool(geometry, static_cast<int32_t>(rows), page_tokens,
                                                  max_owners, pages_per_owner, backend));
  pool->layer_base_ = std::move(layer_base);
  return pool;
}

StatusOr<std::shared_ptr<HostKVPool>> HostKVPool::CreateShared(const CacheOptions& options,
                                                               int32_t max_owners,
                                                               std::shared_ptr<Backend> backend) {
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
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
      backend_(backend),
      page_table_(static_cast<size_t>(max_owners) * pages_per_owner, -1),
      owner_pages_(max_owners, 0),
      refs_(rows / page_tokens, 0) {
  for (int32_t o = max_owners - 1; o >= 0; --o) free_owners_.push_back(o);
}

HostKVPool::~HostKVPool() {
  for (std::byte* p : layer_base_) backend_->FreeHost(p);
}

StatusOr<int32_t> HostKVPool::AcquireOwner() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_owners_.empty()) {
    return ResourceExhausted("HostKVPool: all " + std::to_string(max_owners()) +
                             " owners are in use");
  }
  const int32_t owner = free_owners_.back();
  free_owners_.pop_back();
  return owner;
}

void HostKVPool::ReleaseOwner(int32_t owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  assert(owner_pages_[owner] == 0);
  free_owners_.push_back(owner);
}

int32_t HostKVPool::free_owners() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int32_t>(free_owners_.size());
}

Status HostKVPool::Reserve(int32_t owner, int32_t tokens, std::span<const int32_t> shared_prefix,
                           int32_t spare_pages, std::vector<int32_t>* spares) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (owner < 0 || owner >= static_cast<int32_t>(owner_pages_.size())) {
    return InvalidArgument("HostKVPool: owner " + std::to_string(owner) + " out of range");
  }
  if (owner_pages_[owner] != 0) {
    return FailedPrecondition("HostKVPool: owner " + std::to_string(owner) + " holds pages");
  }
  const int64_t pages = (static_cast<int64_t>(tokens) + page_tokens_ - 1) / page_tokens_;
  if (tokens < 0 || pages > pages_per_owner_) {
    return OutOfRange("HostKVPool: " + std::to_string(tokens) + " tokens exceed the " +
                      std::to_string(int64_t{pages_per_owner_} * page_tokens_) +
                      " a request may hold (max_context)");
  }
  const int64_t shared = static_cast<int64_t>(shared_prefix.size());
  if (shared > pages) {
    return InvalidArgument("HostKVPool: a shared prefix of " + std::to_string(shared) +
                           " pages is longer than the " + std::to_string(pages) + " reserved");
  }
  if (spare_pages < 0 || (spare_pages > 0 && spares == nullptr)) {
    return InvalidArgument("HostKVPool: invalid spare pages");
  }
  for (int32_t page : shared_prefix) {
    if (page < 0 || page >= total_pages() || refs_[page] == 0) {
      return InvalidArgument("HostKVPool: page " + std::to_string(page) +
                             " of the shared prefix is " +
                             (page < 0 || page >= total_pages() ? "out of range" : "free") +
                             " (a shared page must hold a reference)");
    }
  }
  const int64_t fresh = pages - shared + spare_pages;
  const int64_t free = FreePagesLocked();
  if (fresh > free) {
    return ResourceExhausted("HostKVPool: need " + std::to_string(fresh) + " pages of " +
                             std::to_string(page_tokens_) + " tokens, " + std::to_string(free) +
                             " free of " + std::to_string(total_pages()));
  }
  int32_t* table = page_table_.data() + static_cast<size_t>(owner) * pages_per_owner_;
  for (int64_t i = 0; i < pages; ++i) {
    if (i < shared) {
      table[i] = shared_prefix[i];
      AddRefLocked(table[i]);
    } else {
      table[i] = AllocatePageLocked();  // enough free pages were checked above
    }
  }
  for (int32_t i = 0; i < spare_pages; ++i) spares->push_back(AllocatePageLocked());
  owner_pages_[owner] = static_cast<int32_t>(pages);
  return Status::Ok();
}

void HostKVPool::Release(int32_t owner, std::vector<int32_t>* freed) {
  std::lock_guard<std::mutex> lock(mutex_);
  int32_t* table = page_table_.data() + static_cast<size_t>(owner) * pages_per_owner_;
  for (int32_t i = 0; i < owner_pages_[owner]; ++i) {
    if (UnrefLocked(table[i]) && freed != nullptr) freed->push_back(table[i]);
    table[i] = -1;
  }
  owner_pages_[owner] = 0;
}

StatusOr<int32_t> HostKVPool::AllocatePage() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (FreePagesLocked() == 0) {
    return ResourceExhausted("HostKVPool: all " + std::to_string(total_pages()) +
                             " pages are in use");
  }
  return AllocatePageLocked();
}

int32_t HostKVPool::AllocatePageLocked() {
  assert(FreePagesLocked() > 0);
  int32_t page;
  if (returned_pages_.empty()) {
    page = next_fresh_page_++;
  } else {
    page = *returned_pages_.begin();
    returned_pages_.erase(returned_pages_.begin());
  }
  refs_[page] = 1;
  return page;
}

void HostKVPool::AddRef(int32_t page) {
  std::lock_guard<std::mutex> lock(mutex_);
  AddRefLocked(page);
}

void HostKVPool::AddRefLocked(int32_t page) {
  assert(refs_[page] > 0);
  if (++refs_[page] == 2) ++shared_pages_;
  ++extra_references_;
}

bool HostKVPool::Unref(int32_t page) {
  std::lock_guard<std::mutex> lock(mutex_);
  return UnrefLocked(page);
}

bool HostKVPool::UnrefLocked(int32_t page) {
  assert(refs_[page] > 0);
  if (--refs_[page] == 0) {
    returned_pages_.insert(page);
    // Keep returned pages below next_fresh_page_ only: the set holds no free tail.
    while (!returned_pages_.empty() && *returned_pages_.rbegin() == next_fresh_page_ - 1) {
      returned_pages_.erase(std::prev(returned_pages_.end()));
      --next_fresh_page_;
    }
    return true;
  }
  if (refs_[page] == 1) --shared_pages_;
  --extra_references_;
  return false;
}

int32_t HostKVPool::SwapPage(int32_t owner, int32_t index, int32_t page) {
  std::lock_guard<std::mutex> lock(mutex_);
  assert(index < owner_pages_[owner] && refs_[page] > 0);
  int32_t& entry = page_table_[static_cast<size_t>(owner) * pages_per_owner_ + index];
  const int32_t old = entry;
  entry = page;
  return old;
}

int32_t HostKVPool::RefCount(int32_t page) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refs_[page];
}

int32_t HostKVPool::HostRow(int32_t owner, int32_t position) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int32_t page =
      page_table_[static_cast<size_t>(owner) * pages_per_owner_ + position / page_tokens_];
  return page * page_tokens_ + position % page_tokens_;
}

int32_t HostKVPool::ReservedTokens(int32_t owner) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return owner_pages_[owner] * page_tokens_;
}

int32_t HostKVPool::free_pages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return FreePagesLocked();
}

int32_t HostKVPool::FreePagesLocked() const {
  return static_cast<int32_t>(returned_pages_.size()) + (total_pages() - next_fresh_page_);
}

int32_t HostKVPool::shared_pages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shared_pages_;
}

int64_t HostKVPool::extra_references() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return extra_references_;
}

}  // namespace sparsekv
