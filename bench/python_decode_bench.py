#!/usr/bin/env python3
"""A decode benchmark driven from Python: the package's StepSchedule (or the SGLang-shaped
adapter, sparsekv.sglang_adapter.SparseKVCoordinator) runs every step, as an engine written in
Python would drive it, and the benchmark prints the C++ bench's definition of throughput:

    tok/s = batch * 1000 / TPOT ms, TPOT the mean time of a timed step (steps after --warmup)

Run (from the repository root, with the package installed: `pip install .`):

    python bench/python_decode_bench.py --device cuda --context 32768 --batch 59 \\
        --miss-rate 0.2 --json python.json                       # through StepSchedule
    python bench/python_decode_bench.py --device cuda ... --path adapter --json adapter.json

Each step: plan_step for the batch; per layer, the layer's new KV rows and its index group's
top-k go to run_layer (the adapter: append_token_kv, then swap_in_selected_pages), and the
attention callable, per slice of the batch, gathers the top-k rows of the slots from the hot cache
and reduces them against a query (on the GPU: torch; on the CPU backend: numpy); after each layer
a proxy for the rest of the model reads --weights-gb / layers of device memory (the C++ bench
streams the same bytes per step). Then finish_step.

What is the same as `sparsekv bench --hybrid --miss-rate R`: the model's shape (DeepSeek-V3.2:
61 layers, 656-byte rows, top-k 2048, one top-k per layer), the manager's options as the bench
sizes them for the batch (hot slots from --hot-slots; at batch 59 no request is resident), the
automatic schedule's two trials per candidate, the tok/s definition. What is not: the
attention and the proxy are torch operations, not the bench's sparse MLA kernel and weight
stream; the top-k is this script's uncorrelated-miss workload (each step, a fraction R of every
request's previous top-k is replaced by fresh uniform positions of its history, independently per
layer; the rest hits), not the bench's generator, and there is no calibrated-locality workload (its
feed is the C++ bench's); the manager keeps no indexer keys (the C++ bench's --hybrid appends them
too); the prompt rows are zeros; steps run eagerly (no CUDA graph). The ratio to the C++ bench
therefore bounds what driving the step from Python costs, with these stand-ins.

--device cpu runs the same loop on the CPU backend (small sizes; what the package's tests run),
with --check comparing every row attention read with the rows written.
"""
import argparse
import json
import sys
import time

import numpy as np

import sparsekv

ROW_BYTES = 656  # DeepSeek-V3.2's fp8 latent row
LAYERS = 61
TOP_K = 2048


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
                   help="fraction of each request's top-k replaced by fresh positions per step")
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
    """Per request, its top-k of the last step; each step a fraction `rate` of it is replaced by
    fresh uniform positions of the history (those miss unless the hot cache kept them), the rest
    repeats (and hits)."""

    def __init__(self, rng, batch, top_k, context, rate):
        self.rng, self.top_k, self.rate = rng, top_k, rate
        self.topk = np.stack([rng.choice(context, top_k, replace=False) for _ in range(batch)])
        self.topk = self.topk.astype(np.int32)

    def next(self, lengths):
        fresh = int(self.rate * self.top_k + 0.5)
        for b, length in enumerate(lengths):
            if fresh == 0:
                break
            k = self.rng.choice(self.top_k, fresh, replace=False)
            self.topk[b, k] = self.rng.integers(0, length, fresh, dtype=np.int32)
        return self.topk


class CpuOps:
    """numpy on the CPU backend, whose device memory is host memory: every call runs at once."""

    def __init__(self, a, manager):
        self.hot = [np.asarray(manager.hot_layer(l)) for l in range(a.layers)]
        self.query = np.random.default_rng(a.seed).standard_normal(
            (a.heads, a.row_bytes)).astype(np.float32)
        self.out = np.zeros((a.batch, a.heads), np.float32)
        self.read = None  # with --check: [layer][batch] -> rows read
        self.weights = np.zeros(int(a.weights_gb * 1e9 / a.layers), np.uint8) \
            if a.weights_gb > 0 else None

    def buffer(self, array):
        return np.ascontiguousarray(array)

    def attend(self, layer, slots, first, rows):
        idx = np.asarray(slots[first:first + rows])
        kv = self.hot[layer][np.maximum(idx, 0)].astype(np.float32)  # [rows, top_k, row_bytes]
        scores = np.einsum("hd,bkd->bhk", self.query, kv)
        scores[np.broadcast_to((idx < 0)[:, None, :], scores.shape)] = -np.inf
        self.out[first:first + rows] = scores.max(axis=2)
        if self.read is not None:
            self.read[layer][first:first + rows] = np.where(
                (idx >= 0)[:, :, None], self.hot[layer][np.maximum(idx, 0)], 0)

    def proxy(self):
        if self.weights is not None:
            self.weights.sum()

    def synchronize(self):
        pass


class CudaOps:
    """torch on the CUDA backend, on the current stream."""

    def __init__(self, a, manager):
        import torch
        self.torch = torch
        self.hot = [torch.as_tensor(manager.hot_layer(l), device="cuda") for l in range(a.layers)]
        g = torch.Generator(device="cpu").manual_seed(a.seed)
        self.query = torch.randn(a.heads, a.row_bytes // 2, generator=g).to(
            "cuda", torch.bfloat16)
        self.out = torch.zeros(a.batch, a.heads, device="cuda", dtype=torch.float32)
        self.weights = torch.zeros(int(a.weights_gb * 1e9 / a.layers) // 2, device="cuda",
                                   dtype=torch.bfloat16) if a.weights_gb > 0 else None
        self.read = None

    def buffer(self, array):
        return self.torch.from_numpy(np.ascontiguousarray(array)).to("cuda")

    def attend(self, layer, slots, first, rows):
        torch = self.torch
        idx = slots[first:first + rows].long()
        # The fp8 row read as bf16 pairs: the bytes attention moves, not its arithmetic.
        kv = self.hot[layer][idx.clamp(min=0)].view(torch.bfloat16)[..., : self.query.shape[1]]
        scores = torch.einsum("hd,bkd->bhk", self.query, kv).float()
        scores.masked_fill_((idx < 0)[:, None, :], float("-inf"))
        self.out[first:first + rows] = torch.softmax(scores, dim=2).amax(dim=2)

    def proxy(self):
        if self.weights is not None:
            self.weights.sum()

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

    # A top-k per layer, drawn independently (uncorrelated across layers, as the C++ bench's
    # miss-rate workload).
    feeds = [TopKFeed(rng, a.batch, a.top_k, a.context, a.miss_rate) for _ in range(a.layers)]
    slots = ops.buffer(np.zeros((a.batch, a.top_k), np.int32))
    lengths = [a.context] * a.batch
    times, misses, lookups = [], 0, 0
    for step in range(a.steps):
        new_rows = [ops.buffer(rng.integers(0, 256, (a.batch, a.row_bytes), dtype=np.uint8))
                    for _ in range(a.layers)] if a.check else None
        zero_rows = ops.buffer(np.zeros((a.batch, a.row_bytes), np.uint8))
        topk_host = [feed.next(lengths) for feed in feeds]
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
                    ops.attend(l, slots, first, count)
                schedule.run_layer(layer, rows, topk[layer], slots, attend)
            ops.proxy()
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
    out.write(f"sparsekv python ({a.path}) @{context} miss {a.miss_rate:g} - batch "
              f"{a.batch}: TPOT {tpot_ms:.2f} ms, {tokens_per_s:.0f} tok/s, "
              f"missed {misses / max(lookups, 1):.1%}, schedule {chosen}\n")
    result = {
        "driver": a.path,
        "command": " ".join(["python_decode_bench.py"] + sys.argv[1:]),
        "device": a.device,
        "points": [{
            "variant": "sparsekv", "context": a.context, "miss_rate_target": a.miss_rate,
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
