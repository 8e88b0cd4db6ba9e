#!/usr/bin/env bash
# On the CPU machine: builds `sparrow` (Release, CUDA backend for sm_90a) in build-bench/ and puts
# it with the shared libraries the device image lacks (cpp-httplib, brotli, PCRE2 when linked
# shared; docs/cuda.md) into build-bench-carry/, the folder bench/run_device.sh runs from. Both
# folders match /build*/ in .git/info/exclude, so name build-bench-carry in the device tool's carry.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARROW_CUDA=ON >/dev/null
ninja -C build-bench sparrow
rm -rf build-bench-carry
mkdir -p build-bench-carry/lib
cp build-bench/bin/sparrow build-bench-carry/
ldd build-bench/bin/sparrow | awk '/=> \// {print $3}' | grep -E 'httplib|brotli|pcre2' | while read -r lib; do
  cp -L "$lib" build-bench-carry/lib/
done
ls -la build-bench-carry build-bench-carry/lib
du -sh build-bench-carry
