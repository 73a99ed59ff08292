// The end-to-end benchmark's top-k feed: each step's rows generated on the host once per index
// group (TopKRows, topk_rows.h) and uploaded into a fixed device buffer, both outside the captured
// step; every layer of a group reads the group's rows. CUDA builds only (gpu_bench.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>

#include "sparsekv/index_groups.h"
#include "sparsekv/topk_generator.h"
#include "tools/sparsekv/bench/gpu_variants.h"
#include "tools/sparsekv/bench/topk_rows.h"

namespace sparsekv::tools {

// The step's top-k: [groups][max_batch][queries * top_k] on the host and in a device buffer of
// the same layout.
class TopKFeed {
 public:
  // `queries` rows of options.top_k per request (--mtp), stored as one row of queries * top_k;
  // the rows name entries of `entry_tokens` tokens (TopKRows; DeepSeek-V4's CSA layers: 4).
  static StatusOr<std::unique_ptr<TopKFeed>> Create(const TopKGeneratorOptions& options,
                                                    const IndexGroups& groups, int32_t max_batch,
                                                    int32_t queries = 1, int32_t entry_tokens = 1) {
    std::unique_ptr<TopKFeed> f(new TopKFeed(options, groups, max_batch, queries, entry_tokens));
    SPARSEKV_ASSIGN_OR_RETURN(
        f->device_, DeviceBuffer::Allocate(f->rows_.size() * sizeof(int32_t), kBenchMemory));
    return f;
  }

  // TopKRows::Generate.
  void Generate(std::span<const int32_t> seq_lens, int32_t spare_cores = 0) {
    rows_.Generate(seq_lens, spare_cores);
  }
  // Every group's rows of requests [0, batch), on `stream`.
  Status Upload(int32_t batch, cudaStream_t stream) {
    const int64_t elems = rows_.group_elems();
    for (int32_t g = 0; g < rows_.groups().count(); ++g) {
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          device_.get<int32_t>() + g * elems, rows_.data() + g * elems,
          size_t(batch) * rows_.row_elems() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    }
    return Status::Ok();
  }
  void SetMissRate(double rate) { rows_.SetMissRate(rate); }
  // `layer`'s rows on the device ([max_batch][queries * top_k]): its group's.
  const int32_t* layer(int32_t l) const { return device_.get<int32_t>() + rows_.LayerOffset(l); }

 private:
  TopKFeed(const TopKGeneratorOptions& options, const IndexGroups& groups, int32_t max_batch,
           int32_t queries, int32_t entry_tokens)
      : rows_(options, groups, max_batch, queries, entry_tokens) {}

  TopKRows rows_;
  DeviceBuffer device_;
};

}  // namespace sparsekv::tools
