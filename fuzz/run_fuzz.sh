#!/usr/bin/env bash
# Builds and runs the parser fuzz target (fuzz/fuzz_parsers.cpp) for SECONDS (default 300).
# Usage: fuzz/run_fuzz.sh [SECONDS] [BUILD_DIR]
#   BUILD_DIR: a CMake build of this repo holding libmoex.a (default /tmp/model_build; built if missing).
# With clang + libFuzzer: a coverage-guided run under ASan + UBSan. Otherwise (MOEX_FUZZ_STANDALONE=1
# or no clang): the built-in mutation driver, also under ASan + UBSan where the compiler supports them.
# Prints the number of inputs executed and the time; exits non-zero on any crash or sanitizer report.
set -euo pipefail
SECS=${1:-300}
BUILD=${2:-/tmp/model_build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${MOEX_FUZZ_OUT:-/tmp/moex_fuzz}
mkdir -p "$OUT/corpus"
if [ ! -f "$BUILD/libmoex.a" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DMOEX_CUDA=OFF >/dev/null
  nice -n 19 cmake --build "$BUILD" -j1 --target moex_lib
fi
SRCS=("$ROOT/fuzz/fuzz_parsers.cpp" "$ROOT/src/model/safetensors.cpp" "$ROOT/src/model/config.cpp")
FLAGS=(-std=c++20 -O1 -g -I"$ROOT/include" -I"$ROOT/src" -fno-sanitize-recover=undefined)
LIBS=("$BUILD/libmoex.a" -lfmt -lgomp -lpthread)

# Seeds: the fixtures' configs and logits files, each prefixed with the parser-selector byte.
i=0
for f in "$ROOT"/tests/fixtures/*/config.json; do [ -f "$f" ] && { printf '\001' | cat - "$f" > "$OUT/corpus/seed_cfg_$i"; i=$((i+1)); }; done
for f in "$ROOT"/tests/fixtures/*/generation_config.json; do [ -f "$f" ] && { printf '\003' | cat - "$f" > "$OUT/corpus/seed_gen_$i"; i=$((i+1)); }; done
for f in "$ROOT"/tests/fixtures/*/logits_f32.safetensors; do [ -f "$f" ] && { printf '\000' | cat - "$f" > "$OUT/corpus/seed_st_$i"; i=$((i+1)); }; done

if [ "${MOEX_FUZZ_STANDALONE:-0}" != 1 ] && command -v clang++ >/dev/null &&
   echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long){return 0;}' |
     clang++ -x c++ -fsanitize=fuzzer - -o "$OUT/probe" 2>/dev/null; then
  nice -n 19 clang++ "${FLAGS[@]}" -fsanitize=fuzzer,address,undefined "${SRCS[@]}" "${LIBS[@]}" -o "$OUT/moex_fuzz_parsers"
  echo "running libFuzzer for ${SECS}s (corpus $OUT/corpus)"
  nice -n 19 "$OUT/moex_fuzz_parsers" -max_total_time="$SECS" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$OUT/corpus" 2>&1 | tee "$OUT/fuzz.log" | grep -E "^#[0-9]+ +(pulse|DONE)|stat::|ERROR|SUMMARY" || true
  test "${PIPESTATUS[0]}" -eq 0
else
  CXX=${CXX:-c++}
  SAN=(-fsanitize=address,undefined)
  echo 'int main(){}' | $CXX -x c++ "${SAN[@]}" - -o "$OUT/probe" 2>/dev/null || SAN=()
  nice -n 19 $CXX "${FLAGS[@]}" "${SAN[@]}" -DMOEX_FUZZ_STANDALONE=1 "${SRCS[@]}" "${LIBS[@]}" -o "$OUT/moex_fuzz_parsers_standalone"
  echo "running the standalone mutation driver for ${SECS}s"
  nice -n 19 "$OUT/moex_fuzz_parsers_standalone" "$SECS" "$OUT"/corpus/* 2>&1 | tee "$OUT/fuzz.log"
fi
