#!/usr/bin/env python3
"""A decode benchmark driven from Python: the package's StepSchedule (or the SGLang-shaped
adapter, sparsekv.sglang_adapter.SparseKVCoordinator) runs every step, as an engine written in
Python would drive it, and the benchmark prints the C++ bench's definition of throughput:

    tok/s = batch * 1000 / TPOT ms, TPOT the mean time of a timed step (steps after --warmup)

Run (from the repository root, with the package installed: `pip install .`):

    python bench/python_decode_bench.py --device cuda --context 32768 --batch 59 \\
        --miss-rate 0.2 --json python.json                       # through StepSchedule
    python bench/python_decode_bench.py --device cuda ... --path adapter --json adapter.json

Each step: the step's top-k of every layer from the C++ bench's generator
(sparsekv.LayerTopKGenerator, outside the timed part); plan_step for the batch; per layer, the
layer's new KV rows and its index group's top-k go to run_layer (the adapter: append_token_kv,
then swap_in_selected_pages), and the attention callable, per slice of the batch, attends over the
slots' hot-cache rows; after each layer the proxy for the rest of the model runs. Then finish_step.

On the GPU the attention and the proxy are the C++ bench's own operators, bound in the package:
sparsekv.SparseMLAAttention (sparse MLA decode, --heads query heads of 576 dims over the top-k
rows, fp8 656-byte rows) and sparsekv.WeightStreamProxy (one bf16 GEMM per layer streaming
--weights-gb / 61 bytes of weights, the per-layer bytes of the bench's DeepSeek-V3.2 preset
whatever --layers is). The top-k is the bench's workload: --miss-rate R is the generator's
miss-rate mode (fresh positions from the whole prompt, as `sparsekv bench --miss-rate R`),
--locality calibrated its fitted locality preset (as `sparsekv bench --locality calibrated`),
each layer's rows taking the shared positions of the layer below's as the bench's feed does.

What is the same as `sparsekv bench --hybrid`: the model's shape (DeepSeek-V3.2: 61 layers,
656-byte rows, top-k 2048, one top-k per layer), the attention and proxy kernels and their
shapes, the top-k generator and its seed, the manager's options as the bench sizes them for the
batch (hot slots from --hot-slots; at batch 59 no request is resident), the automatic schedule's
two trials per candidate, the tok/s definition. What is not: the manager keeps no indexer keys
(the C++ bench's --hybrid appends them too); the prompt rows are zeros (the bench fills them with
a pattern: the kernels' time does not depend on it); steps run eagerly (no CUDA graph); the
top-k is generated on one thread. The ratio to the C++ bench is therefore what driving the step
from Python costs.

--device cpu runs the same loop on the CPU backend (small sizes; what the package's tests run):
the GPU operators are unavailable there, so attention is a numpy reduction over the same rows and
the proxy reads --weights-gb / 61 bytes per layer of host memory; --check compares every row
attention read with the rows written.
"""
import argparse
import json
import sys
import time

import numpy as np

import sparsekv

ROW_BYTES = 656  # DeepSeek-V3.2's fp8 latent row
LAYERS = 61  # the preset's layer count: the proxy's bytes per layer are --weights-gb / LAYERS
TOP_K = 2048
# The attention's row formats by row size (on the GPU --row-bytes must be one of these).
ROW_FORMATS = {656: "FP8_ROW_656", 1152: "BF16_ROW_1152"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--path", choices=["schedule", "adapter"], default="schedule",
                   help="StepSchedule's run_layer, or the SGLang-shaped adapter's calls")
    p.add_argument("--schedule", default="auto",
                   help="'auto' or a StepChoice ('serial', 'prefetch', 'chunks16', ...)")
    p.add_argument("--context", type=int, default=32768, help="prompt tokens per request")
    p.add_argument("--batch", type=int, default=59)
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--row-bytes", type=int, default=ROW_BYTES)
    p.add_argument("--top-k", type=int, default=TOP_K)
    p.add_argument("--hot-slots", type=int, default=13887,
                   help="hot-cache rows per request and layer (the C++ bench's choice at 32K, "
                   "batch 59, 80-GB host pool: 13887)")
    p.add_argument("--window", type=int, default=1, help="newest tokens always resident")
    p.add_argument("--page-tokens", type=int, default=1024)
    p.add_argument("--miss-rate", type=float, default=0.2,
                   help="the generator's miss-rate mode: fraction of each request's top-k "
                   "replaced by fresh positions per step")
    p.add_argument("--locality", choices=["calibrated"],
                   help="draw the top-k from the generator's calibrated locality preset "
                   "(glm5-published) instead of --miss-rate")
    p.add_argument("--copy-chunk-rows", type=int, default=8,
                   help="CacheOptions.copy_chunk_rows (the schedule's slices; 0: none)")
    p.add_argument("--heads", type=int, default=128, help="query heads of the attention")
    p.add_argument("--weights-gb", type=float, default=84.0,
                   help="the proxy's bytes read per step (0: no proxy)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=26)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_true",
                   help="CPU: check every row attention read against the rows written")
    p.add_argument("--json", help="also write the result as JSON to PATH")
    args = p.parse_args(argv)
    for name in ("context", "batch", "layers", "row_bytes", "top_k", "hot_slots", "window",
                 "page_tokens", "heads", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.miss_rate <= 1:
        p.error("--miss-rate must be in [0, 1]")
    if not 0 <= args.warmup < args.steps:
        p.error("--warmup must be in [0, --steps)")
    if args.top_k > args.context:
        p.error("--top-k must be <= --context")
    if args.device == "cuda" and args.row_bytes not in ROW_FORMATS:
        p.error("--row-bytes on the GPU: 656 (fp8 rows) or 1152 (bf16 rows), the formats the "
                "attention reads")
    if args.check and args.device != "cpu":
        p.error("--check reads the hot cache on the host: --device cpu")
    if args.path == "adapter" and args.schedule != "auto" and "chunks" in args.schedule:
        p.error("--path adapter: the engine attends after the swap-in returns, so the schedule "
                "has no attention slices: --schedule auto, serial or prefetch")
    return args


def cache_options(a):
    max_context = a.context + a.steps + 1
    pages = -(-max_context // a.page_tokens)
    return sparsekv.CacheOptions(
        geometry=sparsekv.KVGeometry.uniform(a.layers, a.row_bytes),
        top_k=a.top_k, hot_slots=a.hot_slots, window=a.window, host_page_tokens=a.page_tokens,
        max_requests=a.batch, max_context=max_context,
        host_capacity_tokens=a.batch * pages * a.page_tokens,
        copy_chunk_rows=a.copy_chunk_rows, max_prefetch=a.top_k)


class TopKFeed:
    """The C++ bench's top-k feed: one sparsekv.LayerTopKGenerator per layer, each layer's rows
    taking the shared positions of the layer below's (cross_layer_overlap), in miss-rate mode
    (fresh positions from [0, context)) or the calibrated locality preset."""

    def __init__(self, a):
        if a.locality == "calibrated":
            o = sparsekv.locality_preset("glm5-published")
        else:
            o = sparsekv.TopKGeneratorOptions()
            o.miss_rate, o.fresh_range, o.cross_layer_overlap = a.miss_rate, a.context, 0.0
        o.top_k, o.seed = a.top_k, a.seed
        self.chained = o.cross_layer_overlap > 0
        self.layers = [sparsekv.LayerTopKGenerator(o, layer, a.batch) for layer in range(a.layers)]

    def next(self, seq_lens):
        """Every layer's rows, int32 [batch, top_k] each, for histories of seq_lens tokens."""
        rows, lower = [], None
        for g in self.layers:
            lower = g.next(seq_lens, lower if self.chained else None)
            rows.append(lower)
        return rows


class CpuOps:
    """numpy on the CPU backend, whose device memory is host memory: every call runs at once."""

    def __init__(self, a, manager):
        self.hot = [np.asarray(manager.hot_layer(l)) for l in range(a.layers)]
        self.query = np.random.default_rng(a.seed).standard_normal(
            (a.heads, a.row_bytes)).astype(np.float32)
        self.out = np.zeros((a.batch, a.heads), np.float32)
        self.read = None  # with --check: [layer][batch] -> rows read
        self.weights = np.zeros(int(a.weights_gb * 1e9 / LAYERS), np.uint8) \
            if a.weights_gb > 0 else None

    def buffer(self, array):
        return np.ascontiguousarray(array)

    def attend(self, layer, slots, first, rows, stream=None):
        idx = np.asarray(slots[first:first + rows])
        kv = self.hot[layer][np.maximum(idx, 0)].astype(np.float32)  # [rows, top_k, row_bytes]
        scores = np.einsum("hd,bkd->bhk", self.query, kv)
        scores[np.broadcast_to((idx < 0)[:, None, :], scores.shape)] = -np.inf
        self.out[first:first + rows] = scores.max(axis=2)
        if self.read is not None:
            self.read[layer][first:first + rows] = np.where(
                (idx >= 0)[:, :, None], self.hot[layer][np.maximum(idx, 0)], 0)

    def proxy(self, layer):
        if self.weights is not None:
            self.weights.sum()

    def synchronize(self):
        pass


class CudaOps:
    """The C++ bench's operators on the CUDA backend: SparseMLAAttention over the hot cache's
    rows and WeightStreamProxy, on the stream the schedule gives (else torch's current one)."""

    def __init__(self, a, manager):
        import torch
        self.torch, self.row_bytes = torch, a.row_bytes
        self.hot = [torch.as_tensor(manager.hot_layer(l), device="cuda") for l in range(a.layers)]
        format = getattr(sparsekv.KVRowFormat, ROW_FORMATS[a.row_bytes])
        self.attention = sparsekv.SparseMLAAttention(
            sparsekv.SparseMLAOptions(a.batch, heads=a.heads, top_k=a.top_k, format=format))
        g = torch.Generator(device="cpu").manual_seed(a.seed)
        self.q = torch.randn(a.batch, a.heads, 576, generator=g).to("cuda", torch.bfloat16)
        self.out = torch.zeros(a.batch, a.heads, 512, device="cuda", dtype=torch.bfloat16)
        self.weights = sparsekv.WeightStreamProxy(a.batch, int(a.weights_gb * 1e9 / LAYERS)) \
            if a.weights_gb > 0 else None
        self.batch = a.batch
        self.read = None

    def buffer(self, array):
        return self.torch.from_numpy(np.ascontiguousarray(array)).to("cuda")

    def attend(self, layer, slots, first, rows, stream=None):
        end = first + rows
        self.attention.run(rows, self.q[first:end], self.hot[layer], self.row_bytes,
                           slots[first:end], self.out[first:end], stream)

    def proxy(self, layer):
        if self.weights is not None:
            self.weights.run(self.batch, layer)

    def synchronize(self):
        self.torch.cuda.synchronize()


def run(a, out=sys.stdout):
    rng = np.random.default_rng(a.seed)
    backend = sparsekv.cpu_backend() if a.device == "cpu" else sparsekv.cuda_backend(0)
    manager = sparsekv.SparseKVCacheManager(cache_options(a), backend)
    ops = (CpuOps if a.device == "cpu" else CudaOps)(a, manager)
    written = {}  # with --check: (request, layer) -> rows
    zeros = ops.buffer(np.zeros((a.context, a.row_bytes), np.uint8))

    def prompt_rows(rid, layer):
        if not a.check:
            return zeros
        rows = rng.integers(0, 256, (a.context, a.row_bytes), dtype=np.uint8)
        written[rid, layer] = list(rows)
        return ops.buffer(rows)

    requests = list(range(1, a.batch + 1))
    coordinator = schedule = None
    if a.path == "adapter":
        # The engine's calls: admission after prefill, a plan per step (request pool rows and
        # lengths), per layer the new rows and the swap-in, whose slots attention reads.
        from sparsekv.sglang_adapter import RequestInfo, SparseKVCoordinator
        coordinator = SparseKVCoordinator(
            manager, schedule=a.schedule,
            request_info=lambda b: RequestInfo(key=b, req_pool_idx=b, prompt_len=a.context,
                                               max_new_tokens=a.steps + 1),
            prompt_kv=lambda b, layer: prompt_rows(b + 1, layer))
        for b in range(a.batch):
            coordinator.admit_request_into_staging(b)
        coordinator.collect_ready_reqs()
        pool_rows = list(range(a.batch))
        pool_rows_device = ops.buffer(np.arange(a.batch, dtype=np.int64))
    else:
        for rid in requests:
            manager.admit(rid, a.context, a.steps + 1)
            for layer in range(a.layers):
                manager.ingest_prompt(rid, layer, prompt_rows(rid, layer))
        # Two timed steps per candidate, as the C++ bench's automatic schedule.
        schedule = sparsekv.StepSchedule(
            manager, fixed=None if a.schedule == "auto" else a.schedule, trials=2)
    ops.synchronize()

    feed = TopKFeed(a)
    slots = ops.buffer(np.zeros((a.batch, a.top_k), np.int32))
    lengths = [a.context] * a.batch
    times, misses, lookups = [], 0, 0
    for step in range(a.steps):
        new_rows = [ops.buffer(rng.integers(0, 256, (a.batch, a.row_bytes), dtype=np.uint8))
                    for _ in range(a.layers)] if a.check else None
        zero_rows = ops.buffer(np.zeros((a.batch, a.row_bytes), np.uint8))
        # As the C++ bench: histories of seq_len = length + 1 tokens (this step's token too).
        topk_host = feed.next([n + 1 for n in lengths])
        topk = [ops.buffer(t) for t in topk_host]
        if a.check:
            ops.read = [np.zeros((a.batch, a.top_k, a.row_bytes), np.uint8)
                        for _ in range(a.layers)]
        if step == a.warmup:
            manager.reset_stats()
        ops.synchronize()
        start = time.perf_counter()
        if coordinator is not None:
            seq_lens = [n + 1 for n in lengths]
            coordinator.map_last_loc_to_buffer(None, None, None, seq_lens, pool_rows)
        else:
            schedule.plan_step(requests)
        for layer in range(a.layers):
            rows = new_rows[layer] if a.check else zero_rows
            if coordinator is not None:
                coordinator.append_token_kv(layer, rows)
                got = coordinator.swap_in_selected_pages(pool_rows_device, None, topk[layer],
                                                         layer)
                ops.attend(layer, got, 0, a.batch)
            else:
                def attend(l, first, count, stream):
                    ops.attend(l, slots, first, count, stream)
                schedule.run_layer(layer, rows, topk[layer], slots, attend)
            ops.proxy(layer)
        if schedule is not None:
            schedule.finish_step()  # the adapter ends the step with the last layer's swap-in
        ops.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
        lengths = [n + 1 for n in lengths]
        if a.check:
            check(a, ops, written, new_rows, topk_host, lengths, requests)
    stats = manager.read_stats()
    total = stats.total
    lookups = total.hits + total.window_hits + total.misses + total.resident_hits
    misses = total.misses
    tpot_ms = 1e3 * float(np.mean(times))
    tokens_per_s = a.batch * 1e3 / tpot_ms
    chosen = str(schedule.choice) if schedule is not None else (
        str(coordinator.schedule.choice) if coordinator.schedule is not None else "manager")
    context = f"{a.context // 1024}K" if a.context % 1024 == 0 else str(a.context)
    workload = "calibrated" if a.locality else f"miss {a.miss_rate:g}"
    out.write(f"sparsekv python ({a.path}) @{context} {workload} - batch "
              f"{a.batch}: TPOT {tpot_ms:.2f} ms, {tokens_per_s:.0f} tok/s, "
              f"missed {misses / max(lookups, 1):.1%}, schedule {chosen}\n")
    result = {
        "driver": a.path,
        "command": " ".join(["python_decode_bench.py"] + sys.argv[1:]),
        "device": a.device,
        "points": [{
            "variant": "sparsekv", "context": a.context,
            "workload": "calibrated" if a.locality else "miss-rate",
            "miss_rate_target": None if a.locality else a.miss_rate,
            "batch": a.batch, "timed_steps": len(times), "tpot_ms": tpot_ms,
            "tokens_per_s": tokens_per_s, "miss_rate": misses / max(lookups, 1),
            "schedule": chosen}],
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


def check(a, ops, written, new_rows, topk, lengths, requests):
    """Every row attention read is the row written at that position (CPU)."""
    for b, rid in enumerate(requests):
        for layer in range(a.layers):
            history = written[rid, layer]
            history.append(np.asarray(new_rows[layer])[b].copy())
            assert len(history) == lengths[b]
            seen = set()
            for k in range(a.top_k):
                p = int(topk[layer][b, k])
                got = ops.read[layer][b, k]
                if p in seen:
                    continue
                seen.add(p)
                if not np.array_equal(got, history[p]):
                    raise AssertionError(f"request {rid} layer {layer} position {p}: attention "
                                         "read another row")


def main(argv=None):
    run(parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
