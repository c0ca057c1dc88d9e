#!/usr/bin/env python3
"""A/B of whole `flowstate run` processes on W2 (or any pipeline), interleaved.

Runs each binary's `flowstate run PIPELINE [ARGS...]` in turn, round by round, in a rotating
order (A B, B A, ...: a slow drift in the machine's load cancels out), and times each process
as bench/w2_compare.sh does: wall clock from the parent, CPU (user + system) from the kernel's
accounting of the child. Prints one JSON line per run, then each binary's median [min - max]
wall and CPU, tokens/s (samples x --length, from the run's summary line) and the median of the
per-round ratios against the first binary.

    bench/w2_run_ab.py --rounds 10 /tmp/base/flowstate build/release/cli/flowstate \\
        -- /tmp/flowstate-w2/w2.yaml
    bench/w2_run_ab.py --rounds 10 A=/tmp/base/flowstate B=build/release/cli/flowstate \\
        -- /tmp/flowstate-w2/w2.yaml --steps 1

A binary may be named NAME=PATH; extra environment per binary: NAME=PATH@VAR=VALUE,VAR=VALUE.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def run_once(path, env, args, length):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([path, "run", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{path} run failed ({p.returncode}): {p.stderr}")
    m = re.search(r"(\d+) samples", p.stdout + p.stderr)
    samples = int(m.group(1)) if m else 0
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "user_s": r1.ru_utime - r0.ru_utime,
            "sys_s": r1.ru_stime - r0.ru_stime, "tokens": samples * length}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--length", type=int, default=2048, help="tokens per sample (pack length)")
    ap.add_argument("binaries", nargs="+", help="flowstate binaries ([NAME=]PATH[@VAR=VALUE,...])")
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="-- PIPELINE [run options]")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the run's arguments after --")
    cut = argv.index("--")
    opts = ap.parse_args(argv[:cut])
    run_args = argv[cut + 1:]
    sides = []
    for i, spec in enumerate(opts.binaries):
        head, _, extra = spec.partition("@")
        name, _, path = head.partition("=") if "=" in head else ("", "", head)
        env = dict(os.environ)
        for kv in filter(None, extra.split(",")):
            k, _, v = kv.partition("=")
            env[k] = v
        sides.append((name or chr(ord("A") + i), path, env))
    rows = {name: [] for name, _, _ in sides}
    for r in range(opts.rounds):
        k = r % len(sides)
        order = sides[k:] + sides[:k]
        if r % 2 == 1:
            order = order[::-1]
        for name, path, env in order:
            res = run_once(path, env, run_args, opts.length)
            res.update({"side": name, "round": r, "load1": os.getloadavg()[0]})
            rows[name].append(res)
            print(json.dumps(res), flush=True)
    base = sides[0][0]
    print()
    print("| binary | wall s, median [min - max] | CPU s, median [min - max] | M tokens/s (median) "
          "| wall / A | CPU / A |")
    print("|---|---|---|---|---|---|")
    for name, path, _ in sides:
        w = [x["wall_s"] for x in rows[name]]
        c = [x["cpu_s"] for x in rows[name]]
        toks = rows[name][0]["tokens"]
        rw = [x["wall_s"] / y["wall_s"] for x, y in zip(rows[name], rows[base])]
        rc = [x["cpu_s"] / y["cpu_s"] for x, y in zip(rows[name], rows[base])]
        rate = toks / statistics.median(w) / 1e6 if toks else float("nan")
        print(f"| {name} ({path}) | {statistics.median(w):.4f} [{min(w):.4f} - {max(w):.4f}] | "
              f"{statistics.median(c):.4f} [{min(c):.4f} - {max(c):.4f}] | {rate:.0f} | "
              f"{statistics.median(rw):.3f} | {statistics.median(rc):.3f} |")


if __name__ == "__main__":
    main()
