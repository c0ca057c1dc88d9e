#!/usr/bin/python3
"""Summarizes a compare.sh run (its JSON lines): medians, spreads, ratios, and the bars of
issue 6 with pass/fail. Usage: compare_summary.py RESULTS.jsonl"""
import json
import statistics
import sys
from collections import defaultdict

MIB = 1 << 20


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    machine = next((r for r in rows if r.get("what") == "machine"), {})
    after = next((r for r in rows if r.get("what") == "machine_after"), {})
    print(f"machine: {machine.get('cpus')} CPUs, {machine.get('cpu')}, kernel "
          f"{machine.get('kernel')}; load {machine.get('load_before')} before, "
          f"{after.get('load_after')} after; {machine.get('date')}")

    # ---- W1 throughput ----
    w1 = defaultdict(dict)  # name -> round -> samples/s
    cpu = defaultdict(list)  # name -> CPU ns per sample (whole process; PyTorch: main process)
    for r in rows:
        if r.get("what") == "w1":
            name = f"{r['impl']} {r['workers']}w"
            w1[name][r["round"]] = r["samples_per_s"]
            c = r.get("cpu_ns_per_sample", r.get("main_process_cpu_ns_per_sample"))
            if c is not None:
                cpu[name].append(c)
        elif r.get("what") == "gather":
            w1["gather ceiling 1 thread"][r["round"]] = r["records_per_s"]
            w1["gather 1 thread, prefetch"][r["round"]] = r["records_per_s_prefetch"]

    def stats(d):
        v = sorted(d.values())
        return statistics.median(v), v[0], v[-1]

    print("\nW1 (262144 x 1 KiB, buffer shuffle 16384, batch 256): samples/s, "
          "median [min - max] over rounds")
    order = ["flowstate 1w", "flowstate 2w", "python 2w", "libtorch 2w", "pytorch 0w", "pytorch 2w",
             "gather ceiling 1 thread", "gather 1 thread, prefetch"]
    for name in order + sorted(set(w1) - set(order)):
        if name in w1:
            m, lo, hi = stats(w1[name])
            c = f"  CPU {statistics.median(cpu[name]):6.0f} ns/sample" if cpu[name] else ""
            if name == "pytorch 2w" and c:
                c += " (main process only)"
            print(f"  {name:26s} {m / 1e6:7.3f} M  [{lo / 1e6:.3f} - {hi / 1e6:.3f}]  "
                  f"({len(w1[name])} rounds){c}")

    def ratio(a, b):
        """Median of the per-round ratios a/b (paired, same round), and the ratio of medians."""
        if a not in w1 or b not in w1:
            return None
        paired = [w1[a][k] / w1[b][k] for k in w1[a] if k in w1[b]]
        return statistics.median(paired), min(paired), max(paired), \
            stats(w1[a])[0] / stats(w1[b])[0]

    bars = []

    def bar(name, ok, detail):
        bars.append((name, ok, detail))

    print("\nratios (median of per-round ratios [min - max]; ratio of medians)")
    for a, b in [("flowstate 2w", "libtorch 2w"), ("flowstate 1w", "libtorch 2w"),
                 ("flowstate 2w", "pytorch 0w"), ("flowstate 2w", "pytorch 2w"),
                 ("flowstate 2w", "flowstate 1w"), ("flowstate 2w", "gather ceiling 1 thread"),
                 ("python 2w", "flowstate 2w"), ("python 2w", "pytorch 0w"),
                 ("python 2w", "pytorch 2w")]:
        r = ratio(a, b)
        if r:
            print(f"  {a} / {b}: {r[0]:.2f}x [{r[1]:.2f} - {r[2]:.2f}]; {r[3]:.2f}x")
    r = ratio("flowstate 2w", "libtorch 2w")
    if r:
        bar("W1 >= 2x LibTorch (2 workers)", r[0] >= 2.0, f"{r[0]:.2f}x")
    r = ratio("flowstate 2w", "pytorch 0w")
    if r:
        bar("W1 >= 15x PyTorch num_workers=0", r[0] >= 15.0, f"{r[0]:.1f}x")

    r = ratio("python 2w", "flowstate 2w")
    if r:
        bar("W1 from Python >= 90% of the C++ rate", r[0] >= 0.9, f"{r[0] * 100:.0f}%")
    for w in (0, 2):
        r = ratio("python 2w", f"pytorch {w}w")
        if r:
            bar(f"W1 from Python >= 10x PyTorch num_workers={w}", r[0] >= 10.0, f"{r[0]:.1f}x")

    # ---- map-heavy ----
    mh = defaultdict(dict)
    cores = defaultdict(list)  # CPU cores the process actually got (CPU time / wall time)
    cost = []
    for x in rows:
        if x.get("what") == "map_heavy":
            mh[x["workers"]][x["round"]] = x["samples_per_s"]
            cores[x["workers"]].append(x["samples_per_s"] * x["cpu_ns_per_sample"] * 1e-9)
            cost.append(x["map_ns_per_sample"])
    if 1 in mh and 2 in mh:
        paired = [mh[2][k] / mh[1][k] for k in mh[1] if k in mh[2]]
        print(f"\nmap-heavy (~{statistics.median(cost) / 1e3:.2f} us/sample transform): "
              f"1 worker {statistics.median(mh[1].values()) / 1e6:.3f} M/s, "
              f"2 workers {statistics.median(mh[2].values()) / 1e6:.3f} M/s; "
              f"speed-up {statistics.median(paired):.2f}x [{min(paired):.2f} - {max(paired):.2f}]"
              f"\n  CPU cores the process got (CPU time / wall time): 1 worker "
              f"{statistics.median(cores[1]):.2f}, 2 workers {statistics.median(cores[2]):.2f}"
              f" (2 workers can only reach 1.6x when the machine gives it >= 1.6 cores)")
        bar("map-heavy: 2 workers >= 1.6x 1 worker", statistics.median(paired) >= 1.6,
            f"{statistics.median(paired):.2f}x")

    # ---- checkpoint cost ----
    for x in rows:
        if x.get("what") == "checkpoint_cost":
            kind = x["kind"]
            print(f"\ncheckpoint every {x['every']} steps ({kind}, {x['saves']} saves): cost "
                  f"{x['cost_median'] * 100:+.2f}% [{x['cost_min'] * 100:+.2f} - "
                  f"{x['cost_max'] * 100:+.2f}], {x['plain_samples_per_s'] / 1e6:.3f} -> "
                  f"{x['ckpt_samples_per_s'] / 1e6:.3f} M samples/s; save call "
                  f"{x['save_ms_median']:.2f} ms median, {x['save_ms_max']:.2f} max; the consumer "
                  f"spent {x['consumer_share'] * 100:.2f}% of its time in the calls")
            what = {"state": "Loader::state() kept in memory",
                    "sync": "save_checkpoint, write + fsync on the consumer's thread",
                    "async": "save_checkpoint_async"}[kind]
            if kind == "state":
                # All of its cost is on the consumer's thread, so the share of the consumer's
                # time spent in state() bounds it from above, without the segment-time noise.
                bar(f"checkpoint every 100 steps < 2% ({what})", x["consumer_share"] < 0.02,
                    f"<= {x['consumer_share'] * 100:.2f}% (time in state(); interleaved "
                    f"segments {x['cost_median'] * 100:+.2f}%)")
            else:
                bar(f"checkpoint every 100 steps < 2% ({what})", x["cost_median"] < 0.02,
                    f"{x['cost_median'] * 100:+.2f}%")

    for x in rows:
        if x.get("what") == "python_state_dict_cost":
            print(f"\nstate_dict() every {x['every']} steps from Python: "
                  f"{x['plain_samples_per_s'] / 1e6:.3f} -> {x['state_dict_samples_per_s'] / 1e6:.3f}"
                  f" M samples/s ({x['cost'] * 100:+.2f}%), {x['state_bytes']} bytes; the consumer "
                  f"spent {x['consumer_share'] * 100:.2f}% of its time in the calls")
            bar("state_dict() every 100 steps from Python < 2%", x["consumer_share"] < 0.02,
                f"<= {x['consumer_share'] * 100:.2f}% (time in state_dict(); interleaved "
                f"segments {x['cost'] * 100:+.2f}%)")

    # ---- restore ----
    for x in rows:
        if x.get("what") == "restore":
            s = x["scratch_ms"]
            print(f"\ntime to first batch: from scratch {s['median']:.2f} ms "
                  f"[{s['min']:.2f} - {s['max']:.2f}]")
            worst = 0
            for k in ("state50", "state99", "dir50", "dir99"):
                m = x[k + "_ms"]
                print(f"  {k:8s} {m['median']:.2f} ms [{m['min']:.2f} - {m['max']:.2f}]  "
                      f"{x[k + '_ratio']:.2f}x scratch")
                worst = max(worst, x[k + "_ratio"])
            bar("restore at 50%/99% <= 2x first batch from scratch", worst <= 2.0,
                f"worst {worst:.2f}x")

    # ---- size ----
    for x in rows:
        if x.get("what") == "state_size":
            print(f"\nstate size: max {x['max_state_bytes']} bytes (batch {x['at_batch']}); "
                  f"checkpoint directory max {x['max_checkpoint_bytes']} bytes")
            big = max(x["max_state_bytes"], x["max_checkpoint_bytes"])
            bar("W1 checkpoint < 64 KiB", big < 64 * 1024, f"{big / 1024:.1f} KiB")

    # ---- memory ----
    for x in rows:
        if x.get("what") == "rss":
            peaks = x["epoch_peak_anon_bytes"]
            print(f"\nmemory over {x['epochs']} epochs: anonymous RSS peak per epoch "
                  f"{', '.join(f'{p / MIB:.1f}' for p in peaks)} MiB; bound "
                  f"{x['bound_bytes'] / MIB:.1f} MiB; VmHWM (incl. mapped files) "
                  f"{x['vm_hwm_bytes'] / MIB:.1f} MiB")
            growth = x["growth_bytes"]
            ok = x["peak_anon_bytes"] <= x["bound_bytes"] and growth <= 2 * MIB
            bar("RSS <= 1.5 x (buffer + in flight) + 64 MiB, not growing", ok,
                f"{x['peak_anon_bytes'] / MIB:.1f} MiB peak, {growth / MIB:+.1f} MiB growth")

    print("\nbars")
    for name, ok, detail in bars:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in bars) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
