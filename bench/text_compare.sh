#!/usr/bin/env bash
# Issue 24 (text): raw JSON Lines text → tokenize → pack 2048 → batch 8, tokens/s over one
# epoch, side by side and interleaved (each round runs every configuration, in a rotating
# order, so a drift in the machine's load spreads over all of them):
#
#   fs2     flowstate, 2 workers (bench/text_flowstate throughput)
#   fs1     flowstate, 1 worker
#   torch2  torch DataLoader(num_workers=2) over a sentencepiece IterableDataset (text_torch.py)
#   pre2    flowstate, 2 workers, the same corpus pre-tokenized (indexed → shuffle → pack → batch)
#   spm1    SentencePiece alone (C++ Encode in a loop), one thread, every document in memory:
#           the most one core can tokenize
#
#   bench/text_compare.sh [--build build/release] [--dir /tmp/flowstate-text] [--docs 20000]
#                         [--words 500] [--vocab 8000] [--rounds 3] [--chunk 0]
#
# Makes the corpus (`flowstate gen text`), the model (spm_train on the first 2000 documents)
# and the pre-tokenized copy once, then prints every measurement and the medians and ratios.
set -euo pipefail
build=build/release dir=/tmp/flowstate-text docs=20000 words=500 vocab=4000 rounds=3 chunk=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --docs) docs=$2; shift 2 ;;
    --words) words=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --chunk) chunk=$2; shift 2 ;;
    *) sed -n '2,15p' "$0"; exit 2 ;;
  esac
done
fs=$build/cli/flowstate tf=$build/bench/text_flowstate
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
if [[ ! -e "$dir/m.model" ]]; then
  "$fs" gen text --out "$dir" --docs "$docs" --words "$words" --shards 4 >&2
  "$fs" gen text --out "$dir/train" --docs 2000 --words "$words" --txt >&2
  spm_train --input="$dir/train/text-00000.txt" --model_prefix="$dir/m" --vocab_size="$vocab" \
            --max_sentence_length=65536 --minloglevel=2 >/dev/null 2>&1
  "$tf" --data "$dir" pretokenize >&2
fi
du -sh "$dir"/text-*.jsonl | tail -n 1 >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() {
  case "$1" in
    fs2) "$tf" --data "$dir" throughput --workers 2 ;;
    fs1) "$tf" --data "$dir" throughput --workers 1 ;;
    torch2) /usr/bin/python3 "$here/text_torch.py" --data "$dir" --workers 2 --chunk "$chunk" ;;
    pre2) "$tf" --data "$dir" pretokenized --workers 2 ;;
    spm1) "$tf" --data "$dir" ceiling ;;
  esac
}
configs=(fs2 fs1 torch2 pre2 spm1)
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < ${#configs[@]}; k++)); do
    c=${configs[$(((k + r) % ${#configs[@]}))]}
    line=$(run "$c" | tail -n 1)
    echo "$c $r $line" | tee -a "$out"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
v = {}
cores = {}
digests = {}
for line in open(sys.argv[1]):
    c, r, js = line.split(" ", 2)
    d = json.loads(js)
    v.setdefault(c, []).append(d["tokens_per_s"])
    cores.setdefault(c, []).append(d.get("cores", 0))
    if "digest" in d:
        digests.setdefault(c, set()).add(d["digest"])
med = {c: statistics.median(x) for c, x in v.items()}
for c, x in v.items():
    print(f"{c:7s} tokens/s median {med[c] / 1e6:.2f} M [{min(x) / 1e6:.2f} - {max(x) / 1e6:.2f}]"
          f"  cores got {statistics.median(cores[c]):.2f}")
print(f"fs2 / torch2 = {med['fs2'] / med['torch2']:.2f}  (target >= 1.5)")
print(f"fs2 / fs1    = {med['fs2'] / med['fs1']:.2f}  (target >= 1.8)")
print(f"fs2 / pre2   = {med['fs2'] / med['pre2']:.3f}  (target >= 0.50)")
print(f"fs1 / spm1   = {med['fs1'] / med['spm1']:.2f}  (1 worker against SentencePiece alone)")
print("same rows raw and pre-tokenized:", digests.get("fs2") == digests.get("pre2") == digests.get("fs1"))
PY
