#!/usr/bin/env bash
# Side-by-side comparison on workload W2 (docs/DESIGN.md §11): a Megatron indexed data set of
# 200 000 uint16 documents (lognormal lengths, median 400, σ 1; ~132 M tokens, 268 MB) →
# global shuffle → pack into rows of 2048 with EOS 0 → batches of 8, in tokens/s over whole
# epochs. Interleaved round by round (A B C ... A B C ...) so every packer sees the same
# machine: the Python/PyTorch packer in Megatron-LM's GPTDataset style (num_workers 0 and 2),
# the single-thread C++ ceiling, and flowstate with 1 and 2 workers. Then the first batch after
# a restore at 50% of the epoch against one from scratch, and the state's size. Prints the raw
# JSON lines, then medians and the bars of issue 15.
#
#   bench/w2_compare.sh --build build/release --rounds 3
#
# Options: --rounds N (3)  --data DIR (/tmp/flowstate-w2, generated when missing)
#          --build DIR (build/release: needs targets flowstate, w2_flowstate, w2_ceiling)
#          --epochs N (1)  --out FILE (raw JSON lines)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3
data=/tmp/flowstate-w2
build="$root/build/release"
epochs=1
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "w2_compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
py=/usr/bin/python3  # Debian's interpreter, with python3-torch and numpy
fs="$build/bench/w2_flowstate"
ceil="$build/bench/w2_ceiling"
cli="$build/cli/flowstate"
for b in "$fs" "$ceil" "$cli"; do
  [[ -x "$b" ]] || { echo "w2_compare.sh: $b is missing (cmake --build $build --target flowstate w2_flowstate w2_ceiling)" >&2; exit 1; }
done
if [[ ! -f "$data/corpus.idx" ]]; then
  mkdir -p "$data"
  "$cli" gen indexed --out "$data/corpus" --docs 200000 >&2
fi
[[ -n "$out" ]] || out="$build/w2-$(date +%Y%m%d-%H%M%S).jsonl"
: > "$out"
cat "$data"/corpus.* > /dev/null  # into the page cache before the first round

for r in $(seq 1 "$rounds"); do
  echo "w2_compare.sh: round $r of $rounds" >&2
  "$py" "$root/bench/w2_megatron_packer.py" "$data/corpus.idx" --workers 0 --epochs "$epochs" | tee -a "$out"
  "$py" "$root/bench/w2_megatron_packer.py" "$data/corpus.idx" --workers 2 --epochs "$epochs" | tee -a "$out"
  "$ceil" "$data/corpus.idx" --epochs "$epochs" | tee -a "$out"
  "$fs" --data "$data" throughput --workers 1 --epochs "$epochs" | tee -a "$out"
  "$fs" --data "$data" throughput --workers 2 --epochs "$epochs" | tee -a "$out"
done
"$fs" --data "$data" restore --workers 2 --rounds 5 | tee -a "$out"

"$py" - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(impl, workers):
    v = [r["tokens_per_s"] for r in rows if r["what"] == "w2" and r["impl"] == impl and r["workers"] == workers]
    return statistics.median(v) if v else float("nan"), len(v)
print()
print("| packer | workers | M tokens/s (median) | runs |")
print("|---|---|---|---|")
res = {}
for impl, w in [("megatron_py", 0), ("megatron_py", 2), ("ceiling", 1), ("flowstate", 1), ("flowstate", 2)]:
    m, n = med(impl, w)
    res[(impl, w)] = m
    print(f"| {impl} | {w} | {m / 1e6:.1f} | {n} |")
py_best = max(res[("megatron_py", 0)], res[("megatron_py", 2)])
fs_best = max(res[("flowstate", 1)], res[("flowstate", 2)])
ceil = res[("ceiling", 1)]
rs = [r for r in rows if r["what"] == "w2_restore"][-1]
state = max([r.get("state_bytes_max", 0) for r in rows if r["impl"] == "flowstate" and r["what"] == "w2"] + [rs["state_bytes"]])
ratio = rs["first_batch_restored_50_s"] / rs["first_batch_scratch_s"]
def bar(ok): return "PASS" if ok else "FAIL"
print()
print(f"flowstate / Python best: {fs_best / py_best:.1f}x (>= 10x): {bar(fs_best >= 10 * py_best)}")
print(f"flowstate / single-thread ceiling: {100 * fs_best / ceil:.0f}% (>= 40%): {bar(fs_best >= 0.4 * ceil)}")
print(f"state: {state} bytes (< 64 KiB): {bar(state < 65536)}")
print(f"first batch restored at 50% / from scratch: {rs['first_batch_restored_50_s'] * 1e3:.1f} / "
      f"{rs['first_batch_scratch_s'] * 1e3:.1f} ms = {ratio:.2f} (<= 2): {bar(ratio <= 2)}")
EOF
