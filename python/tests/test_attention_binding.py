"""SparseMLAAttention, WeightStreamProxy and LayerTopKGenerator: the C++ benchmark's operators and
workload, bound for a Python-driven decode.

On any build: bad options are refused with InvalidArgumentError; without CUDA (or a GPU) the GPU
operators raise UnavailableError. The top-k generator is a CPU component: its rows for a seed are
the C++ generator's (the expected rows below were printed by a C++ program calling
LayerTopKGenerator with the same options). The GPU tests skip unless torch sees a GPU and the
library was built with CUDA.
"""

import numpy as np
import pytest

import sparsekv

def has_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and sparsekv.cuda_compiled()


def test_attention_options_keep_their_fields():
    o = sparsekv.SparseMLAOptions(4, heads=16, top_k=64, split="merge-halves")
    assert (o.max_batch, o.heads, o.top_k, o.split) == (4, 16, 64, "merge-halves")
    assert o.format == sparsekv.KVRowFormat.FP8_ROW_656
    assert o.softmax_scale == pytest.approx(1 / 576 ** 0.5)


def test_attention_options_refuse_an_unknown_split():
    with pytest.raises(ValueError, match="split"):
        sparsekv.SparseMLAOptions(4, split="halves")


@pytest.mark.parametrize("fields, name", [
    (dict(max_batch=0), "max_batch"),
    (dict(max_batch=2, heads=0), "heads"),
    (dict(max_batch=2, top_k=0), "top_k"),
])
def test_attention_refuses_bad_options_on_every_build(fields, name):
    with pytest.raises(sparsekv.InvalidArgumentError, match=name):
        sparsekv.SparseMLAAttention(sparsekv.SparseMLAOptions(**fields))


@pytest.mark.parametrize("args", [(0, 1 << 20), (4, 0), (4, 1 << 20, 0)])
def test_proxy_refuses_arguments_below_one_on_every_build(args):
    with pytest.raises(sparsekv.InvalidArgumentError, match="WeightStreamProxy"):
        sparsekv.WeightStreamProxy(*args)


def gpu_usable():
    """Whether the package's CUDA backend finds a device."""
    try:
        sparsekv.cuda_backend(0)
    except sparsekv.UnavailableError:
        return False
    return True


def test_gpu_operators_are_unavailable_without_a_gpu():
    """Refused with UnavailableError without a usable GPU (naming the operator in a build without
    CUDA); built where there is one (the GPU tests below run them)."""
    if gpu_usable():
        sparsekv.SparseMLAAttention(sparsekv.SparseMLAOptions(4))
        sparsekv.WeightStreamProxy(4, 1 << 20)
        return
    names = not sparsekv.cuda_compiled()
    with pytest.raises(sparsekv.UnavailableError, match="SparseMLAAttention" if names else None):
        sparsekv.SparseMLAAttention(sparsekv.SparseMLAOptions(4))
    with pytest.raises(sparsekv.UnavailableError, match="WeightStreamProxy" if names else None):
        sparsekv.WeightStreamProxy(4, 1 << 20)


# ---- LayerTopKGenerator: the C++ generator's rows ----

def locality_options():
    o = sparsekv.locality_preset("glm5-published")
    o.top_k, o.seed = 8, 3
    return o


def test_locality_rows_are_the_cpp_generators():
    o = locality_options()
    l0, l1 = sparsekv.LayerTopKGenerator(o, 0, 2), sparsekv.LayerTopKGenerator(o, 1, 2)
    expected = [
        ([99, 0, 1, 2, 3, 9, 67, 40, 119, 0, 1, 2, 3, 81, 34, 36],
         [99, 0, 1, 2, 3, 9, 67, 76, 119, 0, 1, 2, 3, 81, 34, 36]),
        ([100, 0, 1, 2, 3, 99, 9, 75, 120, 0, 1, 2, 3, 81, 36, 54],
         [100, 0, 1, 2, 3, 99, 9, 75, 120, 0, 1, 2, 3, 81, 36, 54]),
    ]
    lens = [100, 120]
    for want0, want1 in expected:
        a = l0.next(lens)
        b = l1.next(lens, lower=a)
        assert a.dtype == np.int32 and a.shape == (2, 8)
        assert a.ravel().tolist() == want0
        assert b.ravel().tolist() == want1
        lens = [n + 1 for n in lens]


def test_miss_rate_rows_are_the_cpp_generators():
    o = sparsekv.TopKGeneratorOptions()
    o.top_k, o.seed, o.miss_rate, o.fresh_range = 8, 5, 0.25, 90
    g = sparsekv.LayerTopKGenerator(o, 2, 2)
    assert g.next([100, 120]).ravel().tolist() == [
        99, 0, 9, 6, 43, 3, 75, 66, 119, 12, 7, 20, 23, 62, 19, 71]
    assert g.next([101, 121]).ravel().tolist() == [
        100, 3, 9, 0, 43, 6, 49, 15, 120, 7, 19, 23, 12, 62, 45, 38]


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    def rows(seed):
        o = locality_options()
        o.top_k, o.seed = 64, seed
        g = sparsekv.LayerTopKGenerator(o, 5, 3)
        return [g.next([4096, 5000, 8192]) for _ in range(3)]
    first, again, other = rows(1), rows(1), rows(2)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))
    for step in first:
        for row, n in zip(step, [4096, 5000, 8192]):
            assert len(set(row.tolist())) == 64 and row.min() >= 0 and row.max() < n


@pytest.mark.parametrize("field, value", [
    ("top_k", 0), ("reuse", 1.5), ("recency", -0.1), ("cross_layer_overlap", 2.0),
    ("sinks", -1)])
def test_the_generator_refuses_options_out_of_range(field, value):
    o = sparsekv.TopKGeneratorOptions()
    setattr(o, field, value)
    with pytest.raises(sparsekv.InvalidArgumentError, match=field):
        sparsekv.LayerTopKGenerator(o, 0, 2)


def test_the_generator_refuses_a_bad_batch_layer_or_history():
    o = sparsekv.TopKGeneratorOptions()
    o.top_k = 16
    with pytest.raises(sparsekv.InvalidArgumentError, match="batch"):
        sparsekv.LayerTopKGenerator(o, 0, 0)
    with pytest.raises(sparsekv.InvalidArgumentError, match="layer"):
        sparsekv.LayerTopKGenerator(o, -1, 2)
    g = sparsekv.LayerTopKGenerator(o, 0, 2)
    with pytest.raises(sparsekv.InvalidArgumentError, match="batch"):
        g.next([100, 100, 100])
    with pytest.raises(sparsekv.InvalidArgumentError, match="top_k"):
        g.next([8])
    with pytest.raises(sparsekv.FailedPreconditionError, match="miss-rate"):
        g.set_miss_rate(0.1)


def test_miss_rate_mode_needs_a_fresh_range_and_longer_histories():
    o = sparsekv.TopKGeneratorOptions()
    o.top_k, o.miss_rate, o.fresh_range = 16, 0.2, 8
    with pytest.raises(sparsekv.InvalidArgumentError, match="fresh_range"):
        sparsekv.LayerTopKGenerator(o, 0, 1)
    o.fresh_range = 64
    g = sparsekv.LayerTopKGenerator(o, 0, 1)
    with pytest.raises(sparsekv.InvalidArgumentError, match="fresh_range"):
        g.next([64])
    with pytest.raises(sparsekv.InvalidArgumentError, match="miss_rate"):
        g.set_miss_rate(1.5)


def test_an_unknown_locality_preset_names_the_known_ones():
    with pytest.raises(sparsekv.InvalidArgumentError, match="glm5-published"):
        sparsekv.locality_preset("nope")


# ---- On a GPU ----

@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU and sparsekv built with CUDA")
def test_attention_matches_the_reference_shape_and_masks_padding():
    import torch
    heads, top_k, batch = 16, 64, 3
    att = sparsekv.SparseMLAAttention(
        sparsekv.SparseMLAOptions(batch, heads=heads, top_k=top_k,
                                  format=sparsekv.KVRowFormat.BF16_ROW_1152))
    q = torch.randn(batch, heads, 576, device="cuda", dtype=torch.bfloat16)
    keys = torch.randn(200, 576, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, 200, (batch, top_k), device="cuda", dtype=torch.int32)
    idx[2] = -1  # a request with every entry masked gets zeros
    out = torch.empty(batch, heads, 512, device="cuda", dtype=torch.bfloat16)
    att.run(batch, q, keys, 1152, idx, out)
    torch.cuda.synchronize()
    k = keys[idx[:2].long()].float()                        # [2, top_k, 576]
    s = torch.einsum("bhd,bkd->bhk", q[:2].float(), k) / 576 ** 0.5
    want = torch.einsum("bhk,bkd->bhd", torch.softmax(s, dim=2), k[..., :512])
    torch.testing.assert_close(out[:2].float(), want, atol=3e-2, rtol=3e-2)
    assert (out[2] == 0).all()


@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU and sparsekv built with CUDA")
def test_attention_refuses_short_and_misplaced_tensors():
    import torch
    att = sparsekv.SparseMLAAttention(sparsekv.SparseMLAOptions(2, heads=16, top_k=64))
    q = torch.zeros(2, 16, 576, device="cuda", dtype=torch.bfloat16)
    rows = torch.zeros(100, 656, device="cuda", dtype=torch.uint8)
    idx = torch.zeros(2, 64, device="cuda", dtype=torch.int32)
    out = torch.zeros(2, 16, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q"):
        att.run(2, q[:1], rows, 656, idx, out)
    with pytest.raises(ValueError, match="cuda:0"):
        att.run(2, q.cpu(), rows, 656, idx, out)
    with pytest.raises(TypeError, match="int32"):
        att.run(2, q, rows, 656, idx.long(), out)
    with pytest.raises(sparsekv.InvalidArgumentError):
        att.run(3, q, rows, 656, idx, out)


@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU and sparsekv built with CUDA")
def test_proxy_streams_its_weights_per_layer():
    import torch
    proxy = sparsekv.WeightStreamProxy(4, 16 << 20)
    assert proxy.bytes_per_layer == proxy.out_features * 7168 * 2
    assert abs(proxy.bytes_per_layer - (16 << 20)) <= 2 * 7168 * 64
    stream = torch.cuda.current_stream().cuda_stream
    for layer in range(3):
        proxy.run(4, layer, stream)
    torch.cuda.synchronize()
    with pytest.raises(sparsekv.InvalidArgumentError):
        proxy.run(5, 0)
