#!/usr/bin/env bash
# Builds moex and runs every test. Installs the build dependencies first (Debian packages only).
#   ./scripts/test.sh            (build dir: build/, override with BUILD_DIR=...)
# CUDA code is compiled when nvcc is found; GPU tests skip themselves (with the reason) where no GPU is.
# CMAKE_EXTRA adds configure options, e.g. CMAKE_EXTRA=-DMOEX_CUDA=OFF for a CPU-only build.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_BUILD_TESTS=ON ${CMAKE_EXTRA:-}
cmake --build "$BUILD_DIR" -j "$JOBS" 2>&1 | tee "$BUILD_DIR/build.log"
# ptxas C7511 ("wgmma.mma_async instructions are serialized due to insufficient register
# resources") turns a whole TMA kernel's tensor-core pipeline serial, its default path included: it
# cost mixtral_8x7b FP8 T = 64 12 % on the H200 before anyone saw it (docs/PERF.md, twenty-fourth
# session). ptxas reports it only when it compiles the object, so a clean build (CI) always checks.
if grep -q "C7511" "$BUILD_DIR/build.log"; then
  echo "error: ptxas serialized the wgmma pipeline (C7511) in:" >&2
  grep "C7511" "$BUILD_DIR/build.log" | sed -E "s/.*function '([^']*)'.*/  \1/" | sort -u >&2
  exit 1
fi
# passive OpenMP waiting: tests run side by side and must not spin against each other
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
