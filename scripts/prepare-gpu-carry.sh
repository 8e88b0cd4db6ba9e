#!/usr/bin/env bash
# On the CPU machine, before a device session: builds the Release binaries in build/ (CUDA backend
# for sm_90a; CUDA runtime static) and copies them, with the shared libraries the GPU machine's
# image lacks (cpp-httplib and brotli, which Debian ships only as shared libraries), into
# .gpu-carry/. Name `.gpu-carry` in the device tool's `carry`; scripts/gpu-check.sh --bin .gpu-carry,
# scripts/gpu-probe.sh and bench/run_device.sh use it and find .gpu-carry/lib themselves;
# tools/serve_check.py and a binary run by hand after `export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib`.
# .gpu-carry/ must be ignored by git (`echo /.gpu-carry/ >> .git/info/exclude`).
#
# Several builds in one carry (branches timed against main in one device call):
#   prepare-gpu-carry.sh              main: .gpu-carry/ from scratch, as above
#   prepare-gpu-carry.sh --as NAME    (after `git checkout BRANCH`) this build's sparrow and
#                                     sparrow_cuda_tests, stripped, into .gpu-carry/NAME/, the rest kept
#   prepare-gpu-carry.sh --pack       every build's sparrow and sparrow_cuda_tests into one xz stream,
#                                     .gpu-carry/builds.tar.xz (its 64 MiB dictionary spans the builds'
#                                     common bytes: main and six branches took 10.6 MB, against 4.3 MB
#                                     a binary xz'd alone), the loose copies removed.
# On the device, before anything runs them: xz -dc .gpu-carry/builds.tar.xz | tar -C .gpu-carry -xf -
# (a carried folder loses its ignored files between calls: unpack in every call).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude
mode=${1:-}
case "$mode" in
  --pack)
    [ -d .gpu-carry ] || { echo "prepare-gpu-carry: no .gpu-carry to pack" >&2; exit 1; }
    files=$(cd .gpu-carry && find . -maxdepth 2 -type f \( -name sparrow -o -name sparrow_cuda_tests \) | sort)
    [ -n "$files" ] || { echo "prepare-gpu-carry: no sparrow or sparrow_cuda_tests in .gpu-carry to pack" >&2; exit 1; }
    # shellcheck disable=SC2086
    (cd .gpu-carry && tar -cf - $files | xz -T1 -9 > builds.tar.xz.tmp && mv builds.tar.xz.tmp builds.tar.xz && rm -f $files)
    ls -la .gpu-carry/builds.tar.xz
    du -sh .gpu-carry
    exit 0 ;;
  --as)
    name=${2:?usage: prepare-gpu-carry.sh --as NAME}
    [[ "$name" =~ ^[A-Za-z0-9_-]+$ && "$name" != lib ]] || { echo "prepare-gpu-carry: '$name' is not a plain folder name (nor lib)" >&2; exit 1; }
    [ -d .gpu-carry ] || { echo "prepare-gpu-carry: run it once without --as first (main's build and the libraries)" >&2; exit 1; } ;;
  "") ;;
  *) echo "usage: prepare-gpu-carry.sh [--as NAME | --pack]" >&2; exit 1 ;;
esac
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARROW_CUDA=ON >/dev/null
if [ "$mode" = --as ]; then
  cmake --build build --target sparrow sparrow_cuda_tests
  mkdir -p ".gpu-carry/$name"
  strip -o ".gpu-carry/$name/sparrow" build/bin/sparrow
  strip -o ".gpu-carry/$name/sparrow_cuda_tests" build/bin/sparrow_cuda_tests
  ls -la ".gpu-carry/$name"
  exit 0
fi
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
