"""The package's surface: every name exported, documented and typed; request ids checked.

Every public name of sparsekv._core must be in sparsekv.__all__, have a docstring (for a bound
function: text beyond pybind11's signature line) and appear in _core.pyi, and so must every public
attribute of its classes; the stub and the py.typed marker must be installed with the package.
"""

import ast
import importlib.resources
import importlib.util
import inspect
import pathlib

import numpy as np
import pytest

import sparsekv
from sparsekv import _core
from conftest import LAYERS


def public(names):
    return sorted(n for n in names if not n.startswith("_"))


def module_names():
    return public(dir(_core))


def is_enum(cls):
    return hasattr(cls, "__members__")


def class_members(cls):
    """Public attributes the binding defines on `cls` itself (not inherited ones)."""
    if issubclass(cls, BaseException):
        return []
    members = public(vars(cls))
    if is_enum(cls):  # its values are checked separately
        members = [m for m in members if m not in cls.__members__]
    return members


def documented_members(cls):
    """class_members and a bound constructor, less what pybind11 itself adds to an enum."""
    members = class_members(cls)
    if is_enum(cls):
        return [m for m in members if m not in ("name", "value")]
    init = vars(cls).get("__init__")
    if init is not None and (init.__doc__ or "").startswith("__init__("):
        members.append("__init__")
    return members


def stub_tree():
    source = importlib.resources.files("sparsekv").joinpath("_core.pyi").read_text()
    tree = ast.parse(source)
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets if isinstance(t, ast.Name))
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
    return top, classes


def documentation(obj):
    """The docstring's text, without pybind11's signature line for a bound function."""
    doc = inspect.getdoc(obj) or ""
    if callable(obj) and not isinstance(obj, type) and "(" in doc.split("\n", 1)[0]:
        doc = doc.split("\n", 1)[1] if "\n" in doc else ""
    return doc.strip()


def test_every_public_name_is_exported():
    assert sorted(sparsekv.__all__) == module_names()
    for name in sparsekv.__all__:
        assert getattr(sparsekv, name) is getattr(_core, name)
    assert sparsekv.EvictionPolicy.LRU != sparsekv.EvictionPolicy.SEGMENTED_LRU
    assert issubclass(sparsekv.DeadlineExceededError, sparsekv.SparseKVError)
    assert issubclass(sparsekv.DeadlineExceededError, TimeoutError)


def test_every_public_name_has_a_docstring():
    missing = []
    for name in module_names():
        obj = getattr(_core, name)
        if not documentation(obj):
            missing.append(name)
        if isinstance(obj, type):
            for member in documented_members(obj):
                if not documentation(vars(obj)[member]):
                    missing.append(f"{name}.{member}")
    assert missing == []


def test_cache_option_docstrings_are_the_comments_of_options_h():
    # The generator the build runs, over the header in this checkout: every CacheOptions field
    # is bound, and described by its comment there.
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("option_docs", root / "python/src/option_docs.py")
    option_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(option_docs)
    docs = option_docs.field_docs((root / "include/sparsekv/options.h").read_text())
    assert len(docs) > 20
    for field, text in docs:
        assert getattr(sparsekv.CacheOptions, field).__doc__ == text, field


def test_every_public_name_is_in_the_stub():
    top, classes = stub_tree()
    missing = [n for n in module_names() if n not in top]
    for name in module_names():
        obj = getattr(_core, name)
        if not isinstance(obj, type):
            continue
        expected = class_members(obj) + list(getattr(obj, "__members__", {}))
        missing += [f"{name}.{m}" for m in expected if m not in classes.get(name, set())]
    assert missing == []


def test_stub_and_marker_are_installed_with_the_package():
    files = importlib.resources.files("sparsekv")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_core.pyi").is_file()


@pytest.mark.parametrize("bad", [-1, 2**64, -(2**70)])
def test_request_ids_out_of_range_say_they_are_unsigned(manager, bad):
    with pytest.raises(sparsekv.InvalidArgumentError, match="unsigned 64-bit") as e:
        manager.admit(bad, 4, 4)
    assert isinstance(e.value, ValueError) and str(bad) in str(e.value)
    with pytest.raises(sparsekv.InvalidArgumentError, match="unsigned 64-bit"):
        manager.plan_step([bad])
    with pytest.raises(sparsekv.InvalidArgumentError, match="unsigned 64-bit"):
        manager.fork(1, bad, 1)


@pytest.mark.parametrize("bad", ["1", 1.0, None, True])
def test_request_ids_of_another_type_say_they_are_integers(manager, bad):
    with pytest.raises(TypeError, match="request ids are unsigned 64-bit integers"):
        manager.release(bad)
    with pytest.raises(TypeError, match="request ids are unsigned 64-bit integers"):
        manager.plan_step([bad])


def test_request_ids_span_the_whole_unsigned_range(manager):
    for rid in (0, 2**63, 2**64 - 1, np.uint64(2**64 - 2)):
        manager.admit(rid, 3, 1)
        for layer, (_, stride) in enumerate(LAYERS):
            manager.ingest_prompt(rid, layer, np.zeros((3, stride), np.uint8))
        assert manager.sequence_length(rid) == 3
        manager.release(rid)
