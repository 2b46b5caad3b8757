#!/usr/bin/env bash
# Builds moex and runs every test. Installs the build dependencies first (Debian packages only).
#   ./scripts/test.sh            (build dir: build/, override with BUILD_DIR=...)
# CUDA code is compiled when nvcc is found; GPU tests skip themselves (with the reason) where no GPU is.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_BUILD_TESTS=ON
cmake --build "$BUILD_DIR" -j "$JOBS"
# passive OpenMP waiting: tests run side by side and must not spin against each other
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
