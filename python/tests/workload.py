"""A randomized workload driven through the binding and the reference model side by side.

Each step checks, for every layer: the slots against the reference's exactly, the bytes at those
slots of the hot layer and the assembled rows against the written history, and that rows past the
batch are not touched. The array "flavour" decides how tensors are made (numpy, torch CPU or torch
CUDA), so that one workload covers every path into the binding.
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np

import sparsekv
from resolve_oracle import ReferenceManager, clock_of, protected_capacity_of

UNTOUCHED = -7  # sentinel in slot rows past the batch


class Flavour:
    """How the workload turns numpy arrays into the tensors the binding gets, and back."""

    def __init__(self, to_tensor: Callable, to_numpy: Callable, hot_layer: Callable):
        self.to_tensor = to_tensor
        self.to_numpy = to_numpy
        self.hot_layer = hot_layer  # HotLayer -> numpy copy

    @staticmethod
    def numpy() -> "Flavour":
        return Flavour(lambda a: a, lambda t: t, lambda v: np.array(np.asarray(v)))


class Workload:
    def __init__(self, manager: sparsekv.SparseKVCacheManager, flavour: Flavour, seed: int):
        self.m = manager
        self.f = flavour
        self.rng = np.random.default_rng(seed)
        o = manager.options
        self.o = o
        self.strides = [layer.row_stride for layer in o.geometry.layers]
        self.row_bytes = [layer.row_bytes for layer in o.geometry.layers]
        self.ref = ReferenceManager(o.hot_slots, o.window, o.max_requests, len(self.strides),
                                    protected_capacity_of(o), clock_of(o))
        self.next_id = 100
        self.live: List[int] = []  # admitted, holding a hot-cache block
        self.retracted: List[int] = []
        self.max_batch = o.effective_max_batch
        self.slots = [self.f.to_tensor(np.zeros((self.max_batch, o.top_k), np.int32))
                      for _ in self.strides]

    def rows(self, n: int, layer: int) -> np.ndarray:
        return self.rng.integers(0, 256, (n, self.strides[layer]), dtype=np.uint8)

    def admit(self) -> None:
        rid = self.next_id
        self.next_id += 1
        prompt_len = int(self.rng.integers(1, 20))
        self.m.admit(rid, prompt_len, self.o.max_context - prompt_len)
        prompt = [self.rows(prompt_len, layer) for layer in range(len(self.strides))]
        for layer, rows in enumerate(prompt):
            self.m.ingest_prompt(rid, layer, self.f.to_tensor(rows))
        self.ref.admit(rid, prompt)
        self.live.append(rid)

    def lifecycle_event(self) -> None:
        """Admits, releases, retracts or resumes one request, as capacity allows."""
        choice = self.rng.integers(0, 4)
        if choice == 0 and len(self.live) + len(self.retracted) < self.o.max_requests:
            self.admit()
        elif choice == 1 and self.live:
            rid = self.live.pop(int(self.rng.integers(0, len(self.live))))
            self.m.release(rid)
            self.ref.release(rid)
        elif choice == 2 and len(self.live) > 1:
            rid = self.live.pop(int(self.rng.integers(0, len(self.live))))
            self.m.retract(rid)
            self.ref.retract(rid)
            self.retracted.append(rid)
        elif choice == 3 and self.retracted:
            rid = self.retracted.pop()
            self.m.resume(rid)
            self.ref.resume(rid)
            self.live.append(rid)

    def topk_row(self, seq_len: int) -> np.ndarray:
        """Mostly recent positions (hits), some old ones (misses), padding, repeats and junk."""
        row = []
        for _ in range(self.o.top_k + 2):  # wider than top_k: exercises topk_stride
            kind = self.rng.integers(0, 10)
            if kind < 5:
                row.append(int(self.rng.integers(max(0, seq_len - 12), seq_len)))
            elif kind < 7:
                row.append(int(self.rng.integers(0, seq_len)))
            elif kind == 7:
                row.append(-1)
            elif kind == 8:
                row.append(row[-1] if row else 0)
            else:
                row.append(int(self.rng.choice([-5, seq_len, seq_len + 3])))
        return np.array(row, np.int32)

    def step(self, run_phase: Callable[[List], None] | None = None) -> None:
        """One decode step over a random batch of the live requests."""
        if not self.live:
            self.admit()
        n = int(self.rng.integers(1, min(len(self.live), self.max_batch) + 1))
        batch = [int(x) for x in self.rng.choice(self.live, n, replace=False)]
        self.m.plan_step(batch)
        self.ref.plan(batch)
        layers = len(self.strides)
        new_rows = [self.rows(self.max_batch, layer) for layer in range(layers)]
        topk = []
        for layer in range(layers):
            self.ref.append(layer, new_rows[layer][:n])
            t = np.full((self.max_batch, self.o.top_k + 2), 12345, np.int32)  # junk past batch
            for b, rid in enumerate(batch):
                t[b] = self.topk_row(self.ref.requests[rid].history[layer].shape[0])
            topk.append(t)
        inputs = [self.f.to_tensor(a) for a in new_rows]
        topk_t = [self.f.to_tensor(a) for a in topk]
        assembled = [self.f.to_tensor(np.full((self.max_batch, self.o.top_k, s), 0xEE, np.uint8))
                     for s in self.strides]
        for layer in range(layers):
            self.slots[layer] = self.f.to_tensor(
                np.full((self.max_batch, self.o.top_k), UNTOUCHED, np.int32))
        run = run_phase or self.run_eagerly
        run([inputs, topk_t, self.slots, assembled])
        for layer in range(layers):
            self.check_layer(layer, batch, topk[layer], self.f.to_numpy(self.slots[layer]),
                             self.f.to_numpy(assembled[layer]))

    def run_eagerly(self, tensors: List) -> None:
        inputs, topk, slots, assembled = tensors
        for layer in range(len(self.strides)):
            self.m.append_token(layer, inputs[layer])
            self.m.run_layer(layer, topk[layer], slots[layer], assembled[layer])
        self.m.finish_step()

    def check_layer(self, layer: int, batch: List[int], topk: np.ndarray, slots: np.ndarray,
                    assembled: np.ndarray) -> None:
        n = len(batch)
        want = self.ref.resolve(layer, topk, self.o.top_k)
        np.testing.assert_array_equal(slots[:n], want, err_msg=f"layer {layer} slots")
        assert (slots[n:] == UNTOUCHED).all(), "rows past the batch were written"
        hot = self.f.hot_layer(self.m.hot_layer(layer))
        nbytes = self.row_bytes[layer]
        for b, rid in enumerate(batch):
            for k in range(self.o.top_k):
                s = want[b, k]
                if s < 0:
                    assert not assembled[b, k, :nbytes].any(), "skipped entry not zeroed"
                    continue
                expected = self.ref.row(rid, layer, int(topk[b, k]))[:nbytes]
                np.testing.assert_array_equal(hot[s, :nbytes], expected)
                np.testing.assert_array_equal(assembled[b, k, :nbytes], expected)

    def check_stats(self) -> None:
        stats = self.m.read_stats()
        for layer, c in enumerate(self.ref.counters):
            got = stats.layers[layer]
            assert (got.hits, got.window_hits, got.misses, got.padding, got.duplicates,
                    got.out_of_range) == (c.hits, c.window_hits, c.misses, c.padding,
                                          c.duplicates, c.out_of_range), f"layer {layer}"
        assert stats.invalid_copy_entries == 0


def run_workload(manager, flavour: Flavour, seed: int, steps: int = 40) -> Workload:
    w = Workload(manager, flavour, seed)
    w.admit()
    for _ in range(steps):
        if w.rng.integers(0, 3) == 0:
            w.lifecycle_event()
        w.step()
    w.check_stats()
    return w
