#include "tools/sparsekv/bench/gpu_trace.h"

#if SPARSEKV_WITH_CUPTI

#include <cuda.h>
#include <cupti.h>  // with the launch calls' parameter structs (generated_*_meta.h)
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sparsekv::tools {
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;  // per activity buffer CUPTI asks for
constexpr size_t kBufferAlign = 8;                // CUPTI's requirement for activity buffers

// What the callbacks share with the tracer. Never destroyed: CUPTI may call back from its own
// thread until the process ends.
struct Shared {
  std::mutex mu;
  bool alive = false;  // a StepTracer exists
  bool buffers_registered = false;
  CUpti_SubscriberHandle subscriber = nullptr;
  // The capture window.
  bool labelling = false;
  std::unordered_map<const void*, int32_t> lane_of_stream;  // CUstream -> lane
  std::unordered_map<uint64_t, int32_t> lane_of_node;       // graph node id (original or clone)
  // The trace.
  std::vector<TraceRecord> records;  // as the buffers complete
};

Shared& S() {
  static Shared* shared = new Shared;
  return *shared;
}

// The streams of the API calls in flight on this thread, innermost last; nullopt for a call that
// names no stream (a runtime call's driver calls nest inside it).
thread_local std::vector<std::optional<const void*>> api_streams;

Status CuptiStatus(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return Status::Ok();
  const char* text = "unknown CUPTI error";
  cuptiGetResultString(result, &text);
  const std::string message = std::string(call) + ": " + text;
  if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    return FailedPrecondition(message + " (another CUPTI client, e.g. a profiler, is attached)");
  }
  return Internal(message);
}

#define SPARSEKV_CUPTI_RETURN_IF_ERROR(call)                         \
  do {                                                               \
    if (Status s_ = CuptiStatus((call), #call); !s_.ok()) return s_; \
  } while (false)

template <typename Params>
const void* StreamField(const void* params) {
  return static_cast<const Params*>(params)->stream;
}
template <typename Params>
const void* HStreamField(const void* params) {
  return static_cast<const Params*>(params)->hStream;
}

// The stream a launch, copy or memset call enqueues on; nullopt for any other call.
std::optional<const void*> CallStream(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                      const void* params) {
  if (params == nullptr) return std::nullopt;
#define SPARSEKV_RUNTIME(name)          \
  case CUPTI_RUNTIME_TRACE_CBID_##name: \
    return StreamField<name##_params>(params);
#define SPARSEKV_DRIVER(name)          \
  case CUPTI_DRIVER_TRACE_CBID_##name: \
    return HStreamField<name##_params>(params);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    switch (cbid) {
      SPARSEKV_RUNTIME(cudaLaunchKernel_v7000)
      SPARSEKV_RUNTIME(cudaLaunchKernel_ptsz_v7000)
      SPARSEKV_RUNTIME(cudaLaunchCooperativeKernel_v9000)
      SPARSEKV_RUNTIME(cudaLaunchCooperativeKernel_ptsz_v9000)
      SPARSEKV_RUNTIME(cudaMemcpyAsync_v3020)
      SPARSEKV_RUNTIME(cudaMemcpyAsync_ptsz_v7000)
      SPARSEKV_RUNTIME(cudaMemcpy2DAsync_v3020)
      SPARSEKV_RUNTIME(cudaMemcpy2DAsync_ptsz_v7000)
      SPARSEKV_RUNTIME(cudaMemcpyBatchAsync_v13000)
      SPARSEKV_RUNTIME(cudaMemsetAsync_v3020)
      SPARSEKV_RUNTIME(cudaMemsetAsync_ptsz_v7000)
      SPARSEKV_RUNTIME(cudaLaunchHostFunc_v10000)
      SPARSEKV_RUNTIME(cudaLaunchHostFunc_ptsz_v10000)
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060: {
        const auto* p = static_cast<const cudaLaunchKernelExC_v11060_params*>(params);
        if (p->config == nullptr) return std::nullopt;
        return static_cast<const void*>(p->config->stream);
      }
      default:
        return std::nullopt;
    }
  }
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    switch (cbid) {
      SPARSEKV_DRIVER(cuLaunchKernel)
      SPARSEKV_DRIVER(cuLaunchKernel_ptsz)
      SPARSEKV_DRIVER(cuLaunchCooperativeKernel)
      SPARSEKV_DRIVER(cuLaunchCooperativeKernel_ptsz)
      SPARSEKV_DRIVER(cuMemcpyAsync)
      SPARSEKV_DRIVER(cuMemcpyAsync_ptsz)
      SPARSEKV_DRIVER(cuMemcpyHtoDAsync_v2)
      SPARSEKV_DRIVER(cuMemcpyHtoDAsync_v2_ptsz)
      SPARSEKV_DRIVER(cuMemcpyDtoHAsync_v2)
      SPARSEKV_DRIVER(cuMemcpyDtoHAsync_v2_ptsz)
      SPARSEKV_DRIVER(cuMemcpyDtoDAsync_v2)
      SPARSEKV_DRIVER(cuMemcpyDtoDAsync_v2_ptsz)
      SPARSEKV_DRIVER(cuMemsetD8Async)
      SPARSEKV_DRIVER(cuMemsetD8Async_ptsz)
      SPARSEKV_DRIVER(cuMemsetD16Async)
      SPARSEKV_DRIVER(cuMemsetD16Async_ptsz)
      SPARSEKV_DRIVER(cuMemsetD32Async)
      SPARSEKV_DRIVER(cuMemsetD32Async_ptsz)
      SPARSEKV_DRIVER(cuLaunchHostFunc)
      SPARSEKV_DRIVER(cuLaunchHostFunc_ptsz)
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
        const auto* p = static_cast<const cuLaunchKernelEx_params*>(params);
        if (p->config == nullptr) return std::nullopt;
        return static_cast<const void*>(p->config->hStream);
      }
      default:
        return std::nullopt;
    }
  }
#undef SPARSEKV_RUNTIME
#undef SPARSEKV_DRIVER
  return std::nullopt;
}

void CUPTIAPI OnCallback(void* /*userdata*/, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void* data) {
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API || domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    const auto* call = static_cast<const CUpti_CallbackData*>(data);
    if (call->callbackSite == CUPTI_API_ENTER) {
      api_streams.push_back(CallStream(domain, cbid, call->functionParams));
    } else if (!api_streams.empty()) {
      api_streams.pop_back();
    }
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
  const auto* resource = static_cast<const CUpti_ResourceData*>(data);
  const auto* graph = static_cast<const CUpti_GraphData*>(resource->resourceDescriptor);
  if (graph == nullptr) return;
  Shared& s = S();
  if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) {
    // The innermost call naming a stream: a captured launch (an instantiation names none, and
    // the nodes it creates are left to the cloning below).
    const auto named =
        std::find_if(api_streams.rbegin(), api_streams.rend(),
                     [](const std::optional<const void*>& v) { return v.has_value(); });
    if (named == api_streams.rend()) return;
    uint64_t id = 0;
    if (cuptiGetGraphNodeId(graph->node, &id) != CUPTI_SUCCESS) return;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.labelling) return;
    const auto [it, added] =
        s.lane_of_stream.try_emplace(**named, static_cast<int32_t>(s.lane_of_stream.size()));
    s.lane_of_node[id] = it->second;
  } else if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) {
    uint64_t original = 0, clone = 0;
    if (cuptiGetGraphNodeId(graph->originalNode, &original) != CUPTI_SUCCESS ||
        cuptiGetGraphNodeId(graph->node, &clone) != CUPTI_SUCCESS) {
      return;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.lane_of_node.find(original); it != s.lane_of_node.end()) {
      s.lane_of_node[clone] = it->second;
    }
  }
}

std::string Demangled(const char* name) {
  if (name == nullptr) return "(unnamed kernel)";
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  return out;
}

std::string MemcpyName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

void CUPTIAPI OnBufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI OnBufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<TraceRecord> parsed;
  CUpti_Activity* activity = nullptr;
  while (buffer != nullptr &&
         cuptiActivityGetNextRecord(buffer, valid, &activity) == CUPTI_SUCCESS) {
    TraceRecord r;
    switch (activity->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
        r.kind = TraceKind::kKernel;
        r.name = Demangled(k->name);
        r.start_ns = k->start;
        r.end_ns = k->end;
        r.stream_id = k->streamId;
        r.graph_node_id = k->graphNodeId;
        r.grid = {k->gridX, k->gridY, k->gridZ};
        r.block = {k->blockX, k->blockY, k->blockZ};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(activity);
        r.kind = TraceKind::kMemcpy;
        r.name = MemcpyName(m->copyKind);
        r.start_ns = m->start;
        r.end_ns = m->end;
        r.stream_id = m->streamId;
        r.graph_node_id = m->graphNodeId;
        r.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(activity);
        r.kind = TraceKind::kMemset;
        r.name = "memset";
        r.start_ns = m->start;
        r.end_ns = m->end;
        r.stream_id = m->streamId;
        r.graph_node_id = m->graphNodeId;
        r.bytes = m->bytes;
        break;
      }
      default:
        continue;
    }
    parsed.push_back(std::move(r));
  }
  {
    Shared& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    for (TraceRecord& r : parsed) s.records.push_back(std::move(r));
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

bool StepTracer::Available() { return true; }

StatusOr<std::unique_ptr<StepTracer>> StepTracer::Create() {
  Shared& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.alive) return FailedPrecondition("StepTracer: one is alive already (one per process)");
    s.alive = true;
  }
  std::unique_ptr<StepTracer> tracer(new StepTracer);  // from here, its destructor cleans up
  CUpti_SubscriberHandle subscriber = nullptr;
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiSubscribe(&subscriber, OnCallback, nullptr));
  s.subscriber = subscriber;
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                                     CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED));
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiEnableCallback(1, s.subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                                     CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED));
  if (!s.buffers_registered) {  // once per process: they outlive every tracer
    SPARSEKV_CUPTI_RETURN_IF_ERROR(
        cuptiActivityRegisterCallbacks(OnBufferRequested, OnBufferCompleted));
    s.buffers_registered = true;
  }
  return tracer;
}

StepTracer::~StepTracer() {
  Shared& s = S();
  if (started_) {
    for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  }
  if (s.buffers_registered) cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (s.subscriber != nullptr) {
    cuptiEnableDomain(0, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    cuptiEnableDomain(0, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    cuptiUnsubscribe(s.subscriber);
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.subscriber = nullptr;
  s.labelling = false;
  s.lane_of_stream.clear();
  s.lane_of_node.clear();
  s.records.clear();
  s.alive = false;
}

Status StepTracer::BeginCapture(cudaStream_t origin) {
  Shared& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.labelling) return FailedPrecondition("StepTracer::BeginCapture: a window is open");
    s.lane_of_stream.clear();
    s.lane_of_node.clear();
    s.lane_of_stream[origin] = kMainLane;
    s.labelling = true;
  }
  api_streams.clear();
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiEnableDomain(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API));
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiEnableDomain(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API));
  return Status::Ok();
}

Status StepTracer::EndCapture() {
  Shared& s = S();
  const Status runtime =
      CuptiStatus(cuptiEnableDomain(0, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API), "runtime");
  const Status driver =
      CuptiStatus(cuptiEnableDomain(0, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API), "driver");
  api_streams.clear();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.labelling = false;
  }
  SPARSEKV_RETURN_IF_ERROR(runtime);
  return driver;
}

Status StepTracer::Start() {
  if (started_) return FailedPrecondition("StepTracer::Start: already started");
  Shared& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.records.clear();
  }
  size_t dropped = 0;  // reset CUPTI's count
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  started_ = true;
  for (CUpti_ActivityKind kind : kKinds) {
    SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiActivityEnable(kind));
  }
  return CuptiStatus(cuptiGetTimestamp(&window_start_ns_), "cuptiGetTimestamp");
}

StatusOr<TraceCapture> StepTracer::Stop() {
  if (!started_) return FailedPrecondition("StepTracer::Stop: not started");
  TraceCapture c;
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiGetTimestamp(&c.window_end_ns));
  started_ = false;
  for (CUpti_ActivityKind kind : kKinds) {
    SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiActivityDisable(kind));
  }
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  size_t dropped = 0;
  SPARSEKV_CUPTI_RETURN_IF_ERROR(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
  c.dropped_records = dropped;
  Shared& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  c.window_start_ns = window_start_ns_;
  c.lanes = static_cast<int32_t>(s.lane_of_stream.size());
  c.records = std::move(s.records);
  s.records.clear();
  for (TraceRecord& r : c.records) {
    const auto it =
        r.graph_node_id != 0 ? s.lane_of_node.find(r.graph_node_id) : s.lane_of_node.end();
    r.lane = it != s.lane_of_node.end() ? it->second : kUnknownLane;
  }
  std::stable_sort(
      c.records.begin(), c.records.end(),
      [](const TraceRecord& a, const TraceRecord& b) { return a.start_ns < b.start_ns; });
  return c;
}

}  // namespace sparsekv::tools

#else  // !SPARSEKV_WITH_CUPTI

namespace sparsekv::tools {

bool StepTracer::Available() { return false; }

StatusOr<std::unique_ptr<StepTracer>> StepTracer::Create() {
  return Unavailable("step tracing needs CUPTI, and this build has none (SPARSEKV_CUPTI)");
}

StepTracer::~StepTracer() = default;
Status StepTracer::BeginCapture(cudaStream_t) { return Unavailable("no CUPTI"); }
Status StepTracer::EndCapture() { return Unavailable("no CUPTI"); }
Status StepTracer::Start() { return Unavailable("no CUPTI"); }
StatusOr<TraceCapture> StepTracer::Stop() { return Unavailable("no CUPTI"); }

}  // namespace sparsekv::tools

#endif  // SPARSEKV_WITH_CUPTI
