"""sparsekv.__version__ is the CMake project version, and the package metadata agrees."""
import importlib.metadata
import pathlib
import re

import sparsekv


def test_version_matches_the_cmake_project_and_the_metadata():
    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    project = re.search(r"project\(sparsekv VERSION ([0-9.]+)", cmake).group(1)
    assert sparsekv.__version__ == project
    assert importlib.metadata.version("sparsekv") == project
