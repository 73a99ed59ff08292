#!/usr/bin/env bash
# Copies what the GPU machine lacks and cannot download into .deps/ (ignored by git, carried with
# each device run): GoogleTest's sources, the CLI's header-only dependencies (CLI11,
# nlohmann-json) with their CMake packages, hiredis (headers, static library, pkg-config file;
# the control plane's client) and UCX (its libraries, transport modules, headers and pkg-config
# file, with libnuma; the remote tier), from this machine's Debian packages.
# scripts/gpu-check.sh installs .deps/sysroot into / and builds GoogleTest from .deps/googletest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
rm -rf .deps
mkdir -p .deps/sysroot/usr/include .deps/sysroot/usr/share/cmake
cp -r /usr/src/googletest .deps/
cp -r /usr/include/CLI /usr/include/nlohmann .deps/sysroot/usr/include/
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json .deps/sysroot/usr/share/cmake/
lib=usr/lib/x86_64-linux-gnu
mkdir -p ".deps/sysroot/$lib/pkgconfig"
cp -r /usr/include/hiredis .deps/sysroot/usr/include/
cp "/$lib/libhiredis.a" ".deps/sysroot/$lib/"
cp "/$lib/pkgconfig/hiredis.pc" ".deps/sysroot/$lib/pkgconfig/"
# UCX and what its libraries load; cp -n on the GPU machine keeps whatever is there already.
for package in libucx0 libucx-dev libnuma1; do
  dpkg -L "$package" | while read -r path; do
    if [[ -f $path || -L $path ]] && [[ $path == /usr/lib/* || $path == /usr/include/* ]]; then
      mkdir -p ".deps/sysroot$(dirname "$path")"
      cp -P "$path" ".deps/sysroot$path"
    fi
  done
done
du -sh .deps
