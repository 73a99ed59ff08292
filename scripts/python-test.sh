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

# Progress lines, so that a long step is never silent.
say() { echo "python-test: $*"; }
# filtered LOG REGEX COMMAND...: COMMAND's output into LOG, the lines matching REGEX shown as they
# come (progress_test.sh checks it).
# shellcheck source=scripts/progress.sh
source "$root/scripts/progress.sh"

start=$SECONDS
say "installing numpy, pytest and prometheus_client from PyPI"
"${pip[@]}" install -q numpy pytest prometheus_client
if [[ "${SPARSEKV_PYTHON_TORCH:-1}" != 0 ]]; then
  # PyPI is the only index this script uses, and its Linux torch wheel is the CUDA build: the
  # tests use it on the CPU, but it brings the CUDA libraries along. pip prints a line per wheel
  # ("Collecting nvidia-...", then, indented, "  Downloading ...whl (366.1 MB)" or "  Using
  # cached ..."), shown as they come.
  say "installing torch from PyPI: the Linux wheel bundles the CUDA libraries, about 3.3 GB to" \
    "download and 5.3 GB installed (3-4 min on a fast link; SPARSEKV_PYTHON_TORCH=0 skips it)"
  filtered "$root/build/python-torch.log" '^ *(Collecting|Downloading|Using cached|Successfully)' \
    "${pip[@]}" install --progress-bar off torch || exit $?
  # Source only: the conformance test reads the signatures SGLang's coordinator has.
  say "installing sglang==$sglang_version without its dependencies (source only)"
  "${pip[@]}" install -q --no-deps "sglang==$sglang_version"
fi
say "test requirements installed in $((SECONDS - start)) s"

start=$SECONDS
say "building and installing the package (pip install .: CMake compiles the library and the" \
  "binding; minutes on 2 cores, a build line per file)"
filtered "$root/build/python-install.log" '^ *\[[0-9]+/[0-9]+\]|^ *-- sparsekv|^Successfully' \
  "${pip[@]}" install -v . -Ccmake.define.SPARSEKV_CUDA="${SPARSEKV_PYTHON_CUDA:-OFF}" || exit $?
say "pip install . took $((SECONDS - start)) s"

# Run from outside the source tree so that `import sparsekv` finds the installed package.
cd "$root/python/tests"
say "running pytest"
"$venv/bin/python" -m pytest -ra -p no:cacheprovider "$@" .
