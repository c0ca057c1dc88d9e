#!/usr/bin/env bash
# W1 from Python (the flowstate package) next to flowstate's C++ Loader and PyTorch's
# DataLoader (num_workers 0 and 2), interleaved round by round (A B C D, B C D A, ...), with
# runs of 12 000 batches (~1 s) so that a second of machine noise is not the whole
# measurement; then the cost of state_dict() every 100 steps. Prints the summary of
# compare_summary.py (ratios and the bars of issue 13). bench/compare.sh runs the same Python
# loader among all the other W1 measurements, with its shorter runs.
#
#   bench/compare_python.sh [--build DIR (build/dev)] [--data DIR (/tmp/flowstate-w1)]
#                           [--rounds N (7)] [--out FILE]
# Needs DIR built with the targets w1_flowstate and flowstate_python.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build/dev
data=/tmp/flowstate-w1
rounds=7
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "compare_python.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $build == /* ]] || build=$root/$build
py=/usr/bin/python3
[[ -n $out ]] || out=$build/compare-python-$(date +%Y%m%d-%H%M%S).jsonl
: >"$out"
"$build/bench/w1_flowstate" --data "$data" gen >/dev/null
echo "{\"round\": 0, \"what\": \"machine\", \"cpus\": $(nproc), \"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)\", \"kernel\": \"$(uname -r)\", \"load_before\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"date\": \"$(date -Is)\"}" >>"$out"
pyfs="env PYTHONPATH=$build/python $py $root/bench/compare_python.py --data $data --workers 2"
runs=(
  "$build/bench/w1_flowstate --data $data throughput --workers 2 --batches 12000"
  "$pyfs --batches 12000"
  "$py $root/bench/compare_torch.py --data $data --workers 0 --batches 300"
  "$py $root/bench/compare_torch.py --data $data --workers 2 --batches 300"
)
for ((r = 1; r <= rounds; r++)); do
  for ((i = 0; i < ${#runs[@]}; i++)); do
    # shellcheck disable=SC2086  # the commands are word lists
    line=$(${runs[$(((i + r) % ${#runs[@]}))]} | tail -n 1)
    echo "{\"round\": $r, ${line#\{}" >>"$out"
    echo "  [$r] ${line:0:120}" >&2
  done
done
# shellcheck disable=SC2086
line=$($pyfs --state-dict-every 100 --segments 8 | tail -n 1)
echo "{\"round\": 1, ${line#\{}" >>"$out"
echo "{\"round\": 0, \"what\": \"machine_after\", \"load_after\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >>"$out"
echo "raw results: $out" >&2
"$py" "$root/bench/compare_summary.py" "$out"
