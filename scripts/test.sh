#!/usr/bin/env bash
# Builds flowstate and runs its test suite: installs the Debian packages it needs, configures
# and builds each CMake preset named (default: dev), and runs ctest for it.
#
#   scripts/test.sh                 # the normal suite (what the README asks for)
#   scripts/test.sh dev asan tsan   # also under ASan+UBSan and ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
presets=("$@")
[[ ${#presets[@]} -eq 0 ]] && presets=(dev)
for preset in "${presets[@]}"; do
  echo "==> flowstate: building and testing preset '$preset'"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j"$jobs"
  args=()
  # ThreadSanitizer covers the concurrent code: the graph and the nodes, plus its own negative
  # tests (tests/tsan) proving a real race is still reported.
  [[ $preset == tsan ]] && args+=(-L 'graph|nodes|tsan')
  ctest --preset "$preset" -j"$jobs" "${args[@]}"
done
