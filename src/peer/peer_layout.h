// How a peer region's memory is laid out: a header, then the layers, each [rows][row_stride(l)].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparsekv::peer_layout {

// The first bytes of a region: it names the region and its shape, so that a decoder can tell a
// live region from memory that was freed or holds another region, and a descriptor whose shape
// was altered from the region's.
struct Header {
  uint64_t magic;
  uint64_t generation;
  int64_t rows;
  int64_t layers;
  uint64_t strides_hash;  // StridesHash of the region's row strides
};
inline constexpr uint64_t kMagic = 0x7370617273656b76;  // "sparsekv"
inline constexpr int64_t kHeaderBytes = 256;            // keeps the rows' alignment
static_assert(sizeof(Header) <= kHeaderBytes);

// Bytes from the region's start to row 0 of each layer, then the region's size.
std::vector<int64_t> LayerOffsets(int32_t rows, std::span<const int32_t> strides);

// FNV-1a over the strides' values.
uint64_t StridesHash(std::span<const int32_t> strides);

// The header of a region with `generation`, `rows` rows per layer and `strides`.
Header HeaderOf(uint64_t generation, int32_t rows, std::span<const int32_t> strides);

}  // namespace sparsekv::peer_layout
