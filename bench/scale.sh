#!/usr/bin/env bash
# Issue 26's scale figures: time and peak RSS of pipelines with thousands of nodes or inputs.
#
#   bench/scale.sh [FLOWSTATE] [WORKDIR]
#
# FLOWSTATE defaults to build/dev/cli/flowstate, WORKDIR to a new temporary directory. Prints
# one line per case: wall seconds, peak RSS (GNU time's maximum resident set size), and for
# the mix cases the size of a checkpoint's state.bin and of the node states in it. Needs
# python3 and /usr/bin/time.
set -euo pipefail
fs=$(realpath "${1:-build/dev/cli/flowstate}")
work=${2:-$(mktemp -d)}
mkdir -p "$work" && cd "$work"

"$fs" gen records --out data --records 4096 --record-bytes 64 --shards 1 >/dev/null
"$fs" gen lines --out lines --docs 2000 --shards 4 >/dev/null
"$fs" gen tar --out tar --samples 200 --shards 2 >/dev/null

python3 - <<'EOF'
# alt N: N nodes alternating map and filter; maps N: N maps.
for n in (1000, 2000, 5000):
    for kind in ("alt", "maps"):
        with open(f"{kind}{n}.yaml", "w") as f:
            f.write('seed: 1\nsource: {type: records, paths: "data/*.bin", record_bytes: 64}\nnodes:\n')
            for i in range(n):
                if kind == "maps" or i % 2 == 0:
                    f.write("  - map: {fn: slice, field: data, start: 0, length: 64}\n")
                else:
                    f.write("  - filter: {fn: length, field: data, min: 1}\n")
            f.write("  - batch: {size: 8}\n")
# A mix of 2000 inputs of each kind: lines (buffer shuffle, filter) and tar (global shuffle).
n = 2000
for k, src, nodes in (
    ("l", '{type: lines, paths: "lines/*.txt"}',
     "  - shuffle: {mode: buffer, size: 64}\n  - filter: {fn: length, field: text, min: 2}\n"),
    ("t", '{type: tar, paths: "tar/*.tar"}', "  - shuffle: {mode: global}\n"),
):
    for i in range(n):
        with open(f"{k}{i}.yaml", "w") as f:
            f.write(f"source: {src}\nnodes:\n{nodes}")
    ins = ", ".join(f"{k}{i}.yaml" for i in range(n))
    with open(f"mix_{k}.yaml", "w") as f:
        f.write(f"seed: 1\nsource: {{type: mix, inputs: [{ins}], weights: [{', '.join(['1'] * n)}], "
                f"stop: all_exhausted}}\nnodes:\n  - batch: {{size: 8, collate: ragged}}\n"
                f"checkpoint: {{dir: ck_{k}, every_steps: 10}}\n")
EOF

measure() {  # label, command...
  local label=$1
  shift
  /usr/bin/time -f "%e %M" -o time.txt "$@" >/dev/null 2>&1
  read -r s kb <time.txt
  printf '%-34s %7.2f s %8d KB' "$label" "$s" "$kb"
}
for n in 1000 2000 5000; do
  measure "validate alt$n" "$fs" validate "alt$n.yaml"
  echo
done
measure "validate maps5000" "$fs" validate maps5000.yaml
echo
measure "run alt5000 --steps 20" "$fs" run alt5000.yaml --steps 20
echo
for k in l t; do
  rm -rf "ck_$k"
  measure "run mix_$k (2000 inputs) --steps 20" "$fs" run "mix_$k.yaml" --steps 20
  state=$(ls -d ck_$k/step-*20)/state.bin
  # The node states: the length-prefixed string that ends state.bin, after the pipeline's
  # description (its bytes start with the entry stamp's marker, then "2TSF").
  spine=$(python3 -c 'import struct,sys; b=open(sys.argv[1],"rb").read(); i=b.find(b"2TSF")
print(struct.unpack("<Q", b[i-9:i-1])[0])' "$state")
  printf '  state.bin %8d B, of which node states %d B\n' "$(stat -c %s "$state")" "$spine"
done
