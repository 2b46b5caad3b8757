#!/usr/bin/env bash
# bench/gpu_prebuilt.sh — run a GPU script with a moex_tests built on the development machine, so that a
# fresh GPU machine skips its ~200 s build (a third to a half of a short call), falling back to the build
# there when the carried binary does not run (the device tool's H200.md: "a binary built on this
# machine's image may not run on that one's: try it in the first call and fall back to building there").
#
# Here (development machine, a CUDA build of the current tree in BUILD_DIR, default /tmp/bnorm):
#   bash bench/gpu_prebuilt.sh pack [BUILD_DIR]
#     builds $PACK_TARGETS there (default moex_tests; e.g. PACK_TARGETS=moex_model_bench for the model
#     runtime's A/B and end-to-end runs), writes build-carry/<target>.xz and the shared libraries they need
#     that are not CUDA's or the C/C++ runtime's (libfmt) — ~18 MB each with the default architectures
#     (90a-real; a build dir configured with 90a, which embeds PTX too, gives ~36 MB each), and a call may
#     carry 64 MiB: moex_tests + moex_model_bench + moex fit; build-carry/ is ignored by git.
# There (`run` with carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session45b.sh
#     unpacks every build-carry/<target>.xz into build-gpu/; if they start (moex_tests: its test list;
#     others: --help), runs the script with SKIP_BUILD=1, else prints why and runs the script as it is
#     (which builds).
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
  pack)
    B=${2:-${BUILD_DIR:-/tmp/bnorm}}
    targets=${PACK_TARGETS:-moex_tests}
    # shellcheck disable=SC2086
    cmake --build "$B" --target $targets > /dev/null || { echo "gpu_prebuilt: build in $B failed" >&2; exit 1; }
    grep -q "sm_90a\|90a" "$B/CMakeCache.txt" || echo "gpu_prebuilt: warning: $B may not build for sm_90a" >&2
    rm -rf build-carry && mkdir -p build-carry
    for t in $targets; do xz -T0 -6 -c "$B/$t" > "build-carry/$t.xz"; done
    # libraries outside the system C/C++ runtime and CUDA's own (those are on the GPU machine)
    for t in $targets; do ldd "$B/$t"; done | sort -u | awk '/=>/ {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*|libgomp.so*|ld-linux*) ;;
        libcuda*|libcublas*|libcudart*|libnccl*|libnvidia*) ;;
        *) cp -L "$path" "build-carry/$name" ;;
      esac
    done
    git rev-parse HEAD > build-carry/commit
    git diff --quiet HEAD -- src tests bench/*.cpp CMakeLists.txt || echo "gpu_prebuilt: warning: uncommitted changes in the packed build" >&2
    du -sh build-carry
    [ "$(du -sm build-carry | cut -f1)" -lt 64 ] || echo "gpu_prebuilt: warning: build-carry is over the 64 MiB a call may carry" >&2
    ;;
  run)
    script=${2:?"gpu_prebuilt run SCRIPT"}
    export BUILD=${BUILD:-build-gpu}
    mkdir -p "$BUILD"
    export LD_LIBRARY_PATH="$PWD/build-carry:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
    unpack() {  # build-carry/$1.xz → $BUILD/$1, then a first start of it
      xz -dc "build-carry/$1.xz" > "$BUILD/$1" 2> /dev/null ||
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
          "build-carry/$1.xz" "$BUILD/$1" 2> /dev/null || return 1
      chmod +x "$BUILD/$1"
      if [ "$1" = moex_tests ]; then "$BUILD/$1" --gtest_list_tests > /dev/null 2> "$BUILD/prebuilt.err"
      else "$BUILD/$1" --help > /dev/null 2> "$BUILD/prebuilt.err"; fi
    }
    ok=0
    for f in build-carry/*.xz; do
      [ -f "$f" ] || continue
      t=$(basename "$f" .xz)
      if unpack "$t"; then ok=1; else ok=0; rm -f "$BUILD/$t"; break; fi
    done
    if [ "$ok" = 1 ]; then
      echo "== prebuilt $(cd build-carry && ls ./*.xz | sed 's|./||; s|.xz||' | tr '\n' ' ')of $(cat build-carry/commit 2> /dev/null) runs here: no build"
      export SKIP_BUILD=1
    else
      echo "== no prebuilt binary that runs here ($(head -c 300 "$BUILD/prebuilt.err" 2> /dev/null)): building"
    fi
    exec bash "$script"
    ;;
  *)
    echo "usage: bench/gpu_prebuilt.sh pack [BUILD_DIR] | run SCRIPT" >&2
    exit 2
    ;;
esac
