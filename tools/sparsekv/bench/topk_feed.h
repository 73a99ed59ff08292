// The end-to-end benchmark's top-k feed: each step's rows generated on the host for every layer
// by the synthetic generator (sparsekv/topk_generator.h) and uploaded into a fixed device buffer,
// both outside the captured step. CUDA builds only (gpu_bench.cc).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "sparsekv/topk_generator.h"
#include "tools/sparsekv/bench/gpu_variants.h"

namespace sparsekv::tools {

// The step's top-k: generated on the host for every layer ([layers][max_batch][top_k]) and
// uploaded into a fixed device buffer, both outside the captured step.
class TopKFeed {
 public:
  // `queries` rows of options.top_k per request (--mtp), stored as one row of queries * top_k.
  static StatusOr<std::unique_ptr<TopKFeed>> Create(const TopKGeneratorOptions& options,
                                                    int32_t layers, int32_t max_batch,
                                                    int32_t queries = 1) {
    std::unique_ptr<TopKFeed> f(new TopKFeed(options, layers, max_batch, queries));
    SPARSEKV_ASSIGN_OR_RETURN(
        f->device_, DeviceBuffer::Allocate(f->host_.size() * sizeof(int32_t), kBenchMemory));
    return f;
  }

  // Generates the rows of requests [0, seq_lens.size()) for every layer; layers in parallel on
  // every core but `spare_cores` (each generator owns its layer, so the result does not depend on
  // the thread count). With several queries per request, query q's row is the generator's next
  // row after query q - 1's.
  void Generate(std::span<const int32_t> seq_lens, int32_t spare_cores = 0) {
    const int32_t layers = static_cast<int32_t>(generators_.size());
    const int32_t cores = std::max<int32_t>(
        1, static_cast<int32_t>(std::thread::hardware_concurrency()) - spare_cores);
    if (cross_layer_) {  // each layer's rows take shared positions of the layer below's
      GenerateChained(seq_lens, cores);
      return;
    }
    auto run = [&](int32_t first, int32_t every) {
      std::vector<int32_t> rows(seq_lens.size() * top_k_);
      for (int32_t l = first; l < layers; l += every) {
        int32_t* layer = host_.data() + l * layer_elems_;
        if (queries_ == 1) {
          generators_[l].Next(seq_lens, std::span(layer, layer_elems_));
          continue;
        }
        for (int32_t q = 0; q < queries_; ++q) {
          generators_[l].Next(seq_lens, rows);
          for (size_t b = 0; b < seq_lens.size(); ++b) {
            std::copy_n(rows.begin() + b * top_k_, top_k_, layer + (b * queries_ + q) * top_k_);
          }
        }
      }
    };
    const int32_t threads = std::min(cores, layers);
    std::vector<std::jthread> pool;
    for (int32_t t = 0; t < threads; ++t) pool.emplace_back(run, t, threads);
  }
  Status Upload(int32_t batch, cudaStream_t stream) {
    for (size_t l = 0; l < generators_.size(); ++l) {
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          device_.get<int32_t>() + l * layer_elems_, host_.data() + l * layer_elems_,
          size_t(batch) * queries_ * top_k_ * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    }
    return Status::Ok();
  }
  // Each layer given the rows of the layer below (queries == 1: --mtp runs uncorrelated), as a
  // pipeline over the layers on every core (the rows do not depend on the thread count).
  void GenerateChained(std::span<const int32_t> seq_lens, int32_t threads) {
    const size_t rows = seq_lens.size() * top_k_;
    std::vector<std::span<int32_t>> out;
    for (size_t l = 0; l < generators_.size(); ++l) {
      out.emplace_back(host_.data() + l * layer_elems_, rows);
    }
    NextChained(generators_, seq_lens, out, threads);
  }
  void SetMissRate(double rate) {
    for (LayerTopKGenerator& g : generators_) g.set_miss_rate(rate);
  }
  // Layers of an index group share their first layer's rows.
  const int32_t* layer(int32_t l) const {
    return device_.get<int32_t>() + (l - l % layers_per_index_) * layer_elems_;
  }
  void set_layers_per_index(int32_t n) { layers_per_index_ = n; }

 private:
  TopKFeed(const TopKGeneratorOptions& options, int32_t layers, int32_t max_batch, int32_t queries)
      : top_k_(options.top_k),
        queries_(queries),
        layer_elems_(int64_t{max_batch} * queries * options.top_k),
        host_(static_cast<size_t>(layers * layer_elems_)),
        cross_layer_(options.cross_layer_overlap > 0 && queries == 1) {
    for (int32_t l = 0; l < layers; ++l) generators_.emplace_back(options, l, max_batch);
  }

  int32_t top_k_;
  int32_t queries_;  // rows per request (--mtp)
  int64_t layer_elems_;
  int32_t layers_per_index_ = 1;
  std::vector<LayerTopKGenerator> generators_;
  std::vector<int32_t> host_;
  bool cross_layer_;
  DeviceBuffer device_;
};

}  // namespace sparsekv::tools
