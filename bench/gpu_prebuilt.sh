#!/usr/bin/env bash
# bench/gpu_prebuilt.sh — run a GPU script with a moex_tests built on the development machine, so that a
# fresh GPU machine skips its ~200 s build (a third to a half of a short call), falling back to the build
# there when the carried binary does not run (the device tool's H200.md: "a binary built on this
# machine's image may not run on that one's: try it in the first call and fall back to building there").
#
# Here (development machine, a CUDA build of the current tree in BUILD_DIR, default /tmp/bnorm):
#   bash bench/gpu_prebuilt.sh pack [BUILD_DIR]
#     builds moex_tests there, writes build-carry/moex_tests.xz and the shared libraries it needs that
#     are not CUDA's or the C/C++ runtime's (libfmt) — ~31 MB, under the 64 MiB a call may carry;
#     build-carry/ is ignored by git.
# There (`run` with carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session45b.sh
#     unpacks build-gpu/moex_tests; if it starts (its test list), runs the script with SKIP_BUILD=1,
#     else prints why and runs the script as it is (which builds).
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
  pack)
    B=${2:-${BUILD_DIR:-/tmp/bnorm}}
    cmake --build "$B" --target moex_tests > /dev/null || { echo "gpu_prebuilt: build in $B failed" >&2; exit 1; }
    grep -q "sm_90a\|90a" "$B/CMakeCache.txt" || echo "gpu_prebuilt: warning: $B may not build for sm_90a" >&2
    rm -rf build-carry && mkdir -p build-carry
    xz -T0 -6 -c "$B/moex_tests" > build-carry/moex_tests.xz
    # libraries outside the system C/C++ runtime and CUDA's own (those are on the GPU machine)
    ldd "$B/moex_tests" | awk '/=>/ {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*|libgomp.so*|ld-linux*) ;;
        libcuda*|libcublas*|libcudart*|libnccl*|libnvidia*) ;;
        *) cp -L "$path" "build-carry/$name" ;;
      esac
    done
    git rev-parse HEAD > build-carry/commit
    git diff --quiet HEAD -- src tests CMakeLists.txt || echo "gpu_prebuilt: warning: uncommitted changes in the packed build" >&2
    du -sh build-carry
    ;;
  run)
    script=${2:?"gpu_prebuilt run SCRIPT"}
    export BUILD=${BUILD:-build-gpu}
    mkdir -p "$BUILD"
    export LD_LIBRARY_PATH="$PWD/build-carry:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
    if [ -f build-carry/moex_tests.xz ] &&
       { xz -dc build-carry/moex_tests.xz > "$BUILD/moex_tests" 2> /dev/null ||
         python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
           build-carry/moex_tests.xz "$BUILD/moex_tests" 2> /dev/null; } &&
       chmod +x "$BUILD/moex_tests" && "$BUILD/moex_tests" --gtest_list_tests > /dev/null 2> "$BUILD/prebuilt.err"; then
      echo "== prebuilt moex_tests of $(cat build-carry/commit 2> /dev/null) runs here: no build"
      export SKIP_BUILD=1
    else
      echo "== the prebuilt moex_tests does not run here ($(head -c 300 "$BUILD/prebuilt.err" 2> /dev/null)): building"
      rm -f "$BUILD/moex_tests"
    fi
    exec bash "$script"
    ;;
  *)
    echo "usage: bench/gpu_prebuilt.sh pack [BUILD_DIR] | run SCRIPT" >&2
    exit 2
    ;;
esac
