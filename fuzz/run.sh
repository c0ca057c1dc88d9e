#!/bin/sh
# Builds the libFuzzer targets with the `fuzz` preset (clang, libFuzzer, AddressSanitizer) and
# runs each for a bounded time, on its seeds (fuzz/corpus/<target>/, plus generated ones) and
# its kept regression inputs (fuzz/regressions/<target>/, which the cli test suite replays on
# every build). The targets:
#
#   yaml   the YAML pipeline loader, overrides included          (fuzz/yaml.dict)
#   state  the checkpoint state reader and every node's restore  (seeds generated)
#   tar    the tar reader: TarScanner, grouping with and without `fields`, on_missing
#          error/skip, and its index cache (a cached read must match the built one)
#   lines  the lines source: text, JSON Lines with and without json_fields, skip_empty off
#          and on, and its index cache                              (fuzz/lines.dict)
#   index  the `<file>.fsidx` cache of the lines and tar sources: raw cache files, and valid
#          caches holding fuzzed indexes                             (seeds generated)
#   megatron  the `indexed` source's Megatron .idx/.bin checks, reading as documents and
#          as sequences (input: u16 length of the .idx, the .idx, then the .bin)
#
# A crash, timeout or out-of-memory input a target finds is copied into
# fuzz/regressions/<target>/ (libFuzzer names it crash-<sha1>, timeout-<sha1>, oom-<sha1>),
# the script goes on with the next target and exits 1, naming what each target found: fix the
# bug, keep the file (commit it). Every target ends with a summary line:
#
#   fuzz: tar     ok         61 s      412345 runs    6760 exec/s
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 30 s; every target)
#
# Environment: JOBS (build parallelism, default 2), CMAKE_ARGS (extra configure arguments).
# Adding a target: its name in all_targets below and in fuzz/CMakeLists.txt (see
# fuzz/fuzz_targets.h).
set -eu
cd "$(dirname "$0")/.."
all_targets="yaml state tar lines index megatron"
secs=${1:-30}
[ $# -gt 0 ] && shift
targets=${*:-$all_targets}
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
summary=""
found=""
for t in $targets; do
  corpus="$build/corpus/$t"         # grows across runs; new inputs go here
  artifacts="$build/artifacts/$t"   # what this run found, before it is kept
  log="$build/logs/$t.log"
  rm -rf "$artifacts"
  mkdir -p "$corpus" "$artifacts" "$build/logs" "fuzz/regressions/$t"
  [ -d "fuzz/corpus/$t" ] && cp fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  [ "$t" = yaml ] && { cp examples/pipelines/*.yaml "$corpus"/ 2>/dev/null || true; }
  dict=""
  [ -f "fuzz/$t.dict" ] && dict="-dict=fuzz/$t.dict"
  # The state and index targets write valid inputs of their own fixtures as seeds.
  FLOWSTATE_FUZZ_WRITE_SEEDS="$corpus"
  export FLOWSTATE_FUZZ_WRITE_SEEDS
  echo "fuzz/run.sh: $t for ${secs}s (log: $log)"
  start=$(date +%s)
  rc=0
  # The first corpus directory collects new inputs; the seeds and regressions are read only.
  # shellcheck disable=SC2086
  "$build/fuzz/${t}_fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" $dict \
    "$corpus" "fuzz/regressions/$t" >"$log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  result=ok
  kept=""
  for a in "$artifacts"/*; do
    [ -f "$a" ] || continue
    cp "$a" "fuzz/regressions/$t/"
    kept="$kept fuzz/regressions/$t/$(basename "$a")"
  done
  if [ "$rc" -ne 0 ] || [ -n "$kept" ]; then
    status=1
    result=$(grep -o -m1 'ERROR: libFuzzer: [A-Za-z-]*\|ERROR: AddressSanitizer: [A-Za-z-]*' "$log" \
             | sed 's/ERROR: //; s/: /:/' || true)
    [ -n "$result" ] || result="failed(rc=$rc)"
    tail -n 40 "$log" >&2
    found="$found
fuzz/run.sh: $t found $result; input kept:${kept:- none (see $log)}"
  fi
  line=$(printf 'fuzz: %-6s %-28s %5s s %10s runs %7s exec/s' "$t" "$result" "$elapsed" \
         "${runs:-?}" "${rate:-?}")
  echo "$line"
  summary="$summary
$line"
done
echo "fuzz/run.sh: summary (${secs} s per target):$summary"
if [ "$status" -ne 0 ]; then
  echo "$found" >&2
  echo "fuzz/run.sh: fix the bugs, then commit the inputs kept under fuzz/regressions/" >&2
fi
exit $status
