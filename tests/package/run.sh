#!/usr/bin/env bash
# Installs a built flowstate into a temporary prefix, then configures, builds and runs the
# consumer project against it, as a user's CMake project would: find_package(flowstate).
# Usage: tests/package/run.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build=$(cd "$1" && pwd)
work=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work/prefix" "$work/consumer-build"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# Only what was installed: no source or build tree of flowstate on any path.
cmake -S "$here" -B "$work/consumer-build" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer-build" -j "${JOBS:-2}" > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
if grep -q -- "-fsanitize\|-Wpedantic\|cudart" "$work/consumer-build/CMakeFiles/consumer.dir/flags.make" \
     "$work/consumer-build/CMakeFiles/consumer.dir/link.txt"; then
  echo "package: flowstate's private flags reached the consumer:"
  cat "$work/consumer-build/CMakeFiles/consumer.dir/flags.make" \
      "$work/consumer-build/CMakeFiles/consumer.dir/link.txt"
  exit 1
fi
"$work/consumer-build/consumer" "$work/run"
