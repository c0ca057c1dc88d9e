#!/usr/bin/env python3
"""A cold-cache epoch of a remote `tar` source (issue 23, lazy tar/lines), interleaved round
by round: a baseline CLI (`--base`, e.g. main's, which fetched every shard at build) with a
cache that holds the source, against this CLI (`--cli`) with the same cache, with a cache of
the look-ahead and one shard more (lookahead 2: 3 shards), and with 9 shards (lookahead 8).
The objects are `flowstate gen tar`'s shards on s3rver behind the fault proxy capped at
--cap-mbs per connection; GETs come from the proxy's log. Each run's cache starts empty.

  python3 bench/remote_lazy_bench.py --base ../main/build/dev/cli/flowstate \
      --cli build/dev/cli/flowstate --rounds 3

Prints one line per run and the medians with their ratio to the baseline.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
from remote_servers import FaultProxy, S3Server  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--cap-mbs", type=float, default=20)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="remote-lazy-bench-"))

    def run(cli, args, env):
        e = os.environ.copy()
        e.update(env)
        t = time.monotonic()
        r = subprocess.run([cli, *args], capture_output=True, text=True, env=e, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"{cli} {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
        return time.monotonic() - t

    run(a.cli, ["gen", "tar", "--out", str(d / "tar"), "--samples", str(a.samples), "--shards",
                str(a.shards)], {})
    sizes = sorted((f.stat().st_size for f in (d / "tar").glob("*.tar")), reverse=True)
    s3 = S3Server(d / "s3").start()
    try:
        s3.upload_dir(d / "tar", "t", "shard-*.tar")
        proxy = FaultProxy(s3.port, rate=int(a.cap_mbs * 1e6)).start()

        def yaml(lookahead):
            p = d / f"p{lookahead}.yaml"
            la = f", lookahead: {lookahead}" if lookahead else ""
            p.write_text('seed: 5\nsource: {type: tar, paths: "s3://bucket/t/shard-*.tar", '
                         f"fields: [tokens, cls]{la}}}\n"
                         "nodes:\n  - shuffle: {mode: buffer, size: 100}\n"
                         "  - batch: {size: 64, collate: ragged}\n")
            return p

        kinds = [("base, cache 20GiB", a.base, yaml(0), "20GiB"),
                 ("lazy, cache 20GiB", a.cli, yaml(0), "20GiB"),
                 ("lazy, cache 3 shards, lookahead 2", a.cli, yaml(2), str(sum(sizes[:3]))),
                 ("lazy, cache 9 shards, lookahead 8", a.cli, yaml(8), str(sum(sizes[:9])))]
        times = {k[0]: [] for k in kinds}
        for rnd in range(a.rounds):
            for name, cli, y, limit in kinds:
                cache = d / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                env = {**s3.env(proxy.url), "FLOWSTATE_CACHE_DIR": str(cache),
                       "FLOWSTATE_CACHE_LIMIT": limit}
                before = len(proxy.requests)
                t = run(cli, ["run", str(y), "--epochs", "1"], env)
                gets = [r for r in proxy.requests[before:]
                        if r.startswith("GET ") and "list-type" not in r]
                times[name].append(t)
                print(f"round {rnd} {name}: {t:.2f} s, {len(gets)} GETs", flush=True)
        proxy.stop()
    finally:
        s3.stop()
        shutil.rmtree(d, ignore_errors=True)
    print(f"{a.shards} shards, {sum(sizes)} bytes, proxy {a.cap_mbs:g} MB/s per connection")
    base = statistics.median(times[kinds[0][0]])
    for name, v in times.items():
        m = statistics.median(v)
        print(f"{name}: median {m:.2f} s ({min(v):.2f}-{max(v):.2f}), {m / base:.2f}x base")


if __name__ == "__main__":
    main()
