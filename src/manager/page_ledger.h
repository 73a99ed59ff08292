// PageLedger: who holds which host pages beyond the page tables of live requests, for one manager.
//
// It owns the manager's PrefixIndex (full pages by the token ids they hold), its retained
// conversations (indexed pages kept after a request ended, one reference each, with no device
// state) in least-recently-used order, and the bookkeeping of copy on write. Every reference it
// drops goes through Unref, which unindexes a page the pool frees, so that the index never names
// a free page.
//
// Pages held only by retained conversations are what MakeRoom can free: it evicts conversations,
// least recently used first, until an admission's pages are free.
//
// Thread safety: not thread-safe; the owning manager serialises calls. The pool may be shared
// with other managers (each with its own ledger); the ledger only drops references it holds.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "manager/prefix_index.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

class PageLedger {
 public:
  // `pool` must outlive the ledger. `page_tokens`: the tokens a pool page's rows cover, which
  // the index keys a page by (the pool's page_tokens entries times the entry cadence:
  // LayerShape::entry_tokens).
  PageLedger(HostKVPool* pool, int32_t page_tokens);
  // Drops the retained conversations' references (the index goes with the ledger).
  ~PageLedger();
  PageLedger(const PageLedger&) = delete;
  PageLedger& operator=(const PageLedger&) = delete;

  // ---- Prefix index ----

  // The pages of the longest indexed prefix of token_ids, at most max_pages (PrefixIndex::Match).
  std::vector<int32_t> Match(std::span<const int32_t> token_ids, int32_t max_pages) const;
  // Indexes `page` (covering token_ids, page_tokens of them) after `parent` (-1: first page).
  // False if PrefixIndex::Insert refuses it.
  bool Index(int32_t parent, int32_t page, std::span<const int32_t> token_ids);
  // The retained conversations holding the prefix `matched` (a Match result) are in use again:
  // they move to the back of the LRU order, keeping their relative order.
  void Touch(std::span<const int32_t> matched);
  const PrefixIndex& index() const { return index_; }

  // ---- References ----

  // Drops one reference; unindexes the page if it was the last.
  void Unref(int32_t page);
  // Drops the references of owner's page table (HostKVPool::Release) and unindexes the pages
  // that freed.
  void ReleaseOwnerPages(int32_t owner);

  // ---- Retained conversations ----

  // Keeps `pages` (full and indexed) as the retained conversation `id`, the most recently used,
  // with a reference of its own to each. REQUIRES: pages is not empty; id is not retained.
  void Retain(RequestId id, std::vector<int32_t> pages);
  bool IsRetained(RequestId id) const { return retained_.contains(id); }
  // The pages of a retained conversation, in position order; null if `id` is not retained.
  const std::vector<int32_t>* RetainedPages(RequestId id) const;
  // Drops the conversation `id`; returns the pages this freed (a page another holder still
  // references is not), or -1 if `id` is not retained.
  int32_t Drop(RequestId id);
  // Drops every retained conversation; returns how many there were.
  int32_t DropAll();
  int32_t retained_conversations() const { return static_cast<int32_t>(retained_.size()); }
  // Pages every holder of which is a retained conversation of this ledger (what MakeRoom can
  // free), and of those the pages with more than one such holder.
  struct RetainedOnly {
    int32_t pages = 0;
    int32_t shared = 0;
  };
  RetainedOnly RetainedOnlyPages() const;

  // What MakeRoom evicted.
  struct Evictions {
    int32_t conversations = 0;
    int32_t pages = 0;  // pages freed
  };
  // Evicts retained conversations, least recently used first, until `pages` pages of the pool are
  // free, and adds what it evicted to `evicted`. ResourceExhausted, evicting nothing, if evicting
  // all of them would not be enough (message prefixed with `op`). With a shared pool, another
  // manager may take the freed pages before the caller reserves them.
  Status MakeRoom(int64_t pages, const char* op, Evictions& evicted);

  // ---- Copy on write ----
  //
  // A request that will append into a shared, partially filled page holds a private spare page
  // for its copy. Before the append:

  // The page at entry `index` of owner's table if it is still shared: the caller copies its rows
  // into its spare, puts the spare in the table (HostKVPool::SwapPage, which hands it the table's
  // reference to the shared page) and drops that reference with Unref (the others still hold the
  // page). Otherwise -1: every other holder has let go, the page is the owner's to write, and the
  // caller drops the spare with Unref. Changes nothing, so that a step may be planned whole
  // before any of this is done.
  int32_t SharedPageToCopy(int32_t owner, int32_t index) const;

 private:
  struct Retained {
    std::vector<int32_t> pages;          // one reference each, full and indexed
    std::list<RequestId>::iterator lru;  // position in lru_
  };
  int32_t Drop(std::unordered_map<RequestId, Retained>::iterator it);

  HostKVPool* pool_;
  PrefixIndex index_;
  std::unordered_map<RequestId, Retained> retained_;
  std::list<RequestId> lru_;            // least recently used first
  std::vector<int32_t> retained_refs_;  // per page: references held by retained conversations
};

}  // namespace sparsekv
