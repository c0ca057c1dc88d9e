#!/usr/bin/env bash
# Side-by-side comparison on workload W2 (docs/DESIGN.md §11): a Megatron indexed data set of
# 200 000 uint16 documents (lognormal lengths, median 400, σ 1; ~132 M tokens, 268 MB) →
# global shuffle → pack into rows of 2048 with EOS 0 → batches of 8, in tokens/s over whole
# epochs. Interleaved round by round (A B C ... A B C ...) so every packer sees the same
# machine: the Python/PyTorch packer in Megatron-LM's GPTDataset style (num_workers 0 and 2),
# the single-thread C++ ceiling (the copy alone, pages mapped before the clock starts; and with
# the page faults timed, "ceiling (faults)"), flowstate with 1 and 2 workers (w2_flowstate, from
# the Loader's construction), and the whole `flowstate run` process of the same pipeline
# ("flowstate_run": wall and CPU time of the process, start-up and exit included), with the
# default 2 workers and with `--workers inline` (no thread: batches made in next()). Then the
# first batch after a restore at 50% of the epoch against one from scratch, and the state's
# size. Prints the raw JSON lines, then medians and the bars of issues 15 and 26.
#
#   bench/w2_compare.sh --build build/release --rounds 5
#
# Options: --rounds N (3)  --data DIR (/tmp/flowstate-w2, generated when missing)
#          --build DIR (build/release: needs targets flowstate, w2_flowstate, w2_ceiling)
#          --epochs N (1)  --out FILE (raw JSON lines)
#          --no-py-workers (skip the Python packer with 2 workers: ~10 s a round)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3
data=/tmp/flowstate-w2
build="$root/build/release"
epochs=1
out=""
py_workers=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-py-workers) py_workers=0; shift ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
# The same pipeline for the CLI (w2_flowstate builds it in C++); 2 workers, the default.
cat > "$data/w2.yaml" <<YAML
seed: 1234
source: {type: indexed, paths: "corpus.idx", field: tokens}
nodes:
  - shuffle: {mode: global}
  - pack: {length: 2048, separator: 0}
  - batch: {size: 8}
epochs: $epochs
YAML
# Wall and CPU time (user + system, the kernel's accounting of the child) of one whole
# `flowstate run` process; tokens from its summary line (samples x 2048).
# $1: the workers, "2" (the pipeline's default) or "inline" (--workers inline: each batch made
# on the consumer's thread).
run_process() {
  "$py" - "$cli" "$data/w2.yaml" "$epochs" "$1" <<'PY'
import json, re, resource, subprocess, sys, time
cli, yaml, epochs, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
workers = int(workers) if workers.isdigit() else workers
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
t0 = time.perf_counter()
p = subprocess.run([cli, "run", yaml, "--workers", str(workers)], capture_output=True, text=True)
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
if p.returncode != 0:
    sys.exit(f"flowstate run failed ({p.returncode}): {p.stderr}")
samples = int(re.search(r"(\d+) samples", p.stdout + p.stderr).group(1))
user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
tokens = samples * 2048
print(json.dumps({"impl": "flowstate_run", "what": "w2", "workers": workers, "epochs": epochs,
                  "tokens_per_s": tokens / wall, "seconds": wall, "cpu_s": user + sys_,
                  "user_s": user, "sys_s": sys_, "cpu_ns_per_token": (user + sys_) * 1e9 / tokens}),
      flush=True)
PY
}

for r in $(seq 1 "$rounds"); do
  echo "w2_compare.sh: round $r of $rounds" >&2
  "$py" "$root/bench/w2_megatron_packer.py" "$data/corpus.idx" --workers 0 --epochs "$epochs" | tee -a "$out"
  if [[ $py_workers == 1 ]]; then
    "$py" "$root/bench/w2_megatron_packer.py" "$data/corpus.idx" --workers 2 --epochs "$epochs" | tee -a "$out"
  fi
  "$ceil" "$data/corpus.idx" --epochs "$epochs" | tee -a "$out"
  "$ceil" "$data/corpus.idx" --epochs "$epochs" --faults --label faults | tee -a "$out"
  "$fs" --data "$data" throughput --workers 1 --epochs "$epochs" | tee -a "$out"
  "$fs" --data "$data" throughput --workers 2 --epochs "$epochs" | tee -a "$out"
  run_process 2 | tee -a "$out"
  run_process inline | tee -a "$out"
done
"$fs" --data "$data" restore --workers 2 --rounds 5 | tee -a "$out"

"$py" - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(impl, workers, key="tokens_per_s", label=None):
    v = [r[key] for r in rows if r["what"] == "w2" and r["impl"] == impl
         and r["workers"] == workers and r.get("label") == label]
    return statistics.median(v) if v else float("nan"), len(v)
print()
print("| packer | workers | M tokens/s (median) | runs |")
print("|---|---|---|---|")
res = {}
for impl, w, label in [("megatron_py", 0, None), ("megatron_py", 2, None), ("ceiling", 1, None),
                       ("ceiling", 1, "faults"), ("flowstate", 1, None), ("flowstate", 2, None),
                       ("flowstate_run", 2, None), ("flowstate_run", "inline", None)]:
    m, n = med(impl, w, label=label)
    res[(impl, w, label)] = m
    name = impl + (f" ({label})" if label else "")
    print(f"| {name} | {w} | {m / 1e6:.1f} | {n} |")
py0 = res[("megatron_py", 0, None)]
py_best = max(v for v in (py0, res[("megatron_py", 2, None)]) if v == v)
fs_best = max(res[("flowstate", 1, None)], res[("flowstate", 2, None)])
ceil = res[("ceiling", 1, None)]
ceil_s, _ = med("ceiling", 1, "seconds")
ceil_cpu_s, _ = med("ceiling", 1, "cpu_s")
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
# The ceiling's CPU per token, from its rate and its CPU share of the timed copy.
ceil_ns = ceil_cpu_s / ceil_s * 1e9 / ceil
for w in (2, "inline"):
    run = res[("flowstate_run", w, None)]
    run_cpu_ns, _ = med("flowstate_run", w, "cpu_ns_per_token")
    print()
    print(f"issue 26, the whole `flowstate run --workers {w}` process (medians):")
    print(f"  / Python packer, 0 workers: {run / py0:.1f}x (>= 10x): {bar(run >= 10 * py0)}")
    print(f"  / single-thread ceiling (the copy alone): {100 * run / ceil:.0f}% (>= 45%): {bar(run >= 0.45 * ceil)}")
    print(f"  CPU per token: {run_cpu_ns:.2f} ns (<= 1 ns): {bar(run_cpu_ns <= 1.0)}; the ceiling's copy {ceil_ns:.2f} ns")
EOF
