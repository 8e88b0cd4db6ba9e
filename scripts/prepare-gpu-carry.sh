#!/usr/bin/env bash
# On the CPU machine, before a device session: builds the Release binaries in build/ (CUDA backend
# for sm_90a; CUDA runtime static) and copies them, with the shared libraries the GPU machine's
# image lacks (cpp-httplib and brotli, which Debian ships only as shared libraries), into
# .gpu-carry/. Name `.gpu-carry` in the device tool's `carry`; scripts/gpu-check.sh --bin .gpu-carry,
# scripts/gpu-probe.sh and bench/run_device.sh use it and find .gpu-carry/lib themselves;
# tools/serve_check.py and a binary run by hand after `export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib`.
# .gpu-carry/ must be ignored by git (`echo /.gpu-carry/ >> .git/info/exclude`).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARROW_CUDA=ON >/dev/null
cmake --build build --target sparrow sparrow_cuda_tests sparrow_npy_compare sparrow_host_overhead
rm -rf .gpu-carry
mkdir -p .gpu-carry/lib
cp build/bin/sparrow build/bin/sparrow_cuda_tests build/bin/sparrow_npy_compare build/bin/sparrow_host_overhead .gpu-carry/
# Symbols stripped from the copies (build/ keeps them): the carry, with the tracked files, must stay
# within the device tool's 64 MiB.
strip .gpu-carry/sparrow .gpu-carry/sparrow_cuda_tests .gpu-carry/sparrow_npy_compare .gpu-carry/sparrow_host_overhead
for b in .gpu-carry/sparrow .gpu-carry/sparrow_cuda_tests; do
  ldd "$b" | awk '/=> \// {print $3}' | grep -E 'httplib|brotli|pcre2' || true
done | sort -u | while read -r lib; do cp -L "$lib" .gpu-carry/lib/; done
ls -la .gpu-carry .gpu-carry/lib
du -sh .gpu-carry
