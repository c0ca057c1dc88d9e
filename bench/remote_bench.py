#!/usr/bin/env python3
"""Issue 23's remote benchmark, interleaved: a W1-shaped run (`records` -> global shuffle ->
batch 256, `flowstate run`) or, with --workload w2, W2 (`indexed` -> global shuffle -> pack
2048 -> batch 8, bench/w2_compare.sh's pipeline; the .idx fetched whole, the .bin read by
range) on local files, on s3rver with a warm cache, cold from s3rver
directly, and cold behind the fault proxy capped at --cap-mbs (by default for all its
connections together, as a link of that bandwidth; --cap-per-connection splits it evenly
over the 8 connections both clients use, which also caps a connection waiting between two
requests), against a boto3 baseline — 8 threads of ranged GETs
(8 MiB parts) of the same objects into memory, as a competent boto3 user writes it — on the
same two paths (direct: s3rver's own ceiling; proxy: the proxy's). Requests per run (list
pages, GETs) come from the proxy's log. Servers are tests/python/remote_servers.py's.

  python3 bench/remote_bench.py --cli build/dev/cli/flowstate --mib 256 --rounds 3
  python3 bench/remote_bench.py --cli build/dev/cli/flowstate --workload w2 --docs 200000

Prints one line per run and a summary of medians with the issue's ratios.
"""
import argparse
import concurrent.futures
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
sys.path.insert(0, str(REPO / "bench"))
from remote_common import DataSet, run  # noqa: E402
from remote_servers import FaultProxy, S3Server, S3_KEY, S3_SECRET  # noqa: E402

CONNECTIONS = 8
PART = 8 << 20


def run_cli(cli, args, env):
    """Runs the CLI (remote_common.run); returns its wall time and keeps the run's own clock
    (from the Loader's start; its last line's "... MB in X s": the process's time less its
    start-up — libraries, the listing, the cache's look-ups) in RUN_CLOCK."""
    wall, _, err = run(cli, args, env)
    m = re.search(r"B in ([0-9.]+) s", err)
    RUN_CLOCK.append(float(m.group(1)) if m else float("nan"))
    return wall


RUN_CLOCK = []  # one entry per run_cli call


def boto3_fetch_all(endpoint, keys_sizes, one_request_per_connection=False):
    """8 threads of ranged GETs of every object into memory; returns the bytes read. The fault
    proxy serves one request per connection (flowstate opens one per request), so through it
    boto3 sends `Connection: close`; directly it keeps its connections alive."""
    import boto3
    from botocore.config import Config
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=S3_KEY,
                          aws_secret_access_key=S3_SECRET, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"},
                                        max_pool_connections=CONNECTIONS))
    if one_request_per_connection:
        def close(request, **_):
            request.headers["Connection"] = "close"
        client.meta.events.register("before-send.s3.GetObject", close)
    parts = [(k, off, min(size, off + PART) - 1) for k, size in keys_sizes
             for off in range(0, size, PART)]
    buffers = {k: bytearray(size) for k, size in keys_sizes}

    def get(part):
        key, first, last = part
        body = client.get_object(Bucket="bucket", Key=key, Range=f"bytes={first}-{last}")["Body"]
        buffers[key][first:last + 1] = body.read()
        return last + 1 - first

    with concurrent.futures.ThreadPoolExecutor(CONNECTIONS) as pool:
        return sum(pool.map(get, parts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=str(REPO / "build/dev/cli/flowstate"))
    ap.add_argument("--mib", type=int, default=256, help="data size in MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap-mbs", type=float, default=200.0, help="the proxy's cap, MB/s")
    ap.add_argument("--cap-per-connection", action="store_true",
                    help="split the cap over the 8 connections (each capped at cap / 8)")
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--workload", choices=["w1", "w2"], default="w1")
    ap.add_argument("--docs", type=int, default=200000, help="W2's documents (w2_compare.sh's)")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="flowstate-remote-bench-"))
    ds = DataSet(a.cli, work, a.workload, a.mib, a.docs)
    data, glob, prefix = ds.dir, ds.glob, ds.prefix
    total = ds.bytes()
    s3 = S3Server(work / "s3").start()
    if a.cap_per_connection:
        proxy = FaultProxy(s3.port, rate=a.cap_mbs * 1e6 / CONNECTIONS).start()
    else:
        proxy = FaultProxy(s3.port, total_rate=a.cap_mbs * 1e6).start()
    try:
        keys = s3.upload_dir(data, prefix, glob)
        sizes = [(k, (data / Path(k).name).stat().st_size) for k in keys]

        def yaml(paths):
            return ds.yaml(work / f"{a.workload}-{abs(hash(paths))}.yaml", paths)

        # The same files copied (shutil.copyfile): on this kernel a run over files `gen` wrote
        # is faster than over the same bytes copied, whoever reads them — the page cache keeps
        # a file in folios the size of the writes that made it (see bench/RESULTS.md).
        copied = work / f"{data.name}-copied"
        if not copied.exists():
            copied.mkdir()
            for f in data.glob(glob):
                shutil.copyfile(f, copied / f.name)
        local_yaml, s3_yaml = yaml(ds.local_paths), yaml(ds.s3_paths)
        copied_yaml = yaml(ds.local_paths.replace(str(data), str(copied)))
        base = {"FLOWSTATE_REMOTE_CONNECTIONS": str(CONNECTIONS),
                "FLOWSTATE_CACHE_LIMIT": str(4 * total)}
        warm_cache = work / "cache-warm"
        cold_cache = work / "cache-cold"
        # Digests once: the remote runs give the local bytes.
        want = work / "local.txt"
        got = work / "s3.txt"
        run_cli(a.cli, ["run", str(local_yaml), "--digests", str(want)], {})
        run_cli(a.cli, ["run", str(s3_yaml), "--digests", str(got)],
                {**base, **s3.env(), "FLOWSTATE_CACHE_DIR": str(warm_cache)})
        assert want.read_text() == got.read_text(), "remote digests differ from local ones"

        def flowstate_cold(endpoint):
            shutil.rmtree(cold_cache, ignore_errors=True)
            return run_cli(a.cli, ["run", str(s3_yaml)],
                           {**base, **s3.env(endpoint), "FLOWSTATE_CACHE_DIR": str(cold_cache)})

        kinds = {
            "local": lambda: run_cli(a.cli, ["run", str(local_yaml)], {}),
            "local_copied": lambda: run_cli(a.cli, ["run", str(copied_yaml)], {}),
            "warm": lambda: run_cli(a.cli, ["run", str(s3_yaml)],
                                    {**base, **s3.env(), "FLOWSTATE_CACHE_DIR": str(warm_cache)}),
            "cold_direct": lambda: flowstate_cold(s3.endpoint),
            "cold_proxy": lambda: flowstate_cold(proxy.url),
            "boto3_direct": lambda: timed(lambda: boto3_fetch_all(s3.endpoint, sizes)),
            "boto3_proxy": lambda: timed(lambda: boto3_fetch_all(proxy.url, sizes, True)),
        }
        times = {k: [] for k in kinds}
        clocks = {}
        requests = {}
        for r in range(a.rounds):
            for kind, fn in kinds.items():
                before = len(proxy.requests)
                dt = fn()
                times[kind].append(dt)
                if kind in ("local", "warm"):
                    clocks.setdefault(kind, []).append(RUN_CLOCK[-1])
                seen = proxy.requests[before:]
                if kind.endswith("proxy"):
                    requests[kind] = (sum("list-type=2" in q for q in seen),
                                      sum(q.startswith("GET ") and "list-type=2" not in q
                                          for q in seen))
                print(f"round {r} {kind:13s} {dt:7.3f} s  {total / dt / 1e6:8.1f} MB/s",
                      flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        mbs = {k: total / v / 1e6 for k, v in med.items()}
        print(f"\n{a.workload}: {total / (1 << 20):.0f} MiB in {len(keys)} objects, "
              f"{a.rounds} rounds, medians:")
        for k in kinds:
            print(f"  {k:13s} {med[k]:7.3f} s  {mbs[k]:8.1f} MB/s  "
                  f"(min {min(times[k]):.3f}, max {max(times[k]):.3f})")
        print(f"warm / local (throughput): {med['local'] / med['warm']:.2f} (target >= 0.90); "
              f"warm / local copied: {med['local_copied'] / med['warm']:.2f}")
        run_clock = {k: statistics.median(v) for k, v in clocks.items()}
        print(f"the runs' own clocks (start-up excluded): local {run_clock['local']:.3f} s, "
              f"warm {run_clock['warm']:.3f} s, warm / local "
              f"{run_clock['local'] / run_clock['warm']:.2f}")
        print(f"cold behind the proxy: {mbs['cold_proxy']:.1f} MB/s = "
              f"{mbs['cold_proxy'] / a.cap_mbs:.2f} of the {a.cap_mbs:.0f} MB/s cap "
              f"(target >= 0.85)")
        print(f"flowstate cold / boto3, proxy: {med['boto3_proxy'] / med['cold_proxy']:.2f}; "
              f"direct: {med['boto3_direct'] / med['cold_direct']:.2f} (target >= 1.00)")
        for kind, (lists, gets) in requests.items():
            print(f"requests of one {kind} run (proxy log): {lists} list, {gets} GET")
    finally:
        proxy.stop()
        s3.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
