# bench/gpu_common.sh — the steps every one-call GPU script repeats, sourced from the repository root
# (`source bench/gpu_common.sh`). Newer scripts use it; the older bench/gpu_session*.sh keep their own
# copies so that the commands recorded in docs/PERF.md run as they did.
#
# Sets: OUT (default ./out, created), BUILD (default build-gpu), PARTS (the caller's default when
# unset: pass it as $1), MOEX_SOURCE_DIR. Functions:
#   has STEP                   whether STEP is in $PARTS
#   stamp TEXT                 "== TEXT (seconds since start)"
#   envs_of "A=1,B=2"          "A=1 B=2" for env ("-" or "": nothing)
#   gpu_build TARGET...        CUDA Release build of the targets into $BUILD; exits on error with the
#                              compiler's error lines; prints how many functions ptxas serialized (C7511)
#   gpu_tests FILTER [TIMEOUT] moex_tests on FILTER -> $OUT/tests.log; prints rc, the summary lines,
#                              the harness' "rel L2" lines and the failures
#   gpu_sanitize FILTER        compute-sanitizer memcheck and racecheck on FILTER -> $OUT/<tool>.log
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-${1:-}}
t0=$(date +%s)
has() { [[ " $PARTS " == *" $1 "* ]]; }
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
envs_of() { [ "${1:--}" = "-" ] && return; echo "${1//,/ }"; }

gpu_build() {
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target "$@"; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
  # ptxas C7511: a kernel's wgmma pipeline serialized for lack of registers (scripts/test.sh fails on it)
  echo "wgmma serialized (ptxas C7511): $(grep -c C7511 "$OUT/build.log") function(s)"
}

gpu_tests() {
  stamp "tests [$1]"
  timeout "${2:-240}" "$BUILD/moex_tests" --gtest_filter="$1" > "$OUT/tests.log" 2>&1
  echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|rel L2" "$OUT/tests.log" | head -40
  grep -B3 -A12 "Failure" "$OUT/tests.log" | head -60
}

gpu_sanitize() {
  local tool
  for tool in memcheck racecheck; do
    stamp "$tool [$1]"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/moex_tests" --gtest_filter="$1" > "$OUT/$tool.log" 2>&1
    echo "$tool rc $? ($(grep -c 'Invalid' "$OUT/$tool.log") invalid, $(grep -ci 'hazard' "$OUT/$tool.log") hazard lines)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/$tool.log" | head -4
  done
}
