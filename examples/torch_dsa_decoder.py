"""A small DSA-style decoder in torch that decodes through sparsekv inside a CUDA graph.

Every layer of the model (random weights) has a lightning indexer: its keys (one small vector per
token) stay in HBM, it scores every past token and picks the top-k; attention then reads only those
k KV rows. Two copies of the model decode the same requests side by side:

  * dense:    every token's KV row stays in HBM (the baseline); attention gathers the top-k rows
              from that full cache.
  * sparsekv: the full history lives in host memory; per layer, the newest row goes to the
              manager (append_token_kv) and the top-k positions go through the SGLang-shaped
              adapter (swap_in_selected_pages), which runs the layer through the library's step
              schedule (here fixed to the cross-layer prefetch: each layer's top-k also brings
              the next layer's rows in on a side stream) and returns slots of the hot cache;
              attention gathers the rows there. Decode steps from the second on run as one
              captured torch.cuda.CUDAGraph, replayed with new inputs.

Both compute the same rows in the same order with the same kernels, so the check is exact: the
logits of every step must be bitwise equal (torch.equal), and so must the greedy tokens.

Run (needs a CUDA GPU, torch, and `pip install .` from the repository root):
    python examples/torch_dsa_decoder.py
Without CUDA it prints a skip message and exits 0.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, List

import torch

# Model and cache shapes: small, but with real misses (hot_slots < history) and eviction.
NUM_LAYERS = 3
D_MODEL = 256
HEADS = 8
D_KV = 128  # one KV row: 128 bf16 = 256 bytes (latent KV, as in absorbed MLA)
D_V = 96  # values are the first D_V dims of the row
INDEX_HEADS = 4
D_INDEX = 32
VOCAB = 1000
TOP_K = 64
HOT_SLOTS = 128
WINDOW = 4
PROMPT_LENS = [100, 333, 517, 900]
STEPS = 24
MAX_CONTEXT = 1024


@dataclass
class Request:
    rid: str
    req_pool_idx: int
    prompt_kv: List[torch.Tensor]  # per layer, bf16 [prompt_len, D_KV]
    index_keys: List[torch.Tensor]  # per layer, bf16 [prompt_len, D_INDEX]


class Weights:
    def __init__(self, device: torch.device):
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(device, torch.bfloat16)

        self.embed = w(VOCAB, D_MODEL) * VOCAB**0.5
        self.out = w(D_MODEL, VOCAB)
        self.kv = [w(D_MODEL, D_KV) for _ in range(NUM_LAYERS)]
        self.q = [w(D_MODEL, HEADS * D_KV) for _ in range(NUM_LAYERS)]
        self.o = [w(HEADS * D_V, D_MODEL) for _ in range(NUM_LAYERS)]
        self.index_q = [w(D_MODEL, INDEX_HEADS * D_INDEX) for _ in range(NUM_LAYERS)]
        self.index_k = [w(D_MODEL, D_INDEX) for _ in range(NUM_LAYERS)]
        self.index_w = [w(D_MODEL, INDEX_HEADS) for _ in range(NUM_LAYERS)]


# attend(layer, new_kv [B, D_KV], topk int32 [B, TOP_K])
#   -> (rows [B, TOP_K, D_KV], valid [B, TOP_K])
Attend = Callable[[int, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


class Decoder:
    """The model and its per-request decode state. Every buffer is static, so that a step can be
    captured into a CUDA graph: inputs are updated in place between replays."""

    def __init__(self, weights: Weights, batch: int, device: torch.device):
        self.w = weights
        self.batch = torch.arange(batch, device=device)
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)  # next input tokens
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)  # of the new token
        self.logits = torch.zeros(batch, VOCAB, dtype=torch.float32, device=device)
        # The indexer's keys of every token stay in HBM (the engine owns them).
        self.index_keys = torch.zeros(NUM_LAYERS, batch, MAX_CONTEXT, D_INDEX,
                                      dtype=torch.bfloat16, device=device)
        self.all_positions = torch.arange(MAX_CONTEXT, device=device)

    def layer(self, layer: int, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        w = self.w
        new_kv = x @ w.kv[layer]
        self.index_keys[layer, self.batch, self.positions] = x @ w.index_k[layer]
        # Lightning indexer: score(t) = sum_h weight_h * relu(q_h . key_t), over every token.
        q_index = (x @ w.index_q[layer]).view(-1, INDEX_HEADS, D_INDEX).float()
        scores = torch.einsum("bhd,btd->bht", q_index, self.index_keys[layer].float())
        scores = (scores.relu() * (x @ w.index_w[layer]).float()[..., None]).sum(1)
        future = self.all_positions[None, :] > self.positions[:, None]
        scores = scores.masked_fill(future, float("-inf"))
        values, topk = scores.topk(TOP_K, dim=1)
        topk = torch.where(values == float("-inf"), -1, topk).to(torch.int32)
        rows, valid = attend(layer, new_kv, topk)
        # Sparse MQA over the selected rows (absorbed-MLA shape: values are a prefix of the row).
        q = (x @ w.q[layer]).view(-1, HEADS, D_KV).float()
        logits = torch.einsum("bhc,bkc->bhk", q, rows.float()) * D_KV**-0.5
        probs = logits.masked_fill(~valid[:, None, :], float("-inf")).softmax(-1)
        out = torch.einsum("bhk,bkv->bhv", probs, rows[..., :D_V].float())
        return x + out.reshape(x.shape[0], HEADS * D_V).to(torch.bfloat16) @ w.o[layer]

    def step(self, attend: Attend) -> None:
        """One decode step: greedy next tokens into self.tokens, logits into self.logits."""
        x = self.w.embed[self.tokens]
        for layer in range(NUM_LAYERS):
            x = self.layer(layer, x, attend)
        self.logits.copy_(x.float() @ self.w.out.float())
        self.tokens.copy_(self.logits.argmax(-1))

    def advance(self) -> None:
        self.positions += 1


def make_prompts(weights: Weights, device: torch.device) -> List[Request]:
    """Stand-in for prefill: each prompt token's hidden state per layer is random; its KV row and
    indexer key follow from the weights, as the decode step computes them."""
    g = torch.Generator(device="cpu").manual_seed(1)
    requests = []
    for b, n in enumerate(PROMPT_LENS):
        hidden = [torch.randn(n, D_MODEL, generator=g).to(device, torch.bfloat16)
                  for _ in range(NUM_LAYERS)]
        kv = [h @ weights.kv[layer] for layer, h in enumerate(hidden)]
        keys = [h @ weights.index_k[layer] for layer, h in enumerate(hidden)]
        requests.append(Request(f"req-{b}", b, kv, keys))
    return requests


def start(decoder: Decoder, requests: List[Request]) -> None:
    for b, req in enumerate(requests):
        n = len(req.prompt_kv[0])
        for layer in range(NUM_LAYERS):
            decoder.index_keys[layer, b, :n] = req.index_keys[layer]
        decoder.positions[b] = n
        decoder.tokens[b] = b + 1


def main() -> int:
    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA device; this example needs a GPU")
        return 0
    import sparsekv
    from sparsekv.sglang_adapter import RequestInfo, SparseKVCoordinator

    if not sparsekv.cuda_compiled():
        print("skip: sparsekv was built without the CUDA backend")
        return 0
    device = torch.device("cuda:0")
    weights = Weights(device)
    requests = make_prompts(weights, device)
    batch = len(requests)

    # --- Dense baseline: every KV row in HBM. ---
    dense = Decoder(weights, batch, device)
    start(dense, requests)
    kv_full = torch.zeros(NUM_LAYERS, batch, MAX_CONTEXT, D_KV, dtype=torch.bfloat16,
                          device=device)
    for b, req in enumerate(requests):
        for layer in range(NUM_LAYERS):
            kv_full[layer, b, : len(req.prompt_kv[layer])] = req.prompt_kv[layer]

    def dense_attend(layer, new_kv, topk):
        kv_full[layer, dense.batch, dense.positions] = new_kv
        rows = kv_full[layer, dense.batch[:, None], topk.clamp(min=0).long()]
        return rows, topk >= 0

    # --- sparsekv: history in host memory, hot cache in HBM, through the SGLang adapter. ---
    options = sparsekv.CacheOptions(
        geometry=sparsekv.KVGeometry.uniform(NUM_LAYERS, D_KV * 2),
        top_k=TOP_K, hot_slots=HOT_SLOTS, window=WINDOW,
        host_capacity_tokens=batch * MAX_CONTEXT, max_requests=batch, max_context=MAX_CONTEXT,
        max_prefetch=TOP_K)
    manager = sparsekv.SparseKVCacheManager(options, sparsekv.cuda_backend(0))
    coordinator = SparseKVCoordinator(
        manager,
        request_info=lambda r: RequestInfo(r.rid, r.req_pool_idx, len(r.prompt_kv[0]), STEPS + 1),
        prompt_kv=lambda r, layer: r.prompt_kv[layer],
        # One choice for every step, so that one captured graph serves them all ("auto" measures
        # and may change the choice: an engine then keeps a graph per choice).
        schedule="prefetch")
    for req in requests:
        coordinator.admit_request_into_staging(req)
    assert coordinator.collect_ready_reqs() == requests
    sparse = Decoder(weights, batch, device)
    start(sparse, requests)
    hot = [coordinator.layer_kv(layer).view(torch.bfloat16) for layer in range(NUM_LAYERS)]
    req_pool_indices = torch.tensor([r.req_pool_idx for r in requests], device=device)

    def sparse_attend(layer, new_kv, topk):
        coordinator.append_token_kv(layer, new_kv)
        slots = coordinator.swap_in_selected_pages(req_pool_indices, None, topk, layer)
        return hot[layer][slots.clamp(min=0).long()], slots >= 0

    def plan_sparse_step():
        seq_lens = (sparse.positions + 1).cpu()
        pool = req_pool_indices.cpu()
        coordinator.map_last_loc_to_buffer(None, None, req_pool_indices, seq_lens, pool)

    graph = torch.cuda.CUDAGraph()
    mismatches = 0
    for step in range(STEPS):
        dense.step(dense_attend)
        plan_sparse_step()
        if step == 0:  # eager: warms up the kernels (cuBLAS handles, ...) before capture
            sparse.step(sparse_attend)
        elif step == 1:  # capture closes this planned step on the host; the replay runs it
            with torch.cuda.graph(graph):
                sparse.step(sparse_attend)
            graph.replay()
        else:
            graph.replay()
            coordinator.finish_replayed_step()
        same = torch.equal(dense.logits, sparse.logits) and torch.equal(dense.tokens,
                                                                          sparse.tokens)
        mismatches += not same
        diff = (dense.logits - sparse.logits).abs().max().item()
        mode = "eager" if step == 0 else "graph capture+replay" if step == 1 else "graph replay"
        print(f"step {step:2d} ({mode:20s}) tokens {sparse.tokens.tolist()} "
              f"max|dlogit| {diff:.3g} {'ok' if same else 'MISMATCH'}")
        dense.advance()
        sparse.advance()

    stats = manager.read_stats()
    total = stats.total
    print(f"top-k lookups: {total.hits} hits, {total.window_hits} window hits, {total.misses} "
          f"misses (hit rate {total.hit_rate:.2f}); {stats.bytes_host_to_device / 1e6:.2f} MB "
          f"host->device, {stats.bytes_device_to_host / 1e3:.1f} KB write-back")
    print(f"KV in HBM: dense {kv_full.numel() * 2 / 1e6:.2f} MB, sparsekv "
          f"{stats.device_bytes / 1e6:.2f} MB (hot cache {HOT_SLOTS}+{WINDOW} slots per request "
          f"and layer, plus tables)")
    schedule = coordinator.schedule.stats()
    print(f"step schedule: {dict(schedule.steps_by_choice)}; {stats.prefetch_rows} rows "
          f"prefetched")
    if mismatches:
        print(f"FAIL: {mismatches} of {STEPS} steps differ from the dense baseline")
        return 1
    print(f"OK: {STEPS} steps bitwise equal to the dense baseline (eager, captured and replayed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
