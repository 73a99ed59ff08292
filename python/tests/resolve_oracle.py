"""A pure-Python model of the manager: the independent test oracle the binding is checked against.

Written apart from the library's own policy code (the CPU reference backend, src/cpu/
reference_ops.cc, which the manager and `sparsekv replay` run) on purpose: a misreading of the
semantics would have to be made twice, in two languages, to pass unnoticed. Tests only.

It follows the semantics in include/sparsekv/kernel_views.h (ResolveView, exact) and
include/sparsekv/hot_cache.h (blocks taken lowest first; a taken block starts empty with LRU
order 0..C-1, or with the clock every count 0 and the hand at 0), and keeps each request's full
history, so that it predicts both the slot of every
top-k entry and the bytes that slot must hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np


@dataclass
class Counters:
    hits: int = 0
    window_hits: int = 0
    misses: int = 0
    padding: int = 0
    duplicates: int = 0
    out_of_range: int = 0


@dataclass
class _Request:
    history: List[np.ndarray]  # per layer: [seq_len, row_stride] uint8
    block: Optional[int]
    slot_token: List[List[int]] = field(default_factory=list)  # per layer, [C]
    lru: List[List[int]] = field(default_factory=list)  # per layer, [C], LRU first
    protected: List[int] = field(default_factory=list)  # per layer: lru's protected tail
    uses: List[List[int]] = field(default_factory=list)  # clock, per layer: [C] use counts
    hand: List[int] = field(default_factory=list)  # clock, per layer: where the sweep starts

    @property
    def seq_len(self) -> int:
        return self.history[0].shape[0]


# The clock's largest use count (kClockMaxUses, kernel_views.h).
CLOCK_MAX_USES = 3


def protected_capacity_of(options) -> Optional[int]:
    """ReferenceManager's protected_capacity for a sparsekv.CacheOptions."""
    return options.protected_capacity if options.eviction.name == "SEGMENTED_LRU" else None


def clock_of(options) -> bool:
    """ReferenceManager's clock for a sparsekv.CacheOptions."""
    return options.eviction.name == "CLOCK"


class ReferenceManager:
    def __init__(self, hot_slots: int, window: int, max_requests: int, num_layers: int,
                 protected_capacity: Optional[int] = None, clock: bool = False):
        """protected_capacity: segmented LRU with this capacity; None: LRU (or, with clock, the
        clock: use counts and a sweeping hand)."""
        self.P = protected_capacity
        self.clock = clock
        self.C = hot_slots
        self.W = window
        self.max_requests = max_requests
        self.num_layers = num_layers
        self.requests: Dict[int, _Request] = {}
        self.counters = [Counters() for _ in range(num_layers)]
        self.batch: List[int] = []

    def _acquire(self, r: _Request) -> None:
        used = {q.block for q in self.requests.values() if q.block is not None}
        r.block = min(b for b in range(self.max_requests) if b not in used)
        r.slot_token = [[-1] * self.C for _ in range(self.num_layers)]
        r.lru = [list(range(self.C)) for _ in range(self.num_layers)]
        r.protected = [0] * self.num_layers
        r.uses = [[0] * self.C for _ in range(self.num_layers)]
        r.hand = [0] * self.num_layers

    def admit(self, rid: int, prompt: List[np.ndarray]) -> None:
        r = _Request(history=[p.copy() for p in prompt], block=None)
        self._acquire(r)
        self.requests[rid] = r

    def release(self, rid: int) -> None:
        del self.requests[rid]

    def retract(self, rid: int) -> None:
        self.requests[rid].block = None

    def resume(self, rid: int) -> None:
        self._acquire(self.requests[rid])

    def plan(self, batch: List[int]) -> None:
        self.batch = list(batch)

    def append(self, layer: int, new_rows: np.ndarray) -> None:
        for b, rid in enumerate(self.batch):
            r = self.requests[rid]
            r.history[layer] = np.concatenate([r.history[layer], new_rows[b : b + 1]])

    def resolve(self, layer: int, topk: np.ndarray, top_k: int) -> np.ndarray:
        """Slots [len(batch), top_k] for `topk` [>= len(batch), >= top_k] (ResolveView)."""
        C, W = self.C, self.W
        c = self.counters[layer]
        out = np.full((len(self.batch), top_k), -1, dtype=np.int32)
        for b, rid in enumerate(self.batch):
            r = self.requests[rid]
            seq_len = r.history[layer].shape[0]
            base = r.block * (C + W)
            window_begin = max(0, seq_len - W)
            slot_token, lru = r.slot_token[layer], r.lru[layer]
            seen, hit, misses = set(), set(), []
            for k in range(top_k):
                p = int(topk[b, k])
                if p == -1:
                    c.padding += 1
                elif p < -1 or p >= seq_len:
                    c.out_of_range += 1
                elif p in seen:
                    c.duplicates += 1
                else:
                    seen.add(p)
                    if p >= window_begin:
                        c.window_hits += 1
                        out[b, k] = base + C + p % W
                    elif p in slot_token:
                        c.hits += 1
                        s = slot_token.index(p)
                        hit.add(s)
                        out[b, k] = base + s
                    else:
                        c.misses += 1
                        misses.append((k, p))
            if self.clock:
                victims = self._sweep(r, layer, hit, min(len(misses), C - len(hit)))
            else:
                victims = [s for s in lru if s not in hit][: len(misses)]
            for (k, p), v in zip(misses, victims):
                slot_token[v] = p
                out[b, k] = base + v
            if self.clock:
                continue
            used = hit | set(victims)
            if self.P is None:
                r.lru[layer] = [s for s in lru if s not in used] + [s for s in lru if s in used]
                continue
            first = C - r.protected[layer]
            kept = [(i, s) for i, s in enumerate(lru) if s not in used]
            probationary = [s for i, s in kept if i < first]
            untouched_protected = [s for i, s in kept if i >= first]
            r.lru[layer] = (probationary + [s for s in lru if s in victims] +
                            untouched_protected + [s for s in lru if s in hit])
            r.protected[layer] = min(self.P, len(untouched_protected) + len(hit))
        return out

    def _sweep(self, r: _Request, layer: int, hit: set, n: int) -> List[int]:
        """The clock's n victims, its counts and hand updated (ResolveView, kernel_views.h)."""
        uses, hand, victims = r.uses[layer], r.hand[layer], []
        while len(victims) < n:
            s, hand = hand, (hand + 1) % self.C
            if s in hit or s in victims:
                continue
            if uses[s] > 0:
                uses[s] -= 1
            else:
                victims.append(s)
        r.hand[layer] = hand
        for s in hit:
            uses[s] = min(CLOCK_MAX_USES, uses[s] + 1)
        return victims

    def row(self, rid: int, layer: int, position: int) -> np.ndarray:
        return self.requests[rid].history[layer][position]
