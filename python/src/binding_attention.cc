// sparsekv._core: SparseMLAAttention and WeightStreamProxy (sparsekv/attention.h,
// sparsekv/model_proxy.h), the GPU operators the C++ benchmark attends and streams weights with,
// and LayerTopKGenerator (sparsekv/topk_generator.h), its synthetic top-k workload.
//
// Device arguments of the GPU operators are an int (a raw device pointer, taken as is: the
// caller answers for its size and device) or a tensor (checked: on the operator's CUDA device,
// C-contiguous, of the element size the operator reads, large enough for `batch`). On a build
// without CUDA, or a machine without the device, construction raises UnavailableError; bad
// options raise InvalidArgumentError first, on any build.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "binding_util.h"
#include "sparsekv/attention.h"
#include "sparsekv/kv_format.h"
#include "sparsekv/model_proxy.h"
#include "sparsekv/topk_generator.h"

namespace sparsekv {
namespace {

// What a device argument must be; see the file comment.
struct DeviceRules {
  const char* name;
  int64_t itemsize = 0;  // 0: any element size
  bool int32 = false;    // int32 elements
  int64_t min_bytes = 0;
  bool output = false;
};

void* DevicePointer(const py::handle& obj, const DeviceRules& r, int device) {
  const std::string n = r.name;
  if (py::isinstance<py::int_>(obj)) {
    return reinterpret_cast<void*>(obj.cast<uintptr_t>());
  }
  const TensorArg t = ParseTensor(obj, r.name);
  if (t.memory != Memory::kCuda || t.device != device) {
    throw py::value_error(n + ": expected a tensor on cuda:" + std::to_string(device) + ", got " +
                          DeviceString(t));
  }
  if (!t.contiguous) throw py::value_error(n + ": tensor must be C-contiguous");
  if (r.output && t.readonly) throw py::value_error(n + ": tensor is read-only");
  if (r.int32 && !(t.kind == 'i' && t.itemsize == 4)) {
    throw py::type_error(n + ": dtype must be int32");
  }
  if (r.itemsize > 0 && t.itemsize != r.itemsize) {
    throw py::type_error(n + ": expected " + std::to_string(r.itemsize) +
                         "-byte elements (bf16), got " + std::to_string(t.itemsize) + "-byte ones");
  }
  int64_t bytes = t.itemsize;
  for (const int64_t d : t.shape) bytes *= d;
  if (bytes < r.min_bytes) {
    throw py::value_error(n + ": expected at least " + std::to_string(r.min_bytes) +
                          " bytes for the batch, got shape " + t.ShapeString());
  }
  return t.data;
}

SparseMLAOptions::Split SplitOf(const std::string& name) {
  if (name == "gather-first") return SparseMLAOptions::Split::kGatherFirst;
  if (name == "merge-halves") return SparseMLAOptions::Split::kMergeHalves;
  throw py::value_error("split must be 'gather-first' or 'merge-halves', got '" + name + "'");
}

class PyAttention {
 public:
  // Create validates the options before it looks for a device, on every build.
  PyAttention(const SparseMLAOptions& options, int device)
      : device_(device), attention_(Check(SparseMLAAttention::Create(options, device))) {}

  void Run(int32_t batch, const py::object& q, const py::object& kv_rows, int64_t row_stride,
           const py::object& indices, const py::object& out, const py::object& stream) {
    const Args a = Arguments(batch, q, kv_rows, indices, py::none());
    void* o = DevicePointer(out, Rules("out", 2, ValueBytes(batch), true), device_);
    Check(attention_->Run(batch, a.q, a.rows, row_stride, a.indices, o, Stream(stream)));
  }

  void RunHits(int32_t batch, const py::object& q, const py::object& kv_rows, int64_t row_stride,
               const py::object& indices, const py::object& fill, const py::object& stream) {
    const Args a = Arguments(batch, q, kv_rows, indices, fill);
    Check(attention_->RunHits(batch, a.q, a.rows, row_stride, a.indices, a.fill, Stream(stream)));
  }

  void RunFillsAndMerge(int32_t batch, const py::object& q, const py::object& kv_rows,
                        int64_t row_stride, const py::object& indices, const py::object& fill,
                        const py::object& out, const py::object& stream) {
    const Args a = Arguments(batch, q, kv_rows, indices, fill);
    void* o = DevicePointer(out, Rules("out", 2, ValueBytes(batch), true), device_);
    Check(attention_->RunFillsAndMerge(batch, a.q, a.rows, row_stride, a.indices, a.fill, o,
                                       Stream(stream)));
  }

  void SetSmCountTarget(int32_t sms) { Check(attention_->SetSmCountTarget(sms)); }
  int64_t workspace_bytes() const { return attention_->workspace_bytes(); }
  const SparseMLAOptions& options() const { return attention_->options(); }
  int device() const { return device_; }

 private:
  struct Args {
    const void* q;
    const std::byte* rows;
    const int32_t* indices;
    const uint8_t* fill;
  };

  static DeviceRules Rules(const char* name, int64_t itemsize, int64_t min_bytes, bool output) {
    DeviceRules r{name};
    r.itemsize = itemsize;
    r.min_bytes = min_bytes;
    r.output = output;
    return r;
  }

  // Sizes only for a batch in range: the library refuses the others with its own message.
  int64_t Clamped(int32_t batch) const {
    return batch < 0 || batch > options().max_batch ? 0 : int64_t{batch};
  }
  int64_t ValueBytes(int32_t batch) const {
    return Clamped(batch) * options().heads * kMLAValueDim * 2;
  }

  Args Arguments(int32_t batch, const py::object& q, const py::object& kv_rows,
                 const py::object& indices, const py::object& fill) {
    const SparseMLAOptions& o = options();
    const int64_t entries = Clamped(batch) * o.top_k;
    Args a{};
    a.q = DevicePointer(q, Rules("q", 2, Clamped(batch) * o.heads * kMLAQKDim * 2, false), device_);
    a.rows = static_cast<const std::byte*>(
        DevicePointer(kv_rows, Rules("kv_rows", 0, 0, false), device_));
    DeviceRules idx = Rules("indices", 0, entries * 4, false);
    idx.int32 = true;
    a.indices = static_cast<const int32_t*>(DevicePointer(indices, idx, device_));
    if (!fill.is_none()) {
      a.fill = static_cast<const uint8_t*>(
          DevicePointer(fill, Rules("fill", 1, entries, false), device_));
    }
    return a;
  }

  StreamHandle Stream(const py::object& stream) { return streams_.Resolve(stream, device_); }

  int device_;
  std::unique_ptr<SparseMLAAttention> attention_;
  StreamResolver streams_;
};

class PyProxy {
 public:
  PyProxy(int32_t max_batch, int64_t bytes_per_layer, int32_t num_buffers, int device)
      : device_(device), max_batch_(max_batch) {
    proxy_ = Check(WeightStreamProxy::Create(max_batch, bytes_per_layer, num_buffers, device));
  }

  void Run(int32_t batch, int32_t layer, const py::object& stream) {
    Check(proxy_->Run(batch, layer, streams_.Resolve(stream, device_)));
  }
  void SetSmCountTarget(int32_t sms) { Check(proxy_->SetSmCountTarget(sms)); }
  const WeightStreamProxy& proxy() const { return *proxy_; }
  int device() const { return device_; }
  int32_t max_batch() const { return max_batch_; }

 private:
  int device_;
  int32_t max_batch_;
  std::unique_ptr<WeightStreamProxy> proxy_;
  StreamResolver streams_;
};

void CheckFraction(double value, const char* name) {
  if (!(value >= 0 && value <= 1)) {
    Raise(InvalidArgument(std::string(name) + " must be in [0, 1], got " + std::to_string(value)));
  }
}

// The generator asserts its REQUIRES only in debug builds: the binding checks them all.
class PyTopKGenerator {
 public:
  PyTopKGenerator(const TopKGeneratorOptions& options, int32_t layer, int32_t batch)
      : options_(options), batch_(batch) {
    const TopKGeneratorOptions& o = options;
    if (o.top_k < 1) Raise(InvalidArgument("top_k must be >= 1"));
    if (batch < 1) Raise(InvalidArgument("batch must be >= 1"));
    if (layer < 0) Raise(InvalidArgument("layer must be >= 0"));
    CheckFraction(o.reuse, "reuse");
    CheckFraction(o.early_layer_reuse, "early_layer_reuse");
    CheckFraction(o.recency, "recency");
    CheckFraction(o.cross_layer_overlap, "cross_layer_overlap");
    if (o.sinks < 0) Raise(InvalidArgument("sinks must be >= 0"));
    if (o.early_layers < 0) Raise(InvalidArgument("early_layers must be >= 0"));
    if (o.miss_rate >= 0) {
      CheckFraction(o.miss_rate, "miss_rate");
      if (o.top_k > int64_t{o.fresh_range} + 1) {
        Raise(InvalidArgument("miss-rate mode needs top_k <= fresh_range + 1"));
      }
    }
    if (o.locality) {
      if (o.recency_window < 1) Raise(InvalidArgument("recency_window must be >= 1"));
      if (!(o.zipf_exponent >= 0)) Raise(InvalidArgument("zipf_exponent must be >= 0"));
    }
    generator_ = std::make_unique<LayerTopKGenerator>(options, layer, batch);
  }

  py::array_t<int32_t> Next(const std::vector<int32_t>& seq_lens, const py::object& lower) {
    const int32_t k = options_.top_k;
    if (seq_lens.size() > static_cast<size_t>(batch_)) {
      Raise(InvalidArgument("seq_lens holds " + std::to_string(seq_lens.size()) +
                            " requests, more than the generator's batch " +
                            std::to_string(batch_)));
    }
    for (const int32_t n : seq_lens) {
      if (n < k) Raise(InvalidArgument("seq_lens: every history must hold >= top_k tokens"));
      if (options_.miss_rate >= 0 && n <= options_.fresh_range) {
        Raise(InvalidArgument("seq_lens: miss-rate mode needs histories longer than fresh_range"));
      }
    }
    py::array_t<int32_t> out({static_cast<py::ssize_t>(seq_lens.size()), py::ssize_t{k}});
    const std::span<int32_t> rows(out.mutable_data(), seq_lens.size() * k);
    if (lower.is_none()) {
      generator_->Next(seq_lens, rows);
      return out;
    }
    const auto below =
        py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(lower);
    if (!below || below.size() < static_cast<py::ssize_t>(rows.size())) {
      throw py::value_error("lower: expected int32 rows [len(seq_lens), top_k]");
    }
    generator_->Next(seq_lens, rows, std::span<const int32_t>(below.data(), rows.size()));
    return out;
  }

  void SetMissRate(double rate) {
    if (options_.miss_rate < 0) {
      Raise(FailedPrecondition("set_miss_rate: the generator is not in miss-rate mode"));
    }
    CheckFraction(rate, "miss_rate");
    generator_->set_miss_rate(rate);
  }

  double reuse() const { return generator_->reuse(); }

 private:
  TopKGeneratorOptions options_;
  int32_t batch_;
  std::unique_ptr<LayerTopKGenerator> generator_;
};

}  // namespace

void RegisterAttention(py::module_& m) {
  py::class_<SparseMLAOptions>(m, "SparseMLAOptions", "The shape of a SparseMLAAttention.")
      .def(py::init([](int32_t max_batch, int32_t heads, int32_t top_k, KVRowFormat format,
                       float softmax_scale, const std::string& split) {
             SparseMLAOptions o;
             o.max_batch = max_batch;
             o.heads = heads;
             o.top_k = top_k;
             o.format = format;
             o.softmax_scale = softmax_scale;
             o.split = SplitOf(split);
             return o;
           }),
           py::arg("max_batch"), py::arg("heads") = 128, py::arg("top_k") = 2048,
           py::arg("format") = KVRowFormat::kFp8Row656, py::arg("softmax_scale") = 0.0f,
           py::arg("split") = "gather-first",
           "Options; split 'gather-first' (run_hits only gathers) or 'merge-halves'.")
      .def_readonly("max_batch", &SparseMLAOptions::max_batch, "Largest batch a run accepts.")
      .def_readonly("heads", &SparseMLAOptions::heads, "Query heads per request.")
      .def_readonly("top_k", &SparseMLAOptions::top_k, "Selected rows per request.")
      .def_readonly("format", &SparseMLAOptions::format, "The rows' KVRowFormat.")
      .def_property_readonly("softmax_scale", &SparseMLAOptions::effective_softmax_scale,
                             "Multiplies q . k (1 / sqrt(576) unless given).")
      .def_property_readonly(
          "split",
          [](const SparseMLAOptions& o) {
            return o.split == SparseMLAOptions::Split::kGatherFirst ? "gather-first"
                                                                    : "merge-halves";
          },
          "How run_hits and run_fills_and_merge divide the work.");

  const auto no_stream = py::arg("stream") = py::none();
  py::class_<PyAttention>(m, "SparseMLAAttention",
                          "Sparse MLA decode attention over selected KV rows on one GPU (the C++ "
                          "benchmark's operator): out = attention(q, rows[indices]).")
      .def(py::init<const SparseMLAOptions&, int>(), py::arg("options"), py::arg("device") = 0,
           "Allocates the work buffers; InvalidArgumentError for bad options, UnavailableError "
           "without CUDA or without the device.")
      .def("run", &PyAttention::Run, py::arg("batch"), py::arg("q"), py::arg("kv_rows"),
           py::arg("row_stride"), py::arg("indices"), py::arg("out"), no_stream,
           "Enqueues out = attention for requests [0, batch): q bf16 [batch, heads, 576], "
           "kv_rows one layer's rows (row_stride bytes apart), indices int32 [batch, top_k] "
           "(< 0: masked), out bf16 [batch, heads, 512]. Never synchronises.")
      .def("run_hits", &PyAttention::RunHits, py::arg("batch"), py::arg("q"), py::arg("kv_rows"),
           py::arg("row_stride"), py::arg("indices"), py::arg("fill"), no_stream,
           "The first half of a split run: the entries with fill 0 (uint8 [batch, top_k]).")
      .def("run_fills_and_merge", &PyAttention::RunFillsAndMerge, py::arg("batch"), py::arg("q"),
           py::arg("kv_rows"), py::arg("row_stride"), py::arg("indices"), py::arg("fill"),
           py::arg("out"), no_stream,
           "The second half: the entries with fill 1, then out (after run_hits, same stream).")
      .def("set_sm_count_target", &PyAttention::SetSmCountTarget, py::arg("sms"),
           "The SMs cuBLAS plans the GEMMs for; 0: all.")
      .def_property_readonly("workspace_bytes", &PyAttention::workspace_bytes,
                             "Device bytes of the work buffers.")
      .def_property_readonly("options", &PyAttention::options, "The SparseMLAOptions.")
      .def_property_readonly("device", &PyAttention::device, "The CUDA device.");

  py::class_<PyProxy>(m, "WeightStreamProxy",
                      "The rest of a decode step's layer as one bf16 GEMM that streams about "
                      "bytes_per_layer of weights from HBM (the C++ benchmark's proxy).")
      .def(py::init<int32_t, int64_t, int32_t, int>(), py::arg("max_batch"),
           py::arg("bytes_per_layer"), py::arg("num_buffers") = 2, py::arg("device") = 0,
           "Allocates and fills num_buffers weight matrices; InvalidArgumentError for an "
           "argument < 1, UnavailableError without CUDA or without the device.")
      .def(
          "run",
          [](PyProxy& p, int32_t batch, int32_t layer, const py::object& stream) {
            p.Run(batch, layer, stream);
          },
          py::arg("batch"), py::arg("layer"), no_stream,
          "Enqueues the GEMM of rows [0, batch) with weight buffer layer % num_buffers.")
      .def("set_sm_count_target", &PyProxy::SetSmCountTarget, py::arg("sms"),
           "The SMs cuBLAS plans the GEMM for; 0: all.")
      .def_property_readonly(
          "bytes_per_layer", [](const PyProxy& p) { return p.proxy().bytes_per_layer(); },
          "Weight bytes one run streams.")
      .def_property_readonly(
          "device_bytes", [](const PyProxy& p) { return p.proxy().device_bytes(); },
          "Device bytes held.")
      .def_property_readonly(
          "out_features", [](const PyProxy& p) { return p.proxy().out_features(); },
          "n of the weight [n, 7168].")
      .def_property_readonly("max_batch", &PyProxy::max_batch, "Largest batch a run accepts.")
      .def_property_readonly("device", &PyProxy::device, "The CUDA device.");

  py::class_<TopKGeneratorOptions>(m, "TopKGeneratorOptions",
                                   "The synthetic top-k workload's parameters "
                                   "(sparsekv/topk_generator.h).")
      .def(py::init<>(), "The defaults: the four-source mode (sinks, reuse, recency, uniform).")
      .def_readwrite("top_k", &TopKGeneratorOptions::top_k, "K: positions per row.")
      .def_readwrite("reuse", &TopKGeneratorOptions::reuse,
                     "Fraction of K taken from the previous step's row.")
      .def_readwrite("early_layer_reuse", &TopKGeneratorOptions::early_layer_reuse,
                     "reuse for the layers below early_layers.")
      .def_readwrite("early_layers", &TopKGeneratorOptions::early_layers,
                     "Layers that use early_layer_reuse.")
      .def_readwrite("recency", &TopKGeneratorOptions::recency,
                     "Fraction of K drawn from the newest positions.")
      .def_readwrite("sinks", &TopKGeneratorOptions::sinks,
                     "Positions 0 .. sinks-1 are always selected.")
      .def_readwrite("seed", &TopKGeneratorOptions::seed, "The random seed.")
      .def_readwrite("miss_rate", &TopKGeneratorOptions::miss_rate,
                     ">= 0: miss-rate mode, F = miss_rate * K (to the nearest integer) fresh "
                     "positions per row.")
      .def_readwrite("fresh_range", &TopKGeneratorOptions::fresh_range,
                     "Miss-rate mode: fresh positions come from [0, fresh_range).")
      .def_readwrite("locality", &TopKGeneratorOptions::locality,
                     "Locality mode: the miss rate is an outcome that falls with the cache size.")
      .def_readwrite("zipf_exponent", &TopKGeneratorOptions::zipf_exponent,
                     "Locality mode: P(rank r) ~ (r + 1)^-zipf_exponent.")
      .def_readwrite("recency_window", &TopKGeneratorOptions::recency_window,
                     "Locality mode: the recent source's newest positions.")
      .def_readwrite("cross_layer_overlap", &TopKGeneratorOptions::cross_layer_overlap,
                     "Share of a row shared with the layer below (next's `lower`).");

  m.def(
      "locality_preset",
      [](const std::string& name) {
        const std::optional<TopKGeneratorOptions> o = LocalityPreset(name);
        if (!o.has_value()) {
          std::string names;
          for (const std::string_view n : kLocalityPresets) {
            names += (names.empty() ? "" : ", ") + std::string(n);
          }
          Raise(InvalidArgument("locality_preset: unknown name '" + name + "' (known: " + names +
                                ")"));
        }
        return *o;
      },
      py::arg("name"),
      "A fitted locality-mode TopKGeneratorOptions: 'glm5-published' (the benchmark's "
      "calibrated workload) or 'smollm2'.");

  py::class_<PyTopKGenerator>(m, "LayerTopKGenerator",
                              "One layer's synthetic top-k rows for a fixed batch, step after "
                              "step (the C++ benchmark's workload; CPU only).")
      .def(py::init<const TopKGeneratorOptions&, int32_t, int32_t>(), py::arg("options"),
           py::arg("layer"), py::arg("batch"),
           "InvalidArgumentError for options out of range, a batch < 1 or a layer < 0.")
      .def("next", &PyTopKGenerator::Next, py::arg("seq_lens"), py::arg("lower") = py::none(),
           "One step's rows, int32 [len(seq_lens), top_k]; `lower`: the layer below's rows of "
           "the same step (cross_layer_overlap).")
      .def("set_miss_rate", &PyTopKGenerator::SetMissRate, py::arg("miss_rate"),
           "Miss-rate mode: the rate from the next call on.")
      .def_property_readonly("reuse", &PyTopKGenerator::reuse,
                             "The reuse fraction this layer applies.");
}

}  // namespace sparsekv
