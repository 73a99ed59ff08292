"""An adapter with the call shape of SGLang's sparse-attention KV coordinator.

``SparseKVCoordinator`` stands in for SGLang's ``HiSparseCoordinator``
(``sglang/srt/managers/hisparse_coordinator.py``): the methods the scheduler and the DSA attention
backend call have the same names and parameters, so that an engine switches by constructing this
object instead. docs/integration-sglang.md says where each call goes.

Request identity. An engine addresses requests in the decode path by ``req_pool_indices``: rows of
its request pool, reused by later requests. The manager addresses them by ``RequestId``. The
adapter gives every admitted request a fresh RequestId (a counter, never reused, so that a stale
pool index can never alias a newer request) and keeps two host-side maps: pool index -> RequestId
for the requests that hold a pool row, used when a step is planned, and request key (SGLang's
``req.rid``) -> RequestId, which survives retraction, when the engine gives the pool row back.

Step shape. ``map_last_loc_to_buffer`` plans the step (host side, before the forward). Inside the
forward, for every layer in order: ``append_token_kv`` stores the newest token's KV, then
``swap_in_selected_pages`` resolves the layer's top-k and returns the slots that index
``layer_kv(layer)``; after the last layer it closes the step. All of that is graph-capturable: it
enqueues on the caller's current stream, allocates nothing and reads the batch from device memory.
After replaying a captured forward, the engine calls ``finish_replayed_step`` (the host-side
bookkeeping the replay skipped).

The step schedule. With ``schedule="auto"`` the same calls run through a ``sparsekv.StepSchedule``:
``map_last_loc_to_buffer`` plans the step and its choice, ``append_token_kv`` hands over the
layer's new rows and ``swap_in_selected_pages`` runs the layer (append, resolve, the cross-layer
prefetch when the schedule measured that it pays, the miss copies) before it returns the slots. The
engine attends after that call returns, so the schedule chooses among the choices without
attention slices (``serial``, ``prefetch``); ``schedule="prefetch"`` (or any such choice) fixes
one. ``coordinator.schedule`` is the StepSchedule (its ``stats()``, ``choice``, ``reason``).

Prefill on the same machine. When ``RequestInfo.node_pool_prompt`` is given, the manager's host
pool is a node pool (``sparsekv.NodePool``) in which a prefill process wrote and sealed the
prompt: the request is admitted from the sealed pages (``admit_from_node_pool``), without copying
the prompt and without calling ``prompt_kv``.

Prefix reuse. When ``RequestInfo.token_ids`` is given, a request is admitted with
``admit_with_prefix``: the longest prefix of full host pages already in the pool (another
request's prompt, or an earlier turn of the same conversation) is shared, and only the rest of the
prompt is ingested. Steps are planned with the appended tokens' ids (when every request of the
batch has them), so that the pages a request fills become shareable too. With
``retain_finished=True``, a finished request is retained instead of released: its full pages stay
in the pool, indexed by their token ids, until the next turn shares them or an admission needs the
room (least recently used first).
"""

from __future__ import annotations

from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import torch

import sparsekv


class RequestInfo(NamedTuple):
    """What the adapter needs to know about an engine's request object."""

    key: Hashable  # stable for the request's lifetime, across retraction (SGLang: req.rid)
    req_pool_idx: int  # the request's current row in the engine's request pool
    prompt_len: int  # tokens whose KV the prefill produced (SGLang: len(req.fill_ids))
    max_new_tokens: int  # tokens the request may still generate
    # The request's token ids so far, prompt first (SGLang: req.origin_input_ids +
    # req.output_ids), at least prompt_len of them; None: no prefix reuse for this request.
    # Read at admission ([:prompt_len]) and when a step is planned (the id at the new length - 1).
    token_ids: Optional[Sequence[int]] = None
    # (owner, seal) of the prompt a prefill process sealed in the manager's node pool
    # (sparsekv.NodePool): admitted from its pages, without copying, instead of through
    # prompt_kv; None: ingested as usual. Such a prompt is not indexed for prefix reuse.
    node_pool_prompt: Optional[Tuple[int, int]] = None


class SparseKVCoordinator:
    """Drives a ``sparsekv.SparseKVCacheManager`` from an engine's scheduler and attention backend.

    Args:
      manager: the manager; its layers are the engine's sparse-attention layers, in order.
      request_info: maps an engine request object to its ``RequestInfo``.
      prompt_kv: ``prompt_kv(req, layer_id)`` returns the prompt's KV rows of one layer,
        ``[prompt_len, row_stride]`` bytes in any dtype, on the host or the backend's device.
        For a request admitted with a shared prefix, only rows ``[cached:]`` are read from it.
      retain_finished: keep the full pages of a finished request that has token ids in the pool
        (``retain``), for a later request (the next turn) that starts with the same tokens.
      schedule: None (the manager's per-layer calls), ``"auto"`` (a StepSchedule that measures
        the choices the manager's options allow without attention slices) or one such choice
        (a ``sparsekv.StepChoice`` or its text, e.g. ``"prefetch"``).

    Not thread-safe: one scheduler thread drives it, as it drives the manager.
    """

    def __init__(
        self,
        manager: sparsekv.SparseKVCacheManager,
        *,
        request_info: Callable[[Any], RequestInfo],
        prompt_kv: Callable[[Any, int], Any],
        retain_finished: bool = False,
        schedule: Union[None, str, sparsekv.StepChoice] = None,
    ) -> None:
        self.manager = manager
        self.request_info = request_info
        self.prompt_kv = prompt_kv
        self.retain_finished = retain_finished
        options = manager.options
        self.top_k = options.top_k
        self.num_layers = options.geometry.num_layers
        backend = manager.backend
        self.device = torch.device(f"cuda:{backend.device}" if backend.kind == "cuda" else "cpu")
        # The slot table swap_in_selected_pages returns: fixed, so that it is graph-safe.
        self.top_k_device_locs_buffer = torch.full(
            (options.effective_max_batch, self.top_k), -1, dtype=torch.int32, device=self.device
        )
        self._layer_kv = [self._wrap_hot_layer(layer) for layer in range(self.num_layers)]
        self._next_request_id = 1
        self._ids_by_key: Dict[Hashable, int] = {}
        self._ids_by_pool_idx: Dict[int, int] = {}
        self._reqs_by_id: Dict[int, Any] = {}  # requests admitted with token ids
        self._ready: List[Any] = []
        self._producer_stream: Any = None  # None: the caller's current stream
        self.schedule: Optional[sparsekv.StepSchedule] = _make_schedule(manager, schedule)
        self._new_rows: Any = None  # with a schedule: append_token_kv's rows, for the swap-in

    def set_decode_producer_stream(self, stream: Any) -> None:
        """The stream the decode forward runs on (SGLang's overlap scheduler has its own).

        Host-side calls (admission, planning, resumption) then enqueue their copies there, so that
        the forward sees them in stream order. Inside the forward, calls use the current stream.
        """
        self._producer_stream = stream

    # ---- Scheduler hooks (SGLang: scheduler / batch_result_processor / schedule_batch) ----

    def admit_request_into_staging(self, req: Any) -> None:
        """After prefill: hands the prompt's KV to the manager (all layers).

        A request retracted by ``retract_req`` whose history covers the new prompt exactly is
        resumed from its host history instead; one whose prompt grew (the engine recomputed it)
        is admitted again from scratch (with token ids, sharing the full pages of its old
        history: the old request is retained first).
        """
        info = self.request_info(req)
        request_id = self._ids_by_key.get(info.key)
        if request_id is not None:
            if self.manager.sequence_length(request_id) == info.prompt_len:
                self.manager.resume(request_id, stream=self._producer_stream)
                self._ids_by_pool_idx[info.req_pool_idx] = request_id
                self._ready.append(req)
                return
            self._end(self._forget(info.key), retain=True)
        request_id = self._next_request_id
        stream = self._producer_stream
        if info.node_pool_prompt is not None:
            self._admit_from_node_pool(req, info, request_id)
            return
        if info.token_ids is None:
            cached = 0
            self.manager.admit(request_id, info.prompt_len, info.max_new_tokens, stream=stream)
        else:
            prompt_ids = list(info.token_ids[: info.prompt_len])
            if len(prompt_ids) != info.prompt_len:
                raise ValueError(
                    f"request {info.key!r}: {len(prompt_ids)} token ids for a prompt of "
                    f"{info.prompt_len} tokens"
                )
            cached = self.manager.admit_with_prefix(
                request_id, prompt_ids, info.max_new_tokens, stream=stream
            )
        try:
            for layer in range(self.num_layers):
                rows = self.prompt_kv(req, layer)
                if info.token_ids is None:
                    self.manager.ingest_prompt(request_id, layer, rows, stream=stream)
                else:
                    self.manager.ingest_prompt_suffix(
                        request_id, layer, rows[cached:], stream=stream
                    )
        except Exception:
            self.manager.release(request_id)
            raise
        self._next_request_id += 1
        self._ids_by_key[info.key] = request_id
        self._ids_by_pool_idx[info.req_pool_idx] = request_id
        if info.token_ids is not None:
            self._reqs_by_id[request_id] = req
        self._ready.append(req)

    def _admit_from_node_pool(self, req: Any, info: RequestInfo, request_id: int) -> None:
        owner, seal = info.node_pool_prompt
        self.manager.admit_from_node_pool(
            request_id, owner, seal, info.max_new_tokens, stream=self._producer_stream
        )
        sealed = self.manager.sequence_length(request_id)
        if sealed != info.prompt_len:
            self.manager.release(request_id)
            raise ValueError(
                f"request {info.key!r}: the node pool prompt holds {sealed} tokens, the request "
                f"{info.prompt_len}"
            )
        self._next_request_id += 1
        self._ids_by_key[info.key] = request_id
        self._ids_by_pool_idx[info.req_pool_idx] = request_id
        self._ready.append(req)

    def collect_ready_reqs(self) -> List[Any]:
        """Requests admitted since the last call: they may join the next decode batch.

        Their ingestion copies are enqueued on the stream the decode steps run on, so they are
        ready in stream order; nothing is waited for here.
        """
        ready, self._ready = self._ready, []
        return ready

    def has_ongoing_staging(self) -> bool:
        """True while admitted requests wait for ``collect_ready_reqs``."""
        return bool(self._ready)

    def map_last_loc_to_buffer(
        self,
        seq_lens: Any,
        out_cache_loc: Any,
        req_pool_indices: Any,
        seq_lens_cpu: Any,
        req_pool_indices_cpu: Any,
    ) -> None:
        """Plans the next decode step for the batch in ``req_pool_indices_cpu`` order.

        ``seq_lens_cpu`` (lengths including the new token) is checked against the manager's
        lengths, so that an engine and a manager that disagree fail here, not in attention.
        ``seq_lens``, ``out_cache_loc`` and ``req_pool_indices`` (device copies) are not needed:
        the manager keeps its own lengths and the newest token's slot. When every request of the
        batch has token ids, the step is planned with the ids of the tokens it appends.
        """
        request_ids = []
        token_ids: Optional[List[int]] = []
        for pool_idx, seq_len in zip(_to_list(req_pool_indices_cpu), _to_list(seq_lens_cpu)):
            request_id = self._ids_by_pool_idx.get(pool_idx)
            if request_id is None:
                raise LookupError(f"request pool row {pool_idx} holds no admitted request")
            expected = self.manager.sequence_length(request_id) + 1
            if seq_len != expected:
                raise ValueError(
                    f"request pool row {pool_idx}: the engine's length {seq_len} != "
                    f"{expected}, the manager's length after this step"
                )
            request_ids.append(request_id)
            req = self._reqs_by_id.get(request_id)
            ids = None if req is None or token_ids is None else self.request_info(req).token_ids
            if ids is None or len(ids) < seq_len:
                token_ids = None
            else:
                token_ids.append(int(ids[seq_len - 1]))
        planner = self.manager if self.schedule is None else self.schedule
        planner.plan_step(request_ids, token_ids=token_ids, stream=self._producer_stream)

    def request_finished(self, req: Any) -> None:
        """Frees everything the request holds, or with ``retain_finished`` keeps its full pages
        for the next turn. A request never admitted is ignored (SGLang also reports requests
        that finish during prefill)."""
        key = self.request_info(req).key
        if key in self._ids_by_key:
            self._end(self._forget(key), retain=self.retain_finished)

    def retract_req(self, req: Any) -> None:
        """Frees the request's hot cache (HBM) but keeps its history in host memory, for a
        later ``admit_request_into_staging``. A request never admitted is ignored."""
        key = self.request_info(req).key
        request_id = self._ids_by_key.get(key)
        if request_id is None:
            return
        self.manager.retract(request_id)
        self._drop_pool_idx(request_id)

    # ---- Attention backend hooks (SGLang: DeepseekSparseAttnBackend.forward_decode) ----

    def append_token_kv(self, layer_id: int, kv_rows: Any) -> None:
        """Stores the newest token's KV of ``layer_id`` for the planned batch:
        ``[>= batch, row_stride]`` bytes on the backend's device. Precedes the layer's swap-in
        (with a schedule, which appends them: they must stay alive until it is enqueued)."""
        if self.schedule is None:
            self.manager.append_token(layer_id, kv_rows)
        else:
            self._new_rows = kv_rows

    def swap_in_selected_pages(
        self,
        req_pool_indices: torch.Tensor,
        compressed_seq_lens: torch.Tensor,
        top_k_result: torch.Tensor,
        layer_id: int,
    ) -> torch.Tensor:
        """Makes the layer's top-k rows resident; returns their slots in ``layer_kv(layer_id)``.

        ``top_k_result``: int32 ``[bs, >= top_k]`` token positions, -1 = padding, bs >= the
        planned batch. Returns int32 ``[bs, top_k]``: a slot per entry, -1 for padding, duplicate
        or out-of-range entries and for rows past the planned batch. The batch's requests and
        lengths come from the plan, so ``req_pool_indices`` only gives bs and
        ``compressed_seq_lens`` is not read. After the last layer, the step is closed.
        """
        batch = req_pool_indices.shape[0]
        self.top_k_device_locs_buffer.fill_(-1)
        if self.schedule is None:
            self.manager.run_layer(layer_id, top_k_result, self.top_k_device_locs_buffer)
            if layer_id == self.num_layers - 1:
                self.manager.finish_step()
            return self.top_k_device_locs_buffer[:batch]
        if self._new_rows is None:
            raise RuntimeError(f"layer {layer_id}: append_token_kv must precede the swap-in")
        rows, self._new_rows = self._new_rows, None
        # The engine attends after this call returns, on the same stream: nothing to enqueue here.
        self.schedule.run_layer(
            layer_id, rows, top_k_result, self.top_k_device_locs_buffer, _attend_after_return
        )
        if layer_id == self.num_layers - 1:
            self.schedule.finish_step()
        return self.top_k_device_locs_buffer[:batch]

    def layer_kv(self, layer_id: int) -> torch.Tensor:
        """The hot cache of ``layer_id``: uint8 ``[rows, row_stride]``, no copy; the slots from
        ``swap_in_selected_pages`` index its rows. ``.view(dtype)`` gives typed rows."""
        return self._layer_kv[layer_id]

    # ---- Model runner hook ----

    def finish_replayed_step(self) -> None:
        """After replaying a captured forward: closes the step the replay ran."""
        if self.schedule is None:
            self.manager.finish_replayed_step()
        else:
            self.schedule.finish_replayed_step()

    # ---- Internals ----

    def _wrap_hot_layer(self, layer: int) -> torch.Tensor:
        view = self.manager.hot_layer(layer)
        if self.device.type == "cuda":
            return torch.as_tensor(view, device=self.device)
        import numpy  # the CPU backend's hot cache is host memory: wrap it through numpy

        return torch.from_numpy(numpy.asarray(view))

    def _drop_pool_idx(self, request_id: int) -> None:
        for pool_idx, held in list(self._ids_by_pool_idx.items()):
            if held == request_id:
                del self._ids_by_pool_idx[pool_idx]

    def _forget(self, key: Hashable) -> int:
        request_id = self._ids_by_key.pop(key)
        self._drop_pool_idx(request_id)
        return request_id

    def _end(self, request_id: int, retain: bool) -> None:
        """Releases the request, or retains it when asked and its token ids are known."""
        if retain and self._reqs_by_id.pop(request_id, None) is not None:
            self.manager.retain(request_id)
        else:
            self._reqs_by_id.pop(request_id, None)
            self.manager.release(request_id)


def _make_schedule(
    manager: sparsekv.SparseKVCacheManager, schedule: Union[None, str, sparsekv.StepChoice]
) -> Optional[sparsekv.StepSchedule]:
    """The coordinator's StepSchedule (None: the manager's own calls)."""
    if schedule is None:
        return None
    if isinstance(schedule, str) and schedule == "auto":
        choices = [c for c in sparsekv.allowed_choices(manager.options) if c.chunk_rows == 0]
        return sparsekv.StepSchedule(manager, candidates=choices)
    choice = sparsekv.StepChoice.parse(schedule) if isinstance(schedule, str) else schedule
    if choice.chunk_rows != 0:
        raise ValueError(
            f"schedule {str(choice)!r}: attention slices need the schedule to call attention, "
            "but the engine attends after swap_in_selected_pages returns; use 'auto', 'serial' "
            "or 'prefetch'"
        )
    return sparsekv.StepSchedule(manager, fixed=choice)


def _attend_after_return(layer: int, first: int, rows: int, stream: int) -> None:
    """The engine's attention follows swap_in_selected_pages on the same stream."""


def _to_list(values: Any) -> List[int]:
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
