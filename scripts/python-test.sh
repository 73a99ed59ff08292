#!/usr/bin/env bash
# Builds the Python package with `pip install .` and runs its tests with pytest.
#
# Everything goes into a virtual environment, build/python-venv (reused by later runs): the build
# requirements come from pyproject.toml, the test requirements from PyPI here. Exits non-zero if
# the build or a test fails, or if no test ran.
#
# Environment:
#   SPARSEKV_PYTHON_TORCH=0     do not install torch (PyPI's Linux wheel brings the CUDA
#                               libraries: about 3.3 GB to download, 5.3 GB installed, 3-4 min);
#                               the torch, adapter and conformance tests then skip.
#   SPARSEKV_PYTHON_CUDA=AUTO   build the wheel's CUDA backend (pyproject's default, AUTO, compiles
#                               it when nvcc exists). Default here: OFF, since the tests that run
#                               without a GPU use the CPU backend and the C++ build compiles the
#                               CUDA code already.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/build/python-venv"
# Keep in step with the SGLang version docs/integration-sglang.md was written against.
sglang_version="0.5.23"

if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

start=$SECONDS
"${pip[@]}" install -q numpy pytest
if [[ "${SPARSEKV_PYTHON_TORCH:-1}" != 0 ]]; then
  "${pip[@]}" install -q torch
  # Source only: the conformance test reads the signatures SGLang's coordinator has.
  "${pip[@]}" install -q --no-deps "sglang==$sglang_version"
fi
echo "python-test: test requirements installed in $((SECONDS - start)) s"

start=$SECONDS
"${pip[@]}" install -q . -Ccmake.define.SPARSEKV_CUDA="${SPARSEKV_PYTHON_CUDA:-OFF}"
echo "python-test: pip install . took $((SECONDS - start)) s"

# Run from outside the source tree so that `import sparsekv` finds the installed package.
cd "$root/python/tests"
"$venv/bin/python" -m pytest -ra -p no:cacheprovider "$@" .
