#!/usr/bin/python3
"""W1 through flowstate's Python package, for the side-by-side comparison (compare.sh): the
same pipeline as w1_flowstate (records of 1 KiB, buffer shuffle 16384, batch 256, prefetch 4),
each batch's `data` taken as a torch.Tensor (DLPack, no copy), as the C++ harness takes each
batch (neither reads the bytes). Prints one JSON
line: samples/s over --batches batches after --warmup.

    PYTHONPATH=build/bench/python /usr/bin/python3 bench/compare_python.py --data DIR --workers 2
    ... --state-dict-every 100   # also call loader.state_dict() every 100 steps

With --state-dict-every, the run alternates segments of 500 batches with and without the
state_dict() calls on one loader (so both see the same machine state) and reports both rates,
and the share of the consumer's time spent in state_dict() (all of its cost is on the
consumer's thread, so that share bounds the cost without the segment-time noise).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import flowstate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=3072)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--state-dict-every", type=int, default=0)
    ap.add_argument("--segments", type=int, default=8)
    args = ap.parse_args()

    pipeline = (flowstate.records(paths=os.path.join(args.data, "*.bin"), record_bytes=1024)
                .seed(1234).shuffle(mode="buffer", size=16384).batch(size=256)
                .prefetch(depth=4).build())
    loader = flowstate.Loader(pipeline, epochs=0, workers=args.workers)
    touched = 0
    for _ in range(args.warmup):
        b = next(loader)
        touched += int(b["data"][0, 0])

    if args.state_dict_every:
        plain, with_state = [], []
        size = 0
        in_calls = total = 0.0
        for seg in range(args.segments):
            ckpt = seg % 2 == 1
            t0 = time.perf_counter()
            for i in range(500):
                b = next(loader)
                t = b["data"]
                touched += int(t[0, 0])
                if ckpt and (b.info.step + 1) % args.state_dict_every == 0:
                    c0 = time.perf_counter()
                    size = len(loader.state_dict()["state"])
                    in_calls += time.perf_counter() - c0
            seconds = time.perf_counter() - t0
            if ckpt:
                total += seconds
            rate = 500 * 256 / seconds
            (with_state if ckpt else plain).append(rate)
        p, c = statistics.median(plain), statistics.median(with_state)
        print(json.dumps({"impl": "python", "what": "python_state_dict_cost",
                          "workers": args.workers, "every": args.state_dict_every,
                          "plain_samples_per_s": p, "state_dict_samples_per_s": c,
                          "cost": 1 - c / p, "consumer_share": in_calls / total,
                          "state_bytes": size}))
        return

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    samples = 0
    for _ in range(args.batches):
        b = next(loader)
        t = b["data"]
        samples += b.info.num_samples
    s = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    assert t.shape == (256, 1024) and t.dtype == torch.uint8
    print(json.dumps({"impl": "python", "what": "w1", "workers": args.workers,
                      "samples_per_s": samples / s, "batches": args.batches, "seconds": s,
                      "cpu_ns_per_sample": cpu * 1e9 / samples}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
