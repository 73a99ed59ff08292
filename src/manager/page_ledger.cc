#include "manager/page_ledger.h"

#include <iterator>
#include <string>
#include <utility>

namespace sparsekv {

PageLedger::PageLedger(HostKVPool* pool, int32_t page_tokens)
    : pool_(pool), index_(page_tokens), retained_refs_(pool->total_pages(), 0) {}

PageLedger::~PageLedger() {
  for (const auto& [id, conversation] : retained_) {
    for (int32_t page : conversation.pages) pool_->Unref(page);
  }
}

std::vector<int32_t> PageLedger::Match(std::span<const int32_t> token_ids,
                                       int32_t max_pages) const {
  return index_.Match(token_ids, max_pages);
}

bool PageLedger::Index(int32_t parent, int32_t page, std::span<const int32_t> token_ids) {
  return index_.Insert(parent, page, token_ids);
}

void PageLedger::Touch(std::span<const int32_t> matched) {
  if (matched.empty()) return;
  // Each of the original entries is visited once; a conversation holds the prefix if its page at
  // the prefix's last index is the prefix's last page (pages are shared only as prefixes).
  const size_t last = matched.size() - 1;
  auto it = lru_.begin();
  for (size_t n = lru_.size(); n > 0; --n) {
    const std::vector<int32_t>& pages = retained_.at(*it).pages;
    auto next = std::next(it);
    if (pages.size() > last && pages[last] == matched[last]) lru_.splice(lru_.end(), lru_, it);
    it = next;
  }
}

void PageLedger::Unref(int32_t page) {
  if (pool_->Unref(page)) index_.Erase(page);
}

void PageLedger::ReleaseOwnerPages(int32_t owner) {
  std::vector<int32_t> freed;
  pool_->Release(owner, &freed);
  for (int32_t page : freed) index_.Erase(page);
}

void PageLedger::Retain(RequestId id, std::vector<int32_t> pages) {
  for (int32_t page : pages) {
    pool_->AddRef(page);
    ++retained_refs_[page];
  }
  lru_.push_back(id);
  retained_.emplace(id, Retained{std::move(pages), std::prev(lru_.end())});
}

const std::vector<int32_t>* PageLedger::RetainedPages(RequestId id) const {
  auto it = retained_.find(id);
  return it == retained_.end() ? nullptr : &it->second.pages;
}

int32_t PageLedger::Drop(RequestId id) {
  auto it = retained_.find(id);
  return it == retained_.end() ? -1 : Drop(it);
}

int32_t PageLedger::Drop(std::unordered_map<RequestId, Retained>::iterator it) {
  int32_t freed = 0;
  for (int32_t page : it->second.pages) {
    --retained_refs_[page];
    if (pool_->Unref(page)) {
      index_.Erase(page);
      ++freed;
    }
  }
  lru_.erase(it->second.lru);
  retained_.erase(it);
  return freed;
}

PageLedger::RetainedOnly PageLedger::RetainedOnlyPages() const {
  RetainedOnly out;
  for (size_t page = 0; page < retained_refs_.size(); ++page) {
    const int32_t refs = retained_refs_[page];
    if (refs == 0 || refs != pool_->RefCount(static_cast<int32_t>(page))) continue;
    ++out.pages;
    out.shared += refs > 1;
  }
  return out;
}

int32_t PageLedger::DropAll() {
  const int32_t n = retained_conversations();
  while (!retained_.empty()) Drop(retained_.begin());
  return n;
}

Status PageLedger::MakeRoom(int64_t pages, const char* op, Evictions& evicted) {
  if (pool_->free_pages() >= pages) return Status::Ok();
  // Evicting every retained conversation frees exactly the pages that only they reference.
  int64_t freeable = 0;
  for (int32_t p = 0; p < pool_->total_pages(); ++p) {
    freeable += retained_refs_[p] > 0 && retained_refs_[p] == pool_->RefCount(p);
  }
  if (pool_->free_pages() + freeable < pages) {
    return ResourceExhausted(
        std::string(op) + ": need " + std::to_string(pages) + " host pages, " +
        std::to_string(pool_->free_pages()) + " free and " + std::to_string(freeable) +
        " held only by retained conversations, of " + std::to_string(pool_->total_pages()));
  }
  // (Another manager of a shared pool may take freed pages meanwhile; Reserve then fails.)
  while (pool_->free_pages() < pages && !lru_.empty()) {
    evicted.pages += Drop(retained_.find(lru_.front()));
    ++evicted.conversations;
  }
  return Status::Ok();
}

int32_t PageLedger::SharedPageToCopy(int32_t owner, int32_t index) const {
  const int32_t page = pool_->page_table_row(owner)[index];
  return pool_->RefCount(page) > 1 ? page : -1;
}

}  // namespace sparsekv
