#!/usr/bin/python3
"""flowstate.DataLoader against torch.utils.data.DataLoader on the same map-style dataset, side
by side, interleaved round by round (issue 21's benchmarks):

  pure  a dataset whose __getitem__ spends ~200 us in pure Python (a loop, holding the GIL),
        batch 32, default collate: samples/s for torch num_workers 0 and 2, flowstate 0, 1, 2.
  w1    W1 through the native Loader's Python loop, this tree's iteration (one epoch per pass,
        a generator per epoch) against the previous one (next() on the extension's loader
        straight, as __next__ did before), in one process, alternating segments.
  ceiling the same pure-Python work in one and in two forked processes at once: the most
        num_workers=2 can give over 1 on this machine.
  resume the time from load_state_dict to the first batch at 50% of an epoch of a 1 M-item
        map-style dataset, shuffled: flowstate (O(1): the plan's state) against the
        StatefulDataLoader-style fast-forward (replaying the epoch's sampler indices up to
        the position, without reading the items, then fetching the next batch).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/dataloader_bench.py pure --rounds 5
    PYTHONPATH=build/release/python /usr/bin/python3 bench/dataloader_bench.py ceiling
    PYTHONPATH=build/release/python /usr/bin/python3 bench/dataloader_bench.py w1 --data DIR
    PYTHONPATH=build/release/python /usr/bin/python3 bench/dataloader_bench.py resume

Each prints one JSON line per measurement and a summary of medians and ratios.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.utils.data as tud

import flowstate


def calibrate(us):
    """Loop iterations of PurePython._work that take `us` microseconds here (the best of 7
    timings, so that a busy moment does not inflate it); every run then does the same work."""
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        PurePython._work(20000)
        best = min(best, (time.perf_counter() - t0) / 20000)
    return max(1, int(us * 1e-6 / best))


class PurePython(tud.Dataset):
    """__getitem__ runs `loops` iterations of a pure-Python loop (holding the GIL)."""

    def __init__(self, n, loops):
        self.n, self.loops = n, loops

    @staticmethod
    def _work(loops):
        acc = 0
        for k in range(loops):
            acc = (acc * 31 + k) & 0xFFFF
        return acc

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(self._work(self.loops)), float(i)]), i


def run_pure(kind, workers, items, batch, loops):
    ds = PurePython(items, loops)
    if kind == "torch":
        loader = tud.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                persistent_workers=workers > 0)
    else:
        loader = flowstate.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                      persistent_workers=workers > 0, seed=1)
    # Start-up (forking the workers, their first batches) is measured apart.
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    start = time.perf_counter() - t0
    n = 1
    t0 = time.perf_counter()
    for _ in it:
        n += 1
    dt = time.perf_counter() - t0
    if hasattr(loader, "close"):
        loader.close()
    return {"what": f"{kind}-{workers}", "samples_per_s": (n - 1) * batch / dt,
            "startup_s": start}


def ceiling(args):
    """The most two processes can give over one here: the same pure-Python work in 1 and in 2
    forked processes at once, interleaved (what num_workers=2 over 1 can reach at best)."""
    loops = calibrate(args.item_us)
    n = args.items

    def run(procs):
        t0 = time.perf_counter()
        pids = []
        for _ in range(procs):
            pid = os.fork()
            if pid == 0:
                for _ in range(n):
                    PurePython._work(loops)
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        return procs * n / (time.perf_counter() - t0)

    rates = {1: [], 2: []}
    for r in range(args.rounds):
        for procs in ((1, 2) if r % 2 == 0 else (2, 1)):
            rates[procs].append(run(procs))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(json.dumps({"summary": "ceiling", "items_per_s": med, "two_over_one": med[2] / med[1]}))


def pure(args):
    configs = [("torch", 0), ("flowstate", 0), ("torch", 2), ("flowstate", 1),
               ("flowstate", 2)]
    results = {}
    loops = calibrate(args.item_us)
    print(json.dumps({"loops_per_item": loops, "item_us": args.item_us}), flush=True)
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for kind, w in order:
            res = run_pure(kind, w, args.items, 32, loops)
            res["round"] = r
            print(json.dumps(res), flush=True)
            results.setdefault(res["what"], []).append(res["samples_per_s"])
    med = {k: statistics.median(v) for k, v in results.items()}
    print(json.dumps({"summary": "pure", "median_samples_per_s": med,
                      "flowstate2_over_flowstate1": med["flowstate-2"] / med["flowstate-1"],
                      "flowstate2_over_torch2": med["flowstate-2"] / med["torch-2"],
                      "flowstate0_over_torch0": med["flowstate-0"] / med["torch-0"]}))


def w1(args):
    pipeline = (flowstate.records(paths=os.path.join(args.data, "*.bin"), record_bytes=1024)
                .seed(1234).shuffle(mode="buffer", size=16384).batch(size=256)
                .prefetch(depth=4).build())
    loader = flowstate.Loader(pipeline, workers=2)

    def new_way(n):
        got = 0
        while got < n:
            for b in loader:
                got += int(b["data"][0, 0] >= 0)
                if got == n:
                    return

    def old_way(n):
        # What Loader.__next__ did before this change: the extension's next() and a Batch.
        native = loader._native
        for _ in range(n):
            info, fields, value, producers, fence = native.next()
            b = flowstate.Batch(flowstate.BatchInfo._make(info), fields, value, producers, fence)
            int(b["data"][0, 0] >= 0)

    new_way(200)
    rates = {"new": [], "old": []}
    for seg in range(args.segments):
        for name, fn in (("new", new_way), ("old", old_way)) if seg % 2 == 0 else (
                ("old", old_way), ("new", new_way)):
            t0 = time.perf_counter()
            fn(args.batches)
            rates[name].append(args.batches * 256 / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(json.dumps({"summary": "w1", "median_samples_per_s": med, "new_over_old":
                      med["new"] / med["old"], "segments": args.segments,
                      "batches_per_segment": args.batches}))


class Cheap(tud.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i])


def resume(args):
    n, batch = args.resume_items, 32
    position = n // batch // 2  # batches into the epoch
    ds = Cheap(n)
    times = {"flowstate": [], "replay": []}
    # The state at 50% of epoch 0, saved by a loader that got there.
    src = flowstate.DataLoader(ds, batch_size=batch, shuffle=True, seed=7)
    it = iter(src)
    for _ in range(position):
        next(it)
    sd = src.state_dict()
    src.close()
    for r in range(args.rounds):
        t0 = time.perf_counter()
        fl = flowstate.DataLoader(ds, batch_size=batch, shuffle=True, seed=7)
        fl.load_state_dict(sd)
        first = next(iter(fl))
        times["flowstate"].append(time.perf_counter() - t0)
        fl.close()
        # StatefulDataLoader's fast-forward for a map-style dataset: the sampler's indices of
        # the epoch are replayed up to the position, the items are not read.
        t0 = time.perf_counter()
        g = torch.Generator()
        g.manual_seed(7)
        sampler = tud.RandomSampler(ds, generator=g)
        bs = tud.BatchSampler(sampler, batch, False)
        batches = iter(bs)
        for _ in range(position):
            next(batches)
        idx = next(batches)
        torch.utils.data.default_collate([ds[i] for i in idx])
        times["replay"].append(time.perf_counter() - t0)
        print(json.dumps({"round": r, "flowstate_s": times["flowstate"][-1],
                          "replay_s": times["replay"][-1]}), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"summary": "resume", "items": n, "position_batches": position,
                      "median_s": med, "replay_over_flowstate": med["replay"] / med["flowstate"],
                      "first_batch_ok": int(first[0]) >= 0}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["pure", "ceiling", "w1", "resume"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--items", type=int, default=6400, help="pure: items per epoch")
    ap.add_argument("--item-us", type=float, default=200.0, help="pure: Python work per item")
    ap.add_argument("--data", help="w1: directory of W1 records (bench/w1_flowstate gen)")
    ap.add_argument("--segments", type=int, default=10)
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--resume-items", type=int, default=1_000_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    {"pure": pure, "ceiling": ceiling, "w1": w1, "resume": resume}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
