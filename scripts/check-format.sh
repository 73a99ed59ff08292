#!/usr/bin/env bash
# Fails (exit 1) if a tracked C++ or CUDA file differs from what clang-format makes of it with the
# repository's .clang-format, and lists those files. `--fix` formats them in place instead.
# .ci/run calls it before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
[[ ${1:-} == --fix ]] && fix=1
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
unformatted=()
while IFS= read -r file; do
  if ((fix)); then
    clang-format -i "$file"
  elif ! clang-format --dry-run -Werror "$file" >/dev/null 2>&1; then
    unformatted+=("$file")
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if ((${#unformatted[@]})); then
  echo "check-format: ${#unformatted[@]} files differ from .clang-format ($(clang-format --version)):"
  printf '  %s\n' "${unformatted[@]}"
  echo "run: bash scripts/check-format.sh --fix"
  exit 1
fi
echo "check-format: every C++/CUDA file is formatted ($(clang-format --version | head -n 1))"
