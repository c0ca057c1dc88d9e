#!/usr/bin/env bash
# Side-by-side comparison on workload W1 (DESIGN.md §11): flowstate (C++, and from Python
# through its package) against LibTorch's make_data_loader and PyTorch's DataLoader, interleaved round by round in one run (A B C ...
# A B C ...), so every loader sees the same machine. Also measures, for the bars of issue 6:
# the single-thread gather ceiling, the cost of a checkpoint every 100 steps, restore time to
# first batch, checkpoint size, memory over 5 epochs, and a map-heavy pipeline on 1 vs 2
# workers. Prints medians, spreads and ratios, and which bars pass.
#
#   bench/compare.sh                 # install what is missing, build, generate, measure
#   bench/compare.sh --rounds 3 --no-install --out /tmp/w1.jsonl
#   bench/compare.sh --w2-only --no-install     # W2 alone (bench/w2_compare.sh)
#
# After W1 it runs W2 (LLM token packing; bench/w2_compare.sh: Megatron-style Python packer,
# single-thread ceiling, flowstate 1 and 2 workers) unless --no-w2.
# Options: --rounds N (5)  --data DIR (/tmp/flowstate-w1, reused when present)
#          --build DIR (build/bench)  --out FILE (raw JSON lines; default under the build dir)
#          --no-install  --no-build  --only-summary FILE (re-print a previous run's summary)
#          --no-w2  --w2-only
# Takes about 5 minutes on 2 cores once built (the first build of LibTorch's side adds ~2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=5
data=/tmp/flowstate-w1
build="$root/build/bench"
out=""
install=1
do_build=1
summary_only=""
w2=1
w2_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-install) install=0; shift ;;
    --no-build) do_build=0; shift ;;
    --only-summary) summary_only=$2; shift 2 ;;
    --no-w2) w2=0; shift ;;
    --w2-only) w2_only=1; shift ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

py=/usr/bin/python3  # Debian's interpreter: python3-torch lives there, not in a venv
summarize() { "$py" "$root/bench/compare_summary.py" "$1"; }
if [[ -n "$summary_only" ]]; then summarize "$summary_only"; exit 0; fi

# Progress and build output go to stderr; stdout carries the summary alone.
if [[ $install == 1 ]]; then
  FLOWSTATE_DEPS_BENCH=1 "$root/scripts/install-deps.sh" >&2
fi
if [[ $do_build == 1 ]]; then
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLOWSTATE_WITH_CUDA=OFF \
      -DFLOWSTATE_BUILD_EXAMPLES=OFF >&2
  fi
  w2_targets=""
  [[ $w2 == 1 ]] && w2_targets="flowstate w2_flowstate w2_ceiling"
  if [[ $w2_only == 1 ]]; then
    # shellcheck disable=SC2086
    cmake --build "$build" -j2 --target $w2_targets >&2
  else
    # shellcheck disable=SC2086
    cmake --build "$build" -j2 --target w1_flowstate libtorch_loader flowstate_python $w2_targets >&2
  fi
fi
if [[ $w2_only == 1 ]]; then
  exec "$root/bench/w2_compare.sh" --build "$build" --rounds "$rounds"
fi
fs="$build/bench/w1_flowstate"
lt="$build/bench/libtorch_loader"
for b in "$fs" "$lt"; do
  [[ -x "$b" ]] || { echo "compare.sh: $b is missing (build it, or drop --no-build)" >&2; exit 1; }
done
[[ -n "$out" ]] || out="$build/compare-$(date +%Y%m%d-%H%M%S).jsonl"
: >"$out"

# Each measurement prints one JSON line; tag it with its round and append it.
record() {
  local round=$1; shift
  local line
  if ! line=$("$@" | tail -n 1); then
    echo "compare.sh: failed: $*" >&2
    exit 1
  fi
  echo "{\"round\": $round, ${line#\{}" >>"$out"
  echo "  [$round] ${line:0:150}" >&2
}

"$fs" --data "$data" gen >/dev/null  # writes the files when missing, reads them into the cache
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
echo "{\"round\": 0, \"what\": \"machine\", \"cpus\": $(nproc), \"cpu\": \"$cpu\", \"kernel\": \"$(uname -r)\", \"load_before\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"date\": \"$(date -Is)\"}" >>"$out"

echo "W1 throughput, $rounds interleaved rounds" >&2
pyfs="env PYTHONPATH=$build/python $py $root/bench/compare_python.py --data $data"
runs=(
  "$fs --data $data throughput --workers 1 --batches 3072"
  "$pyfs --workers 2 --batches 3072"
  "$fs --data $data throughput --workers 2 --batches 3072"
  "$lt --data $data --workers 2 --batches 2048"
  "$py $root/bench/compare_torch.py --data $data --workers 0 --batches 300"
  "$py $root/bench/compare_torch.py --data $data --workers 2 --batches 300"
  "$fs --data $data gather --rounds 1"
)
for ((r = 1; r <= rounds; r++)); do
  # Rotate the order every round, so no loader always runs right after the same neighbour.
  for ((i = 0; i < ${#runs[@]}; i++)); do
    # shellcheck disable=SC2086  # the commands are word lists
    record "$r" ${runs[$(((i + r) % ${#runs[@]}))]}
  done
done

echo "map-heavy pipeline (~2 us/sample), 1 vs 2 workers" >&2
for ((r = 1; r <= rounds; r++)); do
  for w in 1 2; do
    [[ $((r % 2)) == 0 ]] && w=$((3 - w))
    record "$r" "$fs" --data "$data" map --workers "$w" --map-rounds 1
  done
done

echo "checkpoint every 100 steps (in-process, interleaved segments)" >&2
for kind in state async sync; do
  record 1 "$fs" --data "$data" checkpoint --workers 2 --every 100 --rounds 8 --kind "$kind"
done

echo "state_dict() every 100 steps from Python (interleaved segments)" >&2
# shellcheck disable=SC2086
record 1 $pyfs --workers 2 --state-dict-every 100 --segments 8

echo "restore, checkpoint size, memory" >&2
record 1 "$fs" --data "$data" restore --workers 2 --rounds 15
record 1 "$fs" --data "$data" size
record 1 "$fs" --data "$data" rss --workers 2 --epochs 5

echo "{\"round\": 0, \"what\": \"machine_after\", \"load_after\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >>"$out"
echo "raw results: $out" >&2
summarize "$out"
if [[ $w2 == 1 ]]; then
  echo "W2: LLM token packing (bench/w2_compare.sh)" >&2
  "$root/bench/w2_compare.sh" --build "$build" --rounds "$rounds"
fi
