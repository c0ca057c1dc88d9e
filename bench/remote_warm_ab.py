#!/usr/bin/env python3
"""Issue 23's warm-cache bar, whole processes: `flowstate run` of W1 (records -> global
shuffle -> batch 256) or W2 (indexed -> global shuffle -> pack 2048 -> batch 8) over local
files and over `s3://` on s3rver with a warm cache, for one or more binaries, interleaved (the
order of the runs rotates every round), wall clock and CPU (the child's rusage) per run.
The bar is "warm >= 90% of local": local's time / warm's time, per binary, as a median of the
per-round ratios (each round's two runs sit side by side, so the host's load, which drifts,
mostly cancels) beside the ratio of the medians. The data and each binary's cache are made
once under --work; s3rver is tests/python/remote_servers.py's, started and stopped here.

  python3 bench/remote_warm_ab.py --cli base=/tmp/base/flowstate --cli new=build/release/cli/flowstate \
      --workload w1 --mib 256 --rounds 15 --refresh
  python3 bench/remote_warm_ab.py --cli new=build/release/cli/flowstate --workload w2 -- --steps 1

Arguments after `--` go to every `flowstate run`. Digests of one run per binary are checked
equal to the local run's first.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
sys.path.insert(0, str(REPO / "bench"))
from remote_common import DataSet, run as run_cli  # noqa: E402
from remote_servers import S3Server  # noqa: E402


def run(cli, args, env, check=True):
    """remote_common.run's (wall s, CPU s)."""
    wall, cpu, _ = run_cli(cli, args, env, check)
    return wall, cpu


def huge_folio_share(files):
    """The share of the pages of `files` that the page cache holds in 2 MiB folios (root only;
    bench/page_cache_folios.py, which also reads in what is not cached), or None. A first pass
    over a mapping costs ~10x more in 4 KiB folios than in 2 MiB ones on this VM, and a file
    the kernel dropped is read back in 4 KiB folios: the two sides of an A/B should be alike."""
    if os.geteuid() != 0:
        return None
    huge = total = 0
    for f in files:
        out = subprocess.run([sys.executable, str(REPO / "bench/page_cache_folios.py"), str(f)],
                             capture_output=True, text=True).stdout
        pages = os.path.getsize(f) // 4096
        total += pages
        for line in out.splitlines():
            if line.startswith("2048 KiB folios:"):
                huge += int(line.split()[3]) * 512
    return huge / total if total else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--workload", choices=["w1", "w2"], default="w1")
    ap.add_argument("--mib", type=int, default=256, help="W1's data in MiB")
    ap.add_argument("--docs", type=int, default=200000, help="W2's documents")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--work", default=None, help="working directory, kept (default: temporary)")
    ap.add_argument("--env", action="append", default=[],
                    help="NAME=KEY=VALUE: an environment variable for that binary's warm runs")
    ap.add_argument("--refresh", action="store_true",
                    help="first rewrite the local files in 2 MiB pieces and remove the caches "
                         "(downloaded again), so both sides start in 2 MiB page-cache folios")
    ap.add_argument("run_args", nargs="*", help="arguments for every `flowstate run`")
    a = ap.parse_args()
    clis = dict(c.split("=", 1) for c in a.cli)
    extra_env = {name: {} for name in clis}
    for spec in a.env:
        name, kv = spec.split("=", 1)
        k, v = kv.split("=", 1)
        extra_env[name][k] = v
    first = next(iter(clis.values()))
    work = Path(a.work or tempfile.mkdtemp(prefix="flowstate-warm-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    ds = DataSet(first, work, a.workload, a.mib, a.docs)
    data, glob, prefix = ds.dir, ds.glob, ds.prefix
    total = ds.bytes()
    if a.refresh:
        # The page cache keeps a file in folios the size of the writes that made it, and reads
        # a dropped one back in 4 KiB folios (bench/RESULTS.md): a download writes 2 MiB pieces.
        for f in ds.files():
            tmp = f.with_name(f.name + ".refresh")
            with open(f, "rb") as src, open(tmp, "wb") as dst:
                while chunk := src.read(2 << 20):
                    dst.write(chunk)
            os.replace(tmp, f)
        for name in clis:
            shutil.rmtree(work / f"cache-{name}", ignore_errors=True)

    local_yaml = str(ds.yaml(work / f"{a.workload}-local.yaml", ds.local_paths))
    s3_yaml = str(ds.yaml(work / f"{a.workload}-s3.yaml", ds.s3_paths))
    s3 = S3Server(work / "s3").start()
    try:
        s3.upload_dir(data, prefix, glob)
        base_env = {"FLOWSTATE_REMOTE_CONNECTIONS": "8", "FLOWSTATE_CACHE_LIMIT": str(4 * total),
                    **s3.env()}

        def warm_env(name):
            return {**base_env, "FLOWSTATE_CACHE_DIR": str(work / f"cache-{name}"),
                    **extra_env[name]}

        want = work / "digests-local.txt"
        want.unlink(missing_ok=True)
        run(first, ["run", local_yaml, "--digests", str(want)], {})
        for name, cli in clis.items():
            got = work / f"digests-{name}.txt"
            got.unlink(missing_ok=True)
            run(cli, ["run", s3_yaml, "--digests", str(got)], warm_env(name))  # warms the cache
            assert got.read_text() == want.read_text(), f"{name}: remote digests differ"
        jobs = [(name, kind) for name in clis for kind in ("local", "warm")]
        wall = {j: [] for j in jobs}
        cpu = {j: [] for j in jobs}
        for r in range(a.rounds):
            k = r % len(jobs)
            for name, kind in jobs[k:] + jobs[:k]:
                if kind == "local":
                    w, c = run(clis[name], ["run", local_yaml, *a.run_args], {})
                else:
                    w, c = run(clis[name], ["run", s3_yaml, *a.run_args], warm_env(name))
                wall[(name, kind)].append(w)
                cpu[(name, kind)].append(c)
                print(f"round {r:2d} {name:>8s} {kind:5s} {w:7.3f} s wall {c:7.3f} s CPU",
                      flush=True)
        print(f"\n{a.workload}: {total / (1 << 20):.0f} MiB, {a.rounds} rounds, "
              f"run args {a.run_args}, load {os.getloadavg()[0]:.1f}; medians:")
        share = huge_folio_share(ds.files())
        if share is not None:
            print(f"  pages in 2 MiB folios: local files {100 * share:.0f}%, " + ", ".join(
                f"{name}'s cache {100 * huge_folio_share(sorted((work / f'cache-{name}').glob('objects/*.obj'))):.0f}%"
                for name in clis))
        for name in clis:
            lw, ww = wall[(name, "local")], wall[(name, "warm")]
            lc, wc = cpu[(name, "local")], cpu[(name, "warm")]
            per_round = statistics.median(x / y for x, y in zip(lw, ww))
            per_round_cpu = statistics.median(x / y for x, y in zip(lc, wc))
            print(f"  {name:>8s}: local {statistics.median(lw):.4f} s ({statistics.median(lc):.4f}"
                  f" CPU), warm {statistics.median(ww):.4f} s ({statistics.median(wc):.4f} CPU);"
                  f" warm/local wall {statistics.median(lw) / statistics.median(ww):.3f}"
                  f" (per round {per_round:.3f}), CPU {per_round_cpu:.3f} (target >= 0.90)")
    finally:
        s3.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
