#include "manager/prefix_index.h"

#include <algorithm>
#include <cassert>

namespace sparsekv {
namespace {

constexpr uint64_t kSeed = 0x5350415253454b56;  // "SPARSEKV"

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t PrefixIndex::DefaultHash(uint64_t parent_key, std::span<const int32_t> token_ids) {
  uint64_t h = SplitMix64(parent_key);
  for (int32_t id : token_ids) h = SplitMix64(h ^ static_cast<uint32_t>(id));
  return h;
}

PrefixIndex::PrefixIndex(int32_t page_tokens, HashFn hash)
    : page_tokens_(page_tokens), hash_(hash) {}

int32_t PrefixIndex::Find(uint64_t key, int32_t parent, std::span<const int32_t> token_ids) const {
  auto [begin, end] = by_key_.equal_range(key);
  for (auto it = begin; it != end; ++it) {
    const Entry& e = entries_.at(it->second);
    if (e.parent == parent && std::ranges::equal(e.token_ids, token_ids)) return it->second;
  }
  return -1;
}

std::vector<int32_t> PrefixIndex::Match(std::span<const int32_t> token_ids,
                                        int32_t max_pages) const {
  std::vector<int32_t> pages;
  uint64_t key = kSeed;
  int32_t parent = -1;
  const int64_t full_pages = static_cast<int64_t>(token_ids.size()) / page_tokens_;
  for (int64_t i = 0; i < std::min<int64_t>(full_pages, max_pages); ++i) {
    const std::span<const int32_t> ids = token_ids.subspan(i * page_tokens_, page_tokens_);
    key = hash_(key, ids);
    parent = Find(key, parent, ids);
    if (parent < 0) break;
    pages.push_back(parent);
  }
  return pages;
}

bool PrefixIndex::Insert(int32_t parent, int32_t page, std::span<const int32_t> token_ids) {
  assert(static_cast<int32_t>(token_ids.size()) == page_tokens_);
  if (entries_.contains(page)) return false;
  uint64_t parent_key = kSeed;
  if (parent >= 0) {
    auto it = entries_.find(parent);
    if (it == entries_.end()) return false;
    parent_key = it->second.key;
  }
  const uint64_t key = hash_(parent_key, token_ids);
  if (Find(key, parent, token_ids) >= 0) return false;
  entries_.emplace(page, Entry{key, parent, {token_ids.begin(), token_ids.end()}});
  by_key_.emplace(key, page);
  return true;
}

void PrefixIndex::Erase(int32_t page) {
  auto it = entries_.find(page);
  if (it == entries_.end()) return;
  auto [begin, end] = by_key_.equal_range(it->second.key);
  for (auto k = begin; k != end; ++k) {
    if (k->second == page) {
      by_key_.erase(k);
      break;
    }
  }
  entries_.erase(it);
}

}  // namespace sparsekv
