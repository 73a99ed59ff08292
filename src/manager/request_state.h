// RequestState: what the manager knows of one live request, and how its errors name one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/types.h"

namespace sparsekv {

struct RequestState {
  int32_t owner;  // row in the host pool's page table (and the residency table)
  int32_t block;  // hot-cache block; -1 while resident or retracted
  // Entries (rows of the host pool, one per LayerShape::entry_tokens tokens: tokens at cadence 1)
  // with KV, and entries reserved in the host pool; the tokens are below.
  int32_t seq_len;
  int32_t reserved;
  std::vector<bool> ingested;  // per layer
  int32_t ingested_layers;
  int32_t cached = 0;  // prompt entries [0, cached) shared at admission, never ingested
  // Ids of tokens [0, token_ids.size()); only extended while complete (size == tokens).
  std::vector<int32_t> token_ids{};
  int32_t indexed_pages = 0;  // pages [0, indexed_pages) of the table are in the prefix index
  // A private page reserved for the copy on write of the shared, partially filled page that
  // the request's next append goes into; -1 if none. Used or freed by that append.
  int32_t cow_page = -1;
  // Resident mode: the first slots of the resident pages holding positions [i * R, (i + 1) * R);
  // empty in hot-cache mode.
  std::vector<int32_t> resident_pages{};
  // Forked children, sealed prompts and remote-backed requests stay in hot-cache mode.
  bool may_be_resident = true;
  // Indexer keys (CacheOptions::indexer_key_bytes): the first slots of the pages holding
  // positions [i * keys_per_page, (i + 1) * keys_per_page), and the layers whose prompt keys
  // are stored.
  std::vector<int32_t> key_pages{};
  std::vector<bool> keys_ingested{};
  int32_t keys_ingested_layers = 0;

  // Tokens appended (the prompt's and each step's), and the tokens the request may reach.
  int32_t tokens = 0;
  int32_t reserved_tokens = 0;

  bool resident() const { return !resident_pages.empty(); }
  bool on_device() const { return block >= 0 || resident(); }
};

namespace manager_internal {

inline std::string Describe(RequestId id) { return "request " + std::to_string(id); }

}  // namespace manager_internal

}  // namespace sparsekv
