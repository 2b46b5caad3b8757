# bench/gpu_common.sh — the steps every one-call GPU script repeats, sourced from the repository root
# (`source bench/gpu_common.sh`). Newer scripts use it; the older bench/gpu_session*.sh keep their own
# copies so that the commands recorded in docs/PERF.md run as they did.
#
# Sets: OUT (default ./out, created), BUILD (default build-gpu), PARTS (the caller's default when
# unset: pass it as $1), MOEX_SOURCE_DIR. Functions:
#   has STEP                   whether STEP is in $PARTS
#   left                       seconds left until $DEADLINE (default 560) seconds after the start
#   stamp TEXT                 "== TEXT (seconds since start)"
#   envs_of "A=1,B=2"          "A=1 B=2" for env ("-" or "": nothing)
#   gpu_build TARGET...        CUDA Release build of the targets into $BUILD (plus the cmake arguments
#                              of $CMAKE_EXTRA, e.g. -DMOEX_BUILD_TESTS=OFF); exits on error with the
#                              compiler's error lines; prints how many functions ptxas serialized (C7511)
#   gpu_tests FILTER [TIMEOUT] moex_tests on FILTER -> $OUT/tests.log; prints rc, the summary lines,
#                              the harness' "rel L2" lines and the failures
#   gpu_sanitize FILTER [TIMEOUT]  compute-sanitizer memcheck and racecheck on FILTER, each within
#                              TIMEOUT seconds (default 150) -> $OUT/<tool>.log
#   ncu_table CSV              a table (time, DRAM bytes, bandwidth, registers, grid) of the kernels in
#                              an `ncu --csv --print-units base` file with gpu__time_duration.sum,
#                              dram__bytes_read.sum, launch__registers_per_thread, launch__grid_size
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-${1:-}}
t0=$(date +%s)
has() { [[ " $PARTS " == *" $1 "* ]]; }
# seconds left of the DEADLINE seconds since the start (a caller may set its own default first)
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - t0) )); }
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
envs_of() { [ "${1:--}" = "-" ] && return; echo "${1//,/ }"; }

gpu_build() {
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON ${CMAKE_EXTRA:-} &&
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
    timeout "${2:-150}" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/moex_tests" --gtest_filter="$1" > "$OUT/$tool.log" 2>&1
    echo "$tool rc $? ($(grep -c 'Invalid' "$OUT/$tool.log") invalid, $(grep -ci 'hazard' "$OUT/$tool.log") hazard lines)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/$tool.log" | head -4
  done
}

ncu_table() {
  python3 - "$1" <<'PY'
import csv, sys, re
num = lambda v: float(str(v).replace(",", "") or 0)
rows = list(csv.reader(open(sys.argv[1])))
start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if start is None: print("no ncu rows"); sys.exit()
h = rows[start]; I = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = {}
for r in rows[start + 1:]:
    if len(r) < len(h): continue
    d = k.setdefault(r[I["ID"]], {"name": re.sub(r"\(.*", "", r[I["Kernel Name"]]).replace("moex::", "")[:60]})
    d[r[I["Metric Name"]]] = r[I["Metric Value"]]
print(f"{'id':>4} {'kernel':60} {'us':>7} {'MB':>7} {'GB/s':>6} {'regs':>4} grid")
for i, d in sorted(k.items(), key=lambda x: int(x[0])):
    us = num(d.get("gpu__time_duration.sum", 0)) / 1e3; mb = num(d.get("dram__bytes_read.sum", 0)) / 1e6
    print(f"{i:>4} {d['name']:60} {us:7.2f} {mb:7.2f} {mb / us * 1e3 if us else 0:6.0f} {d.get('launch__registers_per_thread', '?'):>4} {d.get('launch__grid_size', '?')}")
PY
}
