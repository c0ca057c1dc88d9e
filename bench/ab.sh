#!/usr/bin/env bash
# A/B of two builds of w1_flowstate, interleaved (A B B A A B ...), for judging a runtime
# change: build the change in a scratch copy, then
#
#   bench/ab.sh BUILD_A BUILD_B [--rounds N] [--data DIR] [--key samples_per_s] -- MODE ARGS...
#   bench/ab.sh build/bench /tmp/perfcopy/build --rounds 8 -- throughput --workers 2
#
# BUILD is a build directory (its bench/w1_flowstate is run) or the binary itself. Prints each
# side's median [min - max] of --key (and of cpu_ns_per_sample when present) and the median of
# the per-round ratios B/A.
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n '2,10p' "$0"; exit 2; }
bin() { if [[ -x "$1" && ! -d "$1" ]]; then echo "$1"; else echo "$1/bench/w1_flowstate"; fi; }
a=$(bin "$1"); b=$(bin "$2"); shift 2
rounds=6 data=/tmp/flowstate-w1 key=samples_per_s
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --key) key=$2; shift 2 ;;
    *) echo "ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "${1:-}" == "--" ]] && shift
[[ $# -ge 1 ]] || { echo "ab.sh: give the w1_flowstate mode after --" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 0; r < rounds; r++)); do
  # ABBA order: a slow drift in machine load cancels out.
  if ((r % 2 == 0)); then order=(A B); else order=(B A); fi
  for side in "${order[@]}"; do
    exe=$a; [[ $side == B ]] && exe=$b
    echo "$side $r $("$exe" --data "$data" "$@" | tail -n 1)" >>"$out"
  done
done
/usr/bin/python3 - "$out" "$key" "$a" "$b" <<'PY'
import json, statistics, sys
path, key, a, b = sys.argv[1:5]
v = {"A": {}, "B": {}}
cpu = {"A": [], "B": []}
for line in open(path):
    side, r, js = line.split(" ", 2)
    d = json.loads(js)
    v[side][int(r)] = d[key]
    if "cpu_ns_per_sample" in d:
        cpu[side].append(d["cpu_ns_per_sample"])
for side, exe in (("A", a), ("B", b)):
    x = sorted(v[side].values())
    c = f"; cpu_ns_per_sample {statistics.median(cpu[side]):.0f}" if cpu[side] else ""
    print(f"{side} {exe}\n  {key} median {statistics.median(x):.4g} [{x[0]:.4g} - {x[-1]:.4g}]{c}")
ratios = sorted(v["B"][r] / v["A"][r] for r in v["A"] if r in v["B"])
print(f"B/A per round: median {statistics.median(ratios):.3f} [{ratios[0]:.3f} - {ratios[-1]:.3f}]"
      f" over {len(ratios)} rounds")
PY
