// PrefixIndex: finds the longest prefix of a token sequence whose KV is held in host-pool pages.
//
// Only full pages are indexed. Page i of a sequence is keyed by a hash chain over token ids,
//   key(0) = hash(kSeed, ids of page 0),  key(i) = hash(key(i - 1), ids of page i),
// so that a key stands for the whole prefix up to its page. A hit is verified, never trusted: the
// entry must hold exactly the page's ids and its parent must be the page matched for i - 1. By
// induction a matched chain holds exactly the ids asked for, whatever the hash collides on.
//
// Entries name pages and hold no reference to them. The owner erases a page when the pool frees
// it; that keeps every entry's parent live, because whoever holds page i of a chain also holds its
// pages 0..i-1 (sharing is always of prefixes), so a parent is freed no earlier than its children.
//
// Thread safety: not thread-safe; the owning manager serialises calls.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace sparsekv {

class PrefixIndex {
 public:
  using HashFn = uint64_t (*)(uint64_t parent_key, std::span<const int32_t> token_ids);
  // A 64-bit mix of the parent key and the ids (splitmix64 steps).
  static uint64_t DefaultHash(uint64_t parent_key, std::span<const int32_t> token_ids);

  // `hash` is injectable so that tests can force collisions.
  explicit PrefixIndex(int32_t page_tokens, HashFn hash = &DefaultHash);

  // The pages of the longest indexed chain whose page i holds
  // token_ids[i * page_tokens, (i + 1) * page_tokens), at most max_pages of them.
  std::vector<int32_t> Match(std::span<const int32_t> token_ids, int32_t max_pages) const;
  // Indexes `page`, holding `token_ids` (page_tokens ids), as the successor of `parent` (-1: the
  // first page of a sequence). Returns false and indexes nothing if `page` is already indexed,
  // `parent` is neither -1 nor indexed, or another page already holds the same ids after the
  // same parent (an identical copy: lookups keep finding the first one).
  bool Insert(int32_t parent, int32_t page, std::span<const int32_t> token_ids);
  // Removes `page`; no-op if it is not indexed.
  void Erase(int32_t page);
  bool Contains(int32_t page) const { return entries_.contains(page); }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t key;
    int32_t parent;
    std::vector<int32_t> token_ids;
  };
  // The page indexed under `key` after `parent` with exactly `token_ids`, or -1.
  int32_t Find(uint64_t key, int32_t parent, std::span<const int32_t> token_ids) const;

  int32_t page_tokens_;
  HashFn hash_;
  std::unordered_map<int32_t, Entry> entries_;         // page -> entry
  std::unordered_multimap<uint64_t, int32_t> by_key_;  // chain key -> pages (collisions allowed)
};

}  // namespace sparsekv
