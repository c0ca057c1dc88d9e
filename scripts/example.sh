#!/usr/bin/env bash
# Builds flowstate (release) and runs the main job: an example pipeline on 256 MiB of record
# files it generates, with a checkpoint mid-epoch and an exact resume. Extra arguments go to
# the job (e.g. --records 65536 --dir /tmp/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DFLOWSTATE_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release -j"$(nproc)" --target main_job
./build/release/examples/main_job --dir build/demo "$@"
