"""The adapter keeps the call shape of the SGLang class it stands in for.

SparseKVCoordinator replaces SGLang's HiSparseCoordinator: the scheduler and the DSA attention
backend call the methods below by name (and swap_in_selected_pages positionally). If SGLang renames
a method or changes its parameters, this test fails, so the drift is seen before an engine breaks.

SGLang's signatures are read with inspect when its module imports (a full SGLang install), else
from the source of the installed distribution (`pip install --no-deps sglang` suffices: its
runtime dependencies are many gigabytes and need a GPU); without SGLang the test is skipped.
"""

import ast
import importlib
import importlib.metadata
import inspect

import pytest

pytest.importorskip("torch")  # the adapter is for torch engines

from sparsekv.sglang_adapter import SparseKVCoordinator  # noqa: E402

MODULE = "sglang.srt.managers.hisparse_coordinator"
CLASS = "HiSparseCoordinator"
METHODS = [
    "admit_request_into_staging",
    "collect_ready_reqs",
    "has_ongoing_staging",
    "map_last_loc_to_buffer",
    "swap_in_selected_pages",
    "request_finished",
    "retract_req",
    "set_decode_producer_stream",
]


def parameters_by_inspect():
    cls = getattr(importlib.import_module(MODULE), CLASS)
    return {m: list(inspect.signature(getattr(cls, m)).parameters) for m in METHODS}


def parameters_by_source():
    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("sglang is not installed (scripts/python-test.sh installs it with --no-deps)")
    path = dist.locate_file(MODULE.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    found = {}
    for m in METHODS:
        assert m in methods, f"SGLang's {CLASS} has no method {m}"
        a = methods[m].args
        found[m] = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return found


def sglang_parameters():
    try:
        return parameters_by_inspect()
    except Exception:  # noqa: BLE001 - SGLang's runtime dependencies (or a GPU) are absent
        return parameters_by_source()


def test_adapter_methods_match_sglang():
    ours = {m: list(inspect.signature(getattr(SparseKVCoordinator, m)).parameters)
            for m in METHODS}
    theirs = sglang_parameters()
    for m in METHODS:
        assert ours[m] == theirs[m], f"{m}: sparsekv {ours[m]} != SGLang {theirs[m]}"
