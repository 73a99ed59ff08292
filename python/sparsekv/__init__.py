"""sparsekv: sparse-attention KV offloading.

The complete KV history of every request lives in host memory; a small hot cache per request lives
in device memory (HBM). At every decode step and layer, the engine's top-k positions are resolved
against the hot cache: hits are used in place, misses are copied in, and the caller gets, per top-k
entry, a slot of the layer's hot cache (``SparseKVCacheManager.hot_layer``: a ``HotLayer`` that
``torch.from_dlpack``, ``torch.as_tensor`` and ``numpy.asarray`` wrap without a copy).

A step, as the engine drives it::

    mgr = sparsekv.SparseKVCacheManager(options, sparsekv.cuda_backend(0))
    mgr.admit(rid, prompt_len, max_new_tokens)           # lifecycle (host side)
    for layer in range(num_layers):
        mgr.ingest_prompt(rid, layer, prompt_kv[layer])  # [prompt_len // r, row_stride] bytes
    mgr.plan_step([rid, ...])                            # plan (host side, between steps)
    for layer in range(num_layers):                      # run (graph-capturable)
        mgr.append_token(layer, new_kv[layer])           # [>= batch, row_stride] bytes
        mgr.run_layer(layer, topk[layer], slots[layer])  # int32 [>= batch, >= top_k] -> [.., top_k]
    mgr.finish_step()

Tensors are passed without copies from any object with ``__array_interface__`` (numpy),
``__dlpack__`` (torch on CPU or CUDA, numpy, CuPy) or ``__cuda_array_interface__``. Checks raise
``TypeError`` (dtype: int32 for top-k and slots; KV rows may have any dtype whose trailing
dimensions hold ``row_stride`` bytes) or ``ValueError`` (shape, C-contiguity, device: the CPU
backend takes host tensors, the CUDA backend tensors on its device, except ``ingest_prompt`` which
also takes host tensors). Errors returned by the library raise a subclass of ``SparseKVError``
that also derives from the matching builtin (``InvalidArgumentError`` is a ``ValueError``,
``NotFoundError`` a ``LookupError``, ...).

Every call that enqueues work takes ``stream``: None (torch's current stream on the backend's
device when the backend is CUDA and torch is importable, else the default stream), an int
``cudaStream_t`` or an object with ``.cuda_stream``. Buffers handed to a call must stay alive until
the stream has reached the work (as for any asynchronous CUDA call).

DeepSeek-V4's layer kinds (``LayerKind.RESIDENT``, ``LayerKind.WINDOW_ONLY``) and raw window
(``CacheOptions.raw_window``) take the entries and the raw rows side by side, and are read in
place rather than resolved::

    mgr.ingest_prompt(rid, layer, entries, window=raw_rows)  # prompt_len // r entries; raw rows
    mgr.append_token(layer, new_entry, window=new_raw_row)   # [>= batch, row_stride] each
    mgr.dense_entries(layer).entries(b)  # a resident layer's entries of batch row b (CPU: numpy)
    mgr.raw_window(layer).rows(b)        # any layer's window rows, oldest first (CPU: numpy)

Shared prefixes and retained conversations (host side)::

    cached = mgr.admit_with_prefix(rid, token_ids, max_new_tokens)  # positions [0, cached) shared
    for layer in range(num_layers):
        mgr.ingest_prompt_suffix(rid, layer, prompt_kv[layer][cached:])
    mgr.plan_step([rid, ...], token_ids=[next_token, ...])  # keeps the request's pages shareable
    mgr.retain(rid)   # ends the request, keeps its full pages indexed for the next turn
    mgr.fork(parent, child, max_new_tokens)                 # a branch sharing all of parent's KV

Hybrid residency (``CacheOptions(hybrid_residency=True, device_budget_bytes=..., hot_slots=0)``):
requests keep their whole KV in HBM while the budget allows and are demoted to hot-cache mode when
an admission needs the room; ``mgr.promote(rid)`` brings one back, ``mgr.is_resident(rid)`` tells,
``choose_hot_cache_shape(options)`` says which slots per request the library picks.

A node pool (``NodePool``) is a host pool in a shared-memory segment that the processes of one
machine attach to: a prefill process writes and seals a prompt in it, and a decode process whose
manager was created over the same pool admits the prompt without copying it::

    pool = sparsekv.NodePool.create(options, max_owners, "my-pool", backend)  # or NodePool.open
    owner = pool.acquire_owner(); pool.reserve(owner, prompt_len)
    for layer in range(num_layers):
        pool.write_prompt_layer(owner, layer, prompt_kv[layer], prompt_len)
    seal = pool.seal(owner, prompt_len)                   # (owner, seal) go to the reader
    mgr = sparsekv.SparseKVCacheManager(pool.with_shape(options), backend, pool=pool)
    mgr.admit_from_node_pool(rid, owner, seal, max_new_tokens)

The peer tier reads misses from another GPU's memory instead of host memory: a lender process
creates a ``PeerRegion`` and writes rows into it; a decoder maps the region and the requests whose
rows it holds (the host pool keeps every row, so a dead lender costs speed, not rows)::

    region = sparsekv.PeerRegion.create(options.geometry, rows, backend)   # the lender
    region.write_rows(layer, first_row, kv[layer], tokens)                 # per layer
    mgr.attach_peer_tier()                                                 # the decoder
    r = mgr.import_peer_region(region.descriptor)
    mgr.admit_from_peer(rid, r, first_row, prompt_len, max_new_tokens)

The step schedule (``StepSchedule``) runs the step's run phase for the engine, in the schedule it
measures and keeps (serial, the cross-layer prefetch, attention in slices fed as their copies land,
or both; ``fixed=`` forces one), with the engine's attention as a callable that enqueues work::

    sched = sparsekv.StepSchedule(mgr)                    # or fixed="chunks16"
    sched.plan_step([rid, ...])                          # sched.choice, sched.reason
    for layer in range(num_layers):
        sched.run_layer(layer, new_kv[layer], topk[layer], slots[layer],
                        attend)                          # attend(layer, first, rows, stream)
    sched.finish_step()

Request ids are Python ints in [0, 2**64); anything else raises ``TypeError`` or
``InvalidArgumentError``. Type stubs (``_core.pyi``) describe every call.

``sparsekv.sglang_adapter`` has the call shape of an engine's sparse attention backend;
``sparsekv.metrics`` has a ``prometheus_client`` collector of the statistics (docs/metrics.md).

``find_preset(name)`` gives a model's shape (``preset_names()``: deepseek-v3.2, glm-5,
deepseek-v4-flash, deepseek-v4-pro, glm-5.3), whose ``geometry()``, ``top_k``,
``indexer_key_bytes`` and ``raw_window`` fill ``CacheOptions``; ``check_served_geometry`` says
whether a manager serves it yet (DeepSeek-V4's and GLM-5.3's layers are described, not served).

The C++ benchmark's GPU operators are bound too, so that a decode driven from Python does the same
work: ``SparseMLAAttention`` (sparse MLA decode attention over the slots' rows, on tensors or raw
device pointers and a stream) and ``WeightStreamProxy`` (the rest of a layer as one GEMM that
streams the layer's weight bytes); without CUDA they raise ``UnavailableError``. Its synthetic
top-k workload is ``LayerTopKGenerator`` (CPU; ``locality_preset("glm5-published")`` is the
benchmark's calibrated workload).
"""

from sparsekv._core import (
    AlreadyExistsError,
    Backend,
    CacheOptions,
    CacheStats,
    CopyStrategy,
    DeadlineExceededError,
    DenseEntries,
    DeviceMemoryUse,
    EvictionPolicy,
    FailedPreconditionError,
    HostMemoryUse,
    HotCacheShape,
    HotLayer,
    IndexerKeys,
    InternalError,
    InvalidArgumentError,
    KVGeometry,
    KVRowFormat,
    LayerKind,
    LayerShape,
    LayerStats,
    LayerTopKGenerator,
    ModelPreset,
    NodePool,
    NotFoundError,
    PeerRegion,
    OutOfRangeError,
    RawWindow,
    ResourceExhaustedError,
    SparseKVCacheManager,
    ScheduleStats,
    SparseKVError,
    SparseMLAAttention,
    SparseMLAOptions,
    StepChoice,
    StepSchedule,
    TopKGeneratorOptions,
    UnavailableError,
    UnimplementedError,
    WeightStreamProxy,
    allowed_choices,
    check_served_geometry,
    choose_hot_cache_shape,
    cpu_backend,
    cuda_backend,
    cuda_compiled,
    find_preset,
    kv_row_bytes,
    locality_preset,
    preset_names,
)
from sparsekv._version import __version__  # the CMake project version, written by the build

__all__ = [
    "AlreadyExistsError",
    "Backend",
    "CacheOptions",
    "CacheStats",
    "CopyStrategy",
    "DeadlineExceededError",
    "DenseEntries",
    "DeviceMemoryUse",
    "EvictionPolicy",
    "FailedPreconditionError",
    "HostMemoryUse",
    "HotCacheShape",
    "HotLayer",
    "IndexerKeys",
    "InternalError",
    "InvalidArgumentError",
    "KVGeometry",
    "KVRowFormat",
    "LayerKind",
    "LayerShape",
    "LayerStats",
    "LayerTopKGenerator",
    "ModelPreset",
    "NodePool",
    "NotFoundError",
    "PeerRegion",
    "OutOfRangeError",
    "RawWindow",
    "ResourceExhaustedError",
    "SparseKVCacheManager",
    "ScheduleStats",
    "SparseKVError",
    "SparseMLAAttention",
    "SparseMLAOptions",
    "StepChoice",
    "StepSchedule",
    "TopKGeneratorOptions",
    "UnavailableError",
    "UnimplementedError",
    "WeightStreamProxy",
    "allowed_choices",
    "check_served_geometry",
    "choose_hot_cache_shape",
    "cpu_backend",
    "cuda_backend",
    "cuda_compiled",
    "find_preset",
    "kv_row_bytes",
    "locality_preset",
    "preset_names",
]
