// Top-k traces: what an indexer (or a stand-in for one) selected, per decode step and layer, for
// one request. The file format (docs/planning.md; scripts/record_traces.py writes it too), all
// integers little-endian:
//   bytes 0-7   magic "SKVTRACE"
//   uint32      version (1)
//   uint32      layers
//   uint32      top_k
//   uint32      steps
//   uint32      metadata_bytes
//   metadata    metadata_bytes of UTF-8 text (JSON by convention: source, model, parameters)
//   records     steps x layers records, step-major: int32 seq_len, then int32 positions[top_k]
//               (-1 = padding). seq_len counts the tokens with KV at that step, the newest one
//               included, so valid positions are in [0, seq_len).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv {

struct Trace {
  int32_t layers = 0;
  int32_t top_k = 0;
  int32_t steps = 0;
  std::string metadata;
  std::vector<int32_t> seq_len;    // [steps, layers]
  std::vector<int32_t> positions;  // [steps, layers, top_k]

  // REQUIRES (not checked: an accessor; ReadTrace checks the sizes): step < steps,
  // layer < layers, and the vectors sized as above.
  std::span<const int32_t> row(int32_t step, int32_t layer) const {
    const size_t i = static_cast<size_t>(step) * layers + layer;
    return {positions.data() + i * top_k, static_cast<size_t>(top_k)};
  }
  int32_t seq_len_at(int32_t step, int32_t layer) const {
    return seq_len[static_cast<size_t>(step) * layers + layer];
  }
  // Sizes the vectors for the shape (contents zero).
  void Resize(int32_t layers, int32_t top_k, int32_t steps);
};

// InvalidArgument if the shape is empty or the vectors do not match it; Unavailable on I/O errors.
Status WriteTrace(const std::string& path, const Trace& trace);
// InvalidArgument for a file that is not a version-1 trace, is truncated, or has a record whose
// seq_len is below 1; Unavailable if it cannot be opened.
StatusOr<Trace> ReadTrace(const std::string& path);

}  // namespace sparsekv
