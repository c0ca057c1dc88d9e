#!/usr/bin/env bash
# `auto` against hand-picked settings (issue 14): runs w1_flowstate MODE with every
# (--workers, --prefetch) of a grid and with `--workers auto --prefetch auto`, interleaved
# round by round (the order rotates each round, so a drift in machine load spreads over all
# settings), and prints each setting's median samples/s, the best hand-picked one, and
# auto / best (ratio of medians, and the median of the per-round ratios).
#
# The grid's best is the largest of many noisy medians, so it is biased upwards (the winner's
# curse): on a shared machine one cell's lucky rounds make it "the best". So a confirmation
# follows: --confirm N more rounds (default: --rounds) of only the best cell and auto,
# alternating which goes first, and auto / best from those rounds is the verdict.
#
#   bench/autotune.sh BUILD [--rounds N] [--confirm N] [--data DIR] [--workers "1 2 3 4"]
#                     [--prefetch "2 4 8"] [--out FILE] -- MODE [ARGS...]
#   bench/autotune.sh build/release --rounds 5 -- throughput
#   bench/autotune.sh build/release --rounds 5 -- map --map-rounds 2
#
# BUILD is a build directory (its bench/w1_flowstate is run) or the binary itself. --out keeps
# the raw lines ("W D ROUND JSON"), appended (the confirmation's to FILE.confirm);
# `--summary FILE...` prints the summary of such files pooled (rounds of the same setting from
# several runs count as more rounds).
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,21p' "$0"; exit 2; }
exe=$1; [[ -d "$exe" ]] && exe="$exe/bench/w1_flowstate"; shift
rounds=5 confirm="" data=/tmp/flowstate-w1 workers="1 2 3 4" prefetch="2 4 8" keep="" summary=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --confirm) confirm=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --prefetch) prefetch=$2; shift 2 ;;
    --out) keep=$2; shift 2 ;;
    --summary) shift; summary=("$@"); break ;;
    *) echo "autotune.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
summarize() {
/usr/bin/python3 - "$@" <<'PY'
import json, statistics, sys
v, tuned = {}, {}
for f, path in enumerate(sys.argv[1:]):
    for line in open(path):
        w, d, r, js = line.split(" ", 3)
        j = json.loads(js)
        # Rounds pair up by order: the k-th line of a setting is from the k-th round.
        runs = v.setdefault((w, d), {})
        runs[(f, len(runs))] = j["samples_per_s"]
        if w == "auto":
            tuned.setdefault("w", []).append(j.get("tuned_workers"))
            tuned.setdefault("d", []).append(j.get("tuned_prefetch"))
med = {k: statistics.median(x.values()) for k, x in v.items()}
for k in sorted(med, key=lambda k: (k[0] == "auto", k)):
    x = sorted(v[k].values())
    print(f"workers {k[0]:>4} prefetch {k[1]:>4}: median {med[k]/1e6:.3f} M/s "
          f"[{x[0]/1e6:.3f} - {x[-1]/1e6:.3f}] over {len(x)}")
hand = {k: m for k, m in med.items() if k[0] != "auto"}
best = max(hand, key=hand.get)
a = v[("auto", "auto")]
ratios = sorted(a[r] / v[best][r] for r in a if r in v[best])
print(f"best hand-picked: workers {best[0]} prefetch {best[1]} ({hand[best]/1e6:.3f} M/s)")
print(f"auto chose workers {tuned['w']} prefetch {tuned['d']} (per round)")
print(f"auto / best: {med[('auto', 'auto')] / hand[best]:.3f} (medians); per round median "
      f"{statistics.median(ratios):.3f} [{ratios[0]:.3f} - {ratios[-1]:.3f}] over {len(ratios)} rounds")
PY
}
if [[ ${#summary[@]} -gt 0 ]]; then summarize "${summary[@]}"; exit 0; fi
[[ "${1:-}" == "--" ]] && shift
[[ $# -ge 1 ]] || { echo "autotune.sh: give the w1_flowstate mode after --" >&2; exit 2; }
settings=()
for w in $workers; do for d in $prefetch; do settings+=("$w $d"); done; done
settings+=("auto auto")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# run_one "W D" ROUND FILE MODE-ARGS...: one run of a setting, appended as "W D ROUND JSON".
run_one() {
  local w d
  read -r w d <<<"$1"
  local r=$2 file=$3
  shift 3
  echo "$w $d $r $("$exe" --data "$data" "$@" --workers "$w" --prefetch "$d" | tail -n 1)" >>"$file"
}
n=${#settings[@]}
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < n; k++)); do run_one "${settings[$(((k + r * 3) % n))]}" "$r" "$out" "$@"; done
done
[[ -n "$keep" ]] && cat "$out" >>"$keep"
echo "== the grid (${rounds} rounds)"
summarize "$out"
# The confirmation: the grid's best cell against auto, fresh rounds.
read -r bw bd < <(/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
v = {}
for line in open(sys.argv[1]):
    w, d, r, js = line.split(" ", 3)
    if w != "auto":
        v.setdefault((w, d), []).append(json.loads(js)["samples_per_s"])
best = max(v, key=lambda k: statistics.median(v[k]))
print(*best)
PY
)
confirm=${confirm:-$rounds}
out2=$(mktemp)
trap 'rm -f "$out" "$out2"' EXIT
for ((r = 0; r < confirm; r++)); do
  pair=("$bw $bd" "auto auto")
  ((r % 2 == 1)) && pair=("auto auto" "$bw $bd")
  for s in "${pair[@]}"; do run_one "$s" "$r" "$out2" "$@"; done
done
[[ -n "$keep" ]] && cat "$out2" >>"$keep.confirm"
echo "== the confirmation: workers $bw prefetch $bd against auto (${confirm} rounds)"
summarize "$out2"
