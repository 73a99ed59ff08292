# What the scripts/gpu-*.sh scripts share: sourced first by each of them (not run on its own),
#   source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
# it changes to the repository root and sets ROOT to it. Then, as a script needs them:
#   gpu_out NAME                 OUT: the environment's, else $ROOT/NAME; created
#   gpu_install_sysroot          the header-only dependencies of .deps/sysroot, into /usr
#   gpu_tree                     the commit and the count of changed paths of the tree
#   GPU_CMAKE_ARGS               the configure flags every GPU build shares
#   gpu_configure, gpu_build_targets, gpu_build   configure and build, output to a log
#   gpu_banner NAME [REST]       the first line a script prints
#   gpu_main [-a] LOG            runs the script's main, everything printed also in LOG
# shellcheck shell=bash

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD

# gpu_out NAME: sets OUT to the environment's OUT, else $ROOT/NAME, and creates the folder.
gpu_out() {
  OUT=${OUT:-$ROOT/$1}
  mkdir -p "$OUT"
}

# gpu_install_sysroot: the CLI's header-only dependencies (CLI11, nlohmann-json) travel in
# .deps/sysroot, copied there from the preparing machine's Debian packages
# (scripts/prepare-gpu-deps.sh); the GPU machine has no network and no package for them. Copies
# them into /usr, never over a file that exists, and prints a line if it cannot (its only output).
gpu_install_sysroot() {
  if [[ -d $ROOT/.deps/sysroot/usr ]]; then
    cp -rn "$ROOT/.deps/sysroot/usr/." /usr/ 2>/dev/null || echo "!!! could not install .deps/sysroot"
  fi
}

# gpu_tree: prints "tree: <commit>, <n> changed paths" where $ROOT is a git checkout.
gpu_tree() {
  if [[ -d $ROOT/.git ]] && command -v git >/dev/null; then
    echo "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no commit'), $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed paths"
  fi
}

# Release, sm_90 (the H200), the CUDA backend on.
GPU_CMAKE_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
  -DSPARSEKV_CUDA=ON)

# gpu_configure BUILD LOG CMAKE_ARGS...: configures BUILD from $ROOT with GPU_CMAKE_ARGS and
# CMAKE_ARGS; the output replaces LOG. Returns cmake's status.
gpu_configure() {
  local build=$1 log=$2
  shift 2
  cmake -S "$ROOT" -B "$build" "${GPU_CMAKE_ARGS[@]}" "$@" >"$log" 2>&1
}

# gpu_build_targets BUILD LOG TARGETS...: builds TARGETS of BUILD on every core; the output is
# appended to LOG. Returns cmake's status.
gpu_build_targets() {
  local build=$1 log=$2
  shift 2
  cmake --build "$build" -j "$(nproc)" --target "$@" >>"$log" 2>&1
}

# gpu_build NAME BUILD LOG TARGETS... -- CMAKE_ARGS...: gpu_configure, then gpu_build_targets. If
# either fails: prints LOG's last 60 lines and "NAME: BUILD FAILED", and returns 1.
gpu_build() {
  local name=$1 build=$2 log=$3
  shift 3
  local targets=()
  while (($#)) && [[ $1 != -- ]]; do
    targets+=("$1")
    shift
  done
  (($#)) && shift
  if ! gpu_configure "$build" "$log" "$@" || ! gpu_build_targets "$build" "$log" "${targets[@]}"; then
    tail -n 60 "$log"
    echo "$name: BUILD FAILED"
    return 1
  fi
}

# gpu_banner NAME [REST]: prints "=== NAME <UTC time>REST".
gpu_banner() {
  echo "=== $1 $(date -u +%FT%TZ)${2:-}"
}

# gpu_main [-a] LOG: runs the script's main with everything it prints (stdout and stderr) also
# written to LOG (appended with -a), and exits with main's status. main runs in the pipeline's
# subshell: an EXIT trap it sets runs when it returns.
gpu_main() {
  if [[ $1 == -a ]]; then
    main 2>&1 | tee -a "$2"
  else
    main 2>&1 | tee "$1"
  fi
  exit "${PIPESTATUS[0]}"
}
