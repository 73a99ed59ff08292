// HostKVPool::Book (pool_book.h): the bookkeeping's operations, the processes of a node pool, the
// reclaim of dead ones and the repair after one died holding the mutex.
#include "host_pool/pool_book.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "common/process_liveness.h"

namespace sparsekv {

using pool_state::kFreeOwner;
using pool_state::kPrivateOwner;

// Holds the bookkeeping's mutex for its scope. A node pool's mutex is robust: if the process that
// held it died, the state is repaired before the lock is handed on.
class HostKVPool::Book::Lock {
 public:
  explicit Lock(const Book& book) : book_(const_cast<Book&>(book)) {
    pthread_mutex_t* mutex = &book_.header_->mutex;
    const int err = pthread_mutex_lock(mutex);
    if (err == EOWNERDEAD) {
      book_.RepairLocked();
      pthread_mutex_consistent(mutex);
    } else if (err != 0) {
      // ENOTRECOVERABLE cannot happen (every EOWNERDEAD is made consistent); anything else is
      // a corrupted segment, and no caller could go on safely.
      std::fprintf(stderr, "sparsekv: host pool mutex: %s\n", std::strerror(err));
      std::abort();
    }
  }
  ~Lock() { pthread_mutex_unlock(&book_.header_->mutex); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  Book& book_;
};

HostKVPool::Book::Book(int32_t total_pages, int32_t page_tokens, int32_t pages_per_owner,
                       int32_t max_owners)
    : total_pages_(total_pages),
      page_tokens_(page_tokens),
      pages_per_owner_(pages_per_owner),
      max_owners_(max_owners) {}

std::unique_ptr<HostKVPool::Book> HostKVPool::Book::CreatePrivate(int32_t total_pages,
                                                                  int32_t page_tokens,
                                                                  int32_t pages_per_owner,
                                                                  int32_t max_owners) {
  std::unique_ptr<Book> book(new Book(total_pages, page_tokens, pages_per_owner, max_owners));
  const pool_state::Layout layout =
      pool_state::Layout::Of(total_pages, pages_per_owner, max_owners, 0);
  book->private_block_.reset(new (std::nothrow) std::byte[layout.bytes]());
  if (book->private_block_ == nullptr) return nullptr;
  book->Bind(book->private_block_.get(), 0);
  book->Init();
  return book;
}

std::unique_ptr<HostKVPool::Book> HostKVPool::Book::OverSegment(
    std::unique_ptr<NodeSegment> segment) {
  const NodeSegment::Shape& shape = segment->shape();
  std::unique_ptr<Book> book(
      new Book(shape.total_pages(), shape.page_tokens, shape.pages_per_owner, shape.max_owners));
  std::byte* block = segment->book();
  const int32_t processes = shape.max_processes;
  book->segment_ = std::move(segment);
  book->Bind(block, processes);
  return book;
}

HostKVPool::Book::~Book() {
  if (segment_ == nullptr) pthread_mutex_destroy(&header_->mutex);
}

void HostKVPool::Book::Bind(std::byte* block, int32_t max_processes) {
  const pool_state::Layout l =
      pool_state::Layout::Of(total_pages_, pages_per_owner_, max_owners_, max_processes);
  header_ = reinterpret_cast<pool_state::Header*>(block + l.header);
  owners_ = reinterpret_cast<pool_state::Owner*>(block + l.owners);
  processes_ =
      max_processes > 0 ? reinterpret_cast<pool_state::Process*>(block + l.processes) : nullptr;
  page_table_ = reinterpret_cast<int32_t*>(block + l.page_table);
  refs_ = reinterpret_cast<int32_t*>(block + l.refs);
  used_bits_ = reinterpret_cast<uint64_t*>(block + l.used_bits);
  loose_ = max_processes > 0 ? reinterpret_cast<int32_t*>(block + l.loose) : nullptr;
}

void HostKVPool::Book::Init() {
  pool_state::Header& h = *header_;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  if (is_node_pool()) {
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  }
  pthread_mutex_init(&h.mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  const int32_t pages = total_pages_;
  h.total_pages = pages;
  h.page_tokens = page_tokens_;
  h.pages_per_owner = pages_per_owner_;
  h.max_owners = max_owners_;
  h.max_processes = is_node_pool() ? segment_->shape().max_processes : 0;
  h.free_pages = pages;
  h.free_owners = max_owners_;
  for (int32_t o = 0; o < max_owners_; ++o) owners_[o] = {kFreeOwner, 0, 0, 0, 0};
  std::fill_n(page_table_, static_cast<size_t>(max_owners_) * pages_per_owner_, -1);
  // Bits past the last page are set, so that they are never handed out.
  const size_t words = pool_state::Layout::Words(pages);
  if (pages % 64 != 0) used_bits_[words - 1] = ~uint64_t{0} << (pages % 64);
}

// ---- Owners ----

bool HostKVPool::Book::HoldsOwner(int32_t owner) const {
  return !is_node_pool() || owners_[owner].process == self_;
}

StatusOr<int32_t> HostKVPool::Book::AcquireOwner() {
  Lock lock(*this);
  if (header_->free_owners == 0) ReclaimIfShortLocked(0, /*owner=*/true);
  if (header_->free_owners == 0) {
    return ResourceExhausted("HostKVPool: all " + std::to_string(max_owners_) +
                             " owners are in use");
  }
  for (int32_t o = 0; o < max_owners_; ++o) {
    if (owners_[o].process != kFreeOwner) continue;
    owners_[o].process = is_node_pool() ? self_ : kPrivateOwner;
    --header_->free_owners;
    return o;
  }
  return Internal("HostKVPool: the free-owner count is wrong");  // unreachable
}

void HostKVPool::Book::ReleaseOwner(int32_t owner) {
  Lock lock(*this);
  assert(owners_[owner].pages == 0 && owners_[owner].process != kFreeOwner && HoldsOwner(owner));
  owners_[owner] = {kFreeOwner, 0, 0, 0, 0};
  ++header_->free_owners;
}

int32_t HostKVPool::Book::free_owners() const {
  Lock lock(*this);
  return header_->free_owners;
}

// ---- Reservations ----

Status HostKVPool::Book::Reserve(int32_t owner, int32_t tokens,
                                 std::span<const int32_t> shared_prefix, int32_t spare_pages,
                                 std::vector<int32_t>* spares) {
  Lock lock(*this);
  if (owner < 0 || owner >= max_owners_) {
    return InvalidArgument("HostKVPool: owner " + std::to_string(owner) + " out of range");
  }
  if (!HoldsOwner(owner)) {
    return FailedPrecondition("HostKVPool: owner " + std::to_string(owner) +
                              " is not held by this process");
  }
  if (owners_[owner].pages != 0) {
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
    if (page < 0 || page >= total_pages_ || refs_[page] == 0) {
      return InvalidArgument("HostKVPool: page " + std::to_string(page) +
                             " of the shared prefix is " +
                             (page < 0 || page >= total_pages_ ? "out of range" : "free") +
                             " (a shared page must hold a reference)");
    }
  }
  const int64_t fresh = pages - shared + spare_pages;
  ReclaimIfShortLocked(fresh, /*owner=*/false);
  const int64_t free = FreePagesLocked();
  if (fresh > free) {
    return ResourceExhausted("HostKVPool: need " + std::to_string(fresh) + " pages of " +
                             std::to_string(page_tokens_) + " tokens, " + std::to_string(free) +
                             " free of " + std::to_string(total_pages_));
  }
  int32_t* table = page_table_ + static_cast<size_t>(owner) * pages_per_owner_;
  for (int64_t i = 0; i < pages; ++i) {
    if (i < shared) {
      table[i] = shared_prefix[i];
      AddRefLocked(table[i]);
    } else {
      table[i] = AllocatePageLocked();  // enough free pages were checked above
    }
  }
  for (int32_t i = 0; i < spare_pages; ++i) {
    const int32_t page = AllocatePageLocked();
    CountLoose(page, 1);
    spares->push_back(page);
  }
  // Written last: a process that dies before this line holds none of the pages above, and a
  // repair (RepairLocked) counts none of them.
  owners_[owner].pages = static_cast<int32_t>(pages);
  return Status::Ok();
}

void HostKVPool::Book::Release(int32_t owner, std::vector<int32_t>* freed) {
  Lock lock(*this);
  ReleaseLocked(owner, freed);
}

void HostKVPool::Book::ReleaseLocked(int32_t owner, std::vector<int32_t>* freed) {
  pool_state::Owner& o = owners_[owner];
  int32_t* table = page_table_ + static_cast<size_t>(owner) * pages_per_owner_;
  const int32_t pages = o.pages;
  // The count first, so that a repair after a death in the loop counts none of these entries.
  o.pages = 0;
  o.seal = 0;
  o.sealed_pages = o.sealed_tokens = 0;
  for (int32_t i = 0; i < pages; ++i) {
    if (UnrefLocked(table[i]) && freed != nullptr) freed->push_back(table[i]);
    table[i] = -1;
  }
}

StatusOr<int32_t> HostKVPool::Book::AllocatePage() {
  Lock lock(*this);
  ReclaimIfShortLocked(1, /*owner=*/false);
  if (FreePagesLocked() == 0) {
    return ResourceExhausted("HostKVPool: all " + std::to_string(total_pages_) +
                             " pages are in use");
  }
  const int32_t page = AllocatePageLocked();
  CountLoose(page, 1);
  return page;
}

int32_t HostKVPool::Book::AllocatePageLocked() {
  assert(FreePagesLocked() > 0);
  const int32_t words = static_cast<int32_t>(pool_state::Layout::Words(total_pages_));
  int32_t w = header_->first_free_word;
  while (w < words && used_bits_[w] == ~uint64_t{0}) ++w;
  assert(w < words);
  const int32_t bit = std::countr_zero(~used_bits_[w]);
  used_bits_[w] |= uint64_t{1} << bit;
  header_->first_free_word = w;
  --header_->free_pages;
  const int32_t page = w * 64 + bit;
  refs_[page] = 1;
  return page;
}

void HostKVPool::Book::AddRef(int32_t page) {
  Lock lock(*this);
  AddRefLocked(page);
  CountLoose(page, 1);
}

void HostKVPool::Book::AddRefLocked(int32_t page) {
  assert(refs_[page] > 0);
  if (++refs_[page] == 2) ++header_->shared_pages;
  ++header_->extra_references;
}

bool HostKVPool::Book::Unref(int32_t page) {
  Lock lock(*this);
  CountLoose(page, -1);
  return UnrefLocked(page);
}

bool HostKVPool::Book::UnrefLocked(int32_t page) {
  assert(refs_[page] > 0);
  if (--refs_[page] == 0) {
    const int32_t w = page / 64;
    used_bits_[w] &= ~(uint64_t{1} << (page % 64));
    header_->first_free_word = std::min(header_->first_free_word, w);
    ++header_->free_pages;
    return true;
  }
  if (refs_[page] == 1) --header_->shared_pages;
  --header_->extra_references;
  return false;
}

void HostKVPool::Book::CountLoose(int32_t page, int32_t delta) {
  if (loose_ == nullptr) return;
  int32_t& n = loose_[static_cast<size_t>(self_) * total_pages_ + page];
  n += delta;
  assert(n >= 0);
}

int32_t HostKVPool::Book::SwapPage(int32_t owner, int32_t index, int32_t page) {
  Lock lock(*this);
  assert(index < owners_[owner].pages && refs_[page] > 0 && HoldsOwner(owner));
  int32_t& entry = page_table_[static_cast<size_t>(owner) * pages_per_owner_ + index];
  const int32_t old = entry;
  entry = page;
  CountLoose(page, -1);
  CountLoose(old, 1);
  // A sealed page is never written; one swapped out of the table ends the seal.
  if (index < owners_[owner].sealed_pages) {
    owners_[owner].seal = 0;
    owners_[owner].sealed_pages = owners_[owner].sealed_tokens = 0;
  }
  return old;
}

int32_t HostKVPool::Book::RefCount(int32_t page) const {
  Lock lock(*this);
  return refs_[page];
}

int32_t HostKVPool::Book::HostRow(int32_t owner, int32_t position) const {
  Lock lock(*this);
  const int32_t page =
      page_table_[static_cast<size_t>(owner) * pages_per_owner_ + position / page_tokens_];
  return page * page_tokens_ + position % page_tokens_;
}

int32_t HostKVPool::Book::ReservedTokens(int32_t owner) const {
  Lock lock(*this);
  return owners_[owner].pages * page_tokens_;
}

int32_t HostKVPool::Book::free_pages() const {
  Lock lock(*this);
  return FreePagesLocked();
}

int32_t HostKVPool::Book::FreePagesLocked() const { return header_->free_pages; }

int32_t HostKVPool::Book::shared_pages() const {
  Lock lock(*this);
  return header_->shared_pages;
}

int64_t HostKVPool::Book::extra_references() const {
  Lock lock(*this);
  return header_->extra_references;
}

// ---- Seals ----

StatusOr<uint64_t> HostKVPool::Book::Seal(int32_t owner, int32_t tokens) {
  Lock lock(*this);
  if (owner < 0 || owner >= max_owners_ || owners_[owner].process == kFreeOwner) {
    return InvalidArgument("Seal: owner " + std::to_string(owner) + " is out of range or free");
  }
  if (!HoldsOwner(owner)) {
    return FailedPrecondition("Seal: owner " + std::to_string(owner) +
                              " is not held by this process");
  }
  if (tokens < 1) return InvalidArgument("Seal: tokens must be >= 1");
  pool_state::Owner& o = owners_[owner];
  if (int64_t{tokens} > int64_t{o.pages} * page_tokens_) {
    return OutOfRange("Seal: " + std::to_string(tokens) + " tokens exceed the " +
                      std::to_string(int64_t{o.pages} * page_tokens_) + " reserved by owner " +
                      std::to_string(owner));
  }
  o.sealed_tokens = tokens;
  o.sealed_pages = (tokens + page_tokens_ - 1) / page_tokens_;
  o.seal = ++header_->next_seal;
  return o.seal;
}

StatusOr<HostKVPool::SealedPages> HostKVPool::Book::ShareSealed(int32_t owner, uint64_t seal) {
  Lock lock(*this);
  if (owner < 0 || owner >= max_owners_) {
    return InvalidArgument("ShareSealed: owner " + std::to_string(owner) + " out of range");
  }
  // Pages of a dead process are about to be reclaimed: sharing them would keep a prompt whose
  // writer may not have finished it. A sealed prompt is complete, so only check the seal after
  // the reclaim.
  ReclaimDeadLocked();
  const pool_state::Owner& o = owners_[owner];
  if (seal == 0 || o.seal != seal) {
    return NotFound("ShareSealed: owner " + std::to_string(owner) + " has no seal " +
                    std::to_string(seal) +
                    " (released, sealed again, or its process exited and was reclaimed)");
  }
  SealedPages out;
  out.tokens = o.sealed_tokens;
  const int32_t* table = page_table_ + static_cast<size_t>(owner) * pages_per_owner_;
  for (int32_t i = 0; i < o.sealed_pages; ++i) {
    AddRefLocked(table[i]);
    CountLoose(table[i], 1);
    out.pages.push_back(table[i]);
  }
  return out;
}

// ---- Processes (node pool) ----

int32_t HostKVPool::Book::live_processes() const {
  if (!is_node_pool()) return 1;
  Lock lock(*this);
  return header_->live_processes;
}

int32_t HostKVPool::Book::ReclaimDeadProcesses() {
  if (!is_node_pool()) return 0;
  Lock lock(*this);
  return ReclaimDeadLocked();
}

bool HostKVPool::Book::ReclaimIfShortLocked(int64_t pages, bool owner) {
  if (!is_node_pool()) return false;
  if (owner ? header_->free_owners > 0 : pages <= FreePagesLocked()) return false;
  return ReclaimDeadLocked() > 0;
}

int32_t HostKVPool::Book::ReclaimDeadLocked() {
  if (!is_node_pool()) return 0;
  const int32_t pages = total_pages_;
  const pid_t me = getpid();
  int32_t reclaimed = 0;
  for (int32_t p = 0; p < header_->max_processes; ++p) {
    pool_state::Process& proc = processes_[p];
    if (proc.live == 0 || p == self_) continue;
    if (proc.pid == me || ProcessAlive(proc.pid, proc.start_time)) continue;
    // Dead: its owners' pages, then its loose references. Its owners end sealed, so that no
    // reader can share their pages from now on.
    for (int32_t o = 0; o < max_owners_; ++o) {
      if (owners_[o].process != p) continue;
      ReleaseLocked(o, nullptr);
      owners_[o] = {kFreeOwner, 0, 0, 0, 0};
      ++header_->free_owners;
    }
    int32_t* loose = loose_ + static_cast<size_t>(p) * pages;
    for (int32_t page = 0; page < pages; ++page) {
      for (; loose[page] > 0; --loose[page]) UnrefLocked(page);
    }
    proc.live = 0;
    --header_->live_processes;
    ++reclaimed;
  }
  return reclaimed;
}

void HostKVPool::Book::RepairLocked() {
  pool_state::Header& h = *header_;
  const int32_t pages = total_pages_;
  std::fill_n(refs_, pages, 0);
  h.free_owners = 0;
  for (int32_t o = 0; o < max_owners_; ++o) {
    pool_state::Owner& owner = owners_[o];
    if (owner.process == kFreeOwner) {
      owner = {kFreeOwner, 0, 0, 0, 0};
      ++h.free_owners;
    }
    int32_t* table = page_table_ + static_cast<size_t>(o) * pages_per_owner_;
    for (int32_t i = 0; i < pages_per_owner_; ++i) {
      if (i < owner.pages) {
        ++refs_[table[i]];
      } else {
        table[i] = -1;
      }
    }
  }
  h.live_processes = 0;
  for (int32_t p = 0; p < h.max_processes; ++p) {
    if (processes_[p].live != 0) ++h.live_processes;
    const int32_t* loose = loose_ + static_cast<size_t>(p) * pages;
    for (int32_t page = 0; page < pages; ++page) refs_[page] += loose[page];
  }
  const size_t words = pool_state::Layout::Words(pages);
  std::fill_n(used_bits_, words, 0);
  if (pages % 64 != 0) used_bits_[words - 1] = ~uint64_t{0} << (pages % 64);
  h.free_pages = h.shared_pages = 0;
  h.extra_references = 0;
  h.first_free_word = 0;
  for (int32_t page = 0; page < pages; ++page) {
    if (refs_[page] == 0) {
      ++h.free_pages;
      continue;
    }
    used_bits_[page / 64] |= uint64_t{1} << (page % 64);
    if (refs_[page] > 1) ++h.shared_pages;
    h.extra_references += refs_[page] - 1;
  }
}

Status HostKVPool::Book::Attach() {
  Lock lock(*this);
  if (header_->closed != 0) {
    return FailedPrecondition("node pool " + segment_->path() +
                              " was closed by its last process (create it again)");
  }
  ReclaimDeadLocked();
  const pid_t pid = getpid();
  const uint64_t start = OwnStartTime();
  for (int32_t p = 0; p < header_->max_processes; ++p) {
    if (processes_[p].live != 0) continue;
    // A slot that was reclaimed (or never used) holds nothing: its loose references are zero.
    processes_[p] = {1, static_cast<int32_t>(pid), start};
    ++header_->live_processes;
    self_ = p;
    attached_pid_ = pid;
    return Status::Ok();
  }
  return ResourceExhausted("node pool " + segment_->path() + ": all " +
                           std::to_string(header_->max_processes) +
                           " process slots are taken by live processes (max_processes)");
}

bool HostKVPool::Book::CloseIfAbandoned() {
  Lock lock(*this);
  ReclaimDeadLocked();
  if (header_->live_processes > 0) return false;
  header_->closed = 1;
  return true;
}

void HostKVPool::Book::Detach() {
  bool last = false;
  {
    Lock lock(*this);
    // What this process still holds (its managers are gone: the pool outlives them).
    for (int32_t o = 0; o < max_owners_; ++o) {
      if (owners_[o].process != self_) continue;
      ReleaseLocked(o, nullptr);
      owners_[o] = {kFreeOwner, 0, 0, 0, 0};
      ++header_->free_owners;
    }
    const int32_t pages = total_pages_;
    int32_t* loose = loose_ + static_cast<size_t>(self_) * pages;
    for (int32_t page = 0; page < pages; ++page) {
      for (; loose[page] > 0; --loose[page]) UnrefLocked(page);
    }
    processes_[self_].live = 0;
    --header_->live_processes;
    self_ = -1;
    ReclaimDeadLocked();
    if (header_->live_processes == 0) {
      // No one may attach any more: a process that opened the file meanwhile finds it closed.
      header_->closed = 1;
      last = true;
    }
  }
  if (last) segment_->Unlink();
}

void HostKVPool::Book::DetachIfAttached() {
  if (self_ >= 0 && getpid() == attached_pid_) Detach();
}

bool HostKVPool::Book::registered_here() const { return registered_ && getpid() == attached_pid_; }

}  // namespace sparsekv
