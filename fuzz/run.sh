#!/bin/sh
# Builds the libFuzzer targets with the `fuzz` preset (clang, libFuzzer, AddressSanitizer) and
# runs each for a bounded time. Crashing inputs are written to fuzz/regressions/<target>/,
# where the cli test suite replays them on every build: fix the bug, keep the file.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 30 s; yaml state)
#
# Environment: JOBS (build parallelism, default 2), CMAKE_ARGS (extra configure arguments).
set -eu
cd "$(dirname "$0")/.."
secs=${1:-30}
[ $# -gt 0 ] && shift
targets=${*:-"yaml state"}
build=build/fuzz

# shellcheck disable=SC2086
cmake --preset fuzz ${CMAKE_ARGS:-} >/dev/null
fuzzers=""
for t in $targets; do fuzzers="$fuzzers ${t}_fuzzer"; done
# shellcheck disable=SC2086
if ! cmake --build "$build" -j"${JOBS:-2}" --target $fuzzers; then
  echo "fuzz/run.sh: build failed (is 'if(FLOWSTATE_BUILD_FUZZERS) add_subdirectory(fuzz)" \
       "endif()' in the top-level CMakeLists.txt?)" >&2
  exit 2
fi

status=0
for t in $targets; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus" "fuzz/regressions/$t"
  dict=""
  case $t in
    yaml)
      cp examples/pipelines/*.yaml "$corpus"/ 2>/dev/null || true
      dict="-dict=fuzz/yaml.dict" ;;
    state)
      FLOWSTATE_FUZZ_WRITE_SEEDS="$corpus"
      export FLOWSTATE_FUZZ_WRITE_SEEDS ;;
  esac
  echo "fuzz/run.sh: $t for ${secs}s"
  # The first corpus directory collects new inputs; the regressions are read only.
  # shellcheck disable=SC2086
  if ! "$build/fuzz/${t}_fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="fuzz/regressions/$t/" $dict \
       "$corpus" "fuzz/regressions/$t"; then
    echo "fuzz/run.sh: $t found a problem; the input is in fuzz/regressions/$t/" >&2
    status=1
  fi
  unset FLOWSTATE_FUZZ_WRITE_SEEDS || true
done
exit $status
