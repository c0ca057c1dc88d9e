#!/usr/bin/env python3
"""Issue 23's reads planned from the order, interleaved: bench/remote_bench.py's W1-shaped run
(`records` -> global shuffle -> batch 256) or, with --workload w2, W2 (`indexed` -> global
shuffle -> pack 2048 -> batch 8), cold from s3rver behind the fault proxy capped at --cap-mbs
(for all connections together), on a cache whose limit is --fraction of the data (a quarter by
default: a global shuffle then reads by range, a block per miss), with the plan
(FLOWSTATE_REMOTE_PLAN=1) and without it (0, the default), round after round. Reports per run
the wall time, the data's bytes over it, the GETs (proxy log) and the readers' counts
(FLOWSTATE_REMOTE_STATS: reads that found their block held, in flight, or downloaded it on
demand), then the medians and the ratio. The digests of both are checked against the local
run's once.

  python3 bench/remote_plan_bench.py --cli build/dev/cli/flowstate --mib 32 --rounds 3
  python3 bench/remote_plan_bench.py --cli build/dev/cli/flowstate --workload w2 --docs 20000
"""
import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
sys.path.insert(0, str(REPO / "bench"))
from remote_bench import CONNECTIONS, run_cli  # noqa: E402
from remote_common import DataSet  # noqa: E402
from remote_servers import FaultProxy, S3Server  # noqa: E402


def stats_of(path):
    total = {}
    if path.exists():
        for line in path.read_text().splitlines():
            for k, v in json.loads(line).items():
                total[k] = total.get(k, 0) + v
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=str(REPO / "build/dev/cli/flowstate"))
    ap.add_argument("--workload", choices=["w1", "w2"], default="w1")
    ap.add_argument("--mib", type=int, default=32, help="W1's data size in MiB")
    ap.add_argument("--docs", type=int, default=20000, help="W2's documents")
    ap.add_argument("--block", default="64KiB", help="FLOWSTATE_REMOTE_BLOCK")
    ap.add_argument("--fraction", type=float, default=0.25, help="cache limit / data size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap-mbs", type=float, default=200.0, help="the proxy's cap, MB/s")
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="flowstate-plan-bench-"))
    ds = DataSet(a.cli, work, a.workload, a.mib, a.docs)
    data, glob, prefix = ds.dir, ds.glob, ds.prefix
    total = ds.bytes()
    idx = sum(f.stat().st_size for f in data.glob("*.idx"))
    limit = idx + int((total - idx) * a.fraction)
    s3 = S3Server(work / "s3").start()
    proxy = FaultProxy(s3.port, total_rate=a.cap_mbs * 1e6).start()
    try:
        s3.upload_dir(data, prefix, glob)

        local_yaml = ds.yaml(work / f"{a.workload}-local.yaml", ds.local_paths)
        s3_yaml = ds.yaml(work / f"{a.workload}-s3.yaml", ds.s3_paths)
        cache = work / "cache"
        want = work / "local.txt"
        run_cli(a.cli, ["run", str(local_yaml), "--digests", str(want)], {})

        def cold(plan, digests=None):
            shutil.rmtree(cache, ignore_errors=True)
            stats = work / "stats.jsonl"
            stats.unlink(missing_ok=True)
            before = len(proxy.requests)
            extra = ["--digests", str(digests)] if digests else []
            dt = run_cli(a.cli, ["run", str(s3_yaml), *extra],
                         {**s3.env(proxy.url), "FLOWSTATE_CACHE_DIR": str(cache),
                          "FLOWSTATE_CACHE_LIMIT": str(limit),
                          "FLOWSTATE_REMOTE_CONNECTIONS": str(CONNECTIONS),
                          "FLOWSTATE_REMOTE_BLOCK": a.block, "FLOWSTATE_REMOTE_PLAN": plan,
                          "FLOWSTATE_REMOTE_STATS": str(stats)})
            gets = sum(q.startswith("GET ") and "list-type=2" not in q
                       for q in proxy.requests[before:])
            return dt, gets, stats_of(stats)

        for plan in ("1", "0"):  # the bytes first: both give the local digests
            got = work / f"digests-{plan}.txt"
            cold(plan, got)
            assert got.read_text() == want.read_text(), f"plan={plan}: digests differ"
        times = {"1": [], "0": []}
        for r in range(a.rounds):
            for plan in ("1", "0") if r % 2 == 0 else ("0", "1"):
                dt, gets, s = cold(plan)
                times[plan].append(dt)
                reads = s.get("held", 0) + s.get("in_flight", 0) + s.get("on_demand", 0)
                print(f"round {r} plan={plan} {dt:7.3f} s {total / dt / 1e6:7.1f} MB/s "
                      f"{gets:6d} GETs; {reads} block reads: {s.get('held', 0)} held, "
                      f"{s.get('in_flight', 0)} in flight, {s.get('on_demand', 0)} on demand",
                      flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"\n{a.workload}: {total / (1 << 20):.1f} MiB, cache limit {limit / (1 << 20):.1f} "
              f"MiB ({a.fraction:g} of the data), blocks of {a.block}, proxy cap "
              f"{a.cap_mbs:.0f} MB/s, {a.rounds} rounds, medians:")
        for k, name in (("1", "planned"), ("0", "not planned")):
            print(f"  {name:12s} {med[k]:7.3f} s  (min {min(times[k]):.3f}, "
                  f"max {max(times[k]):.3f})")
        print(f"planned / not planned (throughput): {med['0'] / med['1']:.2f}x")
    finally:
        proxy.stop()
        s3.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
