// How a peer region's memory is laid out: a header, then the layers, each [rows][row_stride(l)].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparsekv::peer_layout {

// The first bytes of a region: it names the region, so that a decoder can tell a live region
// from memory that was freed or holds another region.
struct Header {
  uint64_t magic;
  uint64_t generation;
};
inline constexpr uint64_t kMagic = 0x7370617273656b76;  // "sparsekv"
inline constexpr int64_t kHeaderBytes = 256;            // keeps the rows' alignment

// Bytes from the region's start to row 0 of each layer, then the region's size.
std::vector<int64_t> LayerOffsets(int32_t rows, std::span<const int32_t> strides);

}  // namespace sparsekv::peer_layout
