#!/usr/bin/python3
"""W1 on PyTorch's DataLoader, for the side-by-side comparison (compare.sh).

A map-style Dataset over np.memmap views of the record files (each item a copy of one 1 KiB
record as a uint8 array), RandomSampler with a fixed seed, batch 256, the default collate
(one [256, 1024] uint8 tensor). Prints one JSON line: samples/s over --batches batches after
--warmup batches. Run with Debian's interpreter: /usr/bin/python3 (python3-torch 1.13).

    /usr/bin/python3 bench/compare_torch.py --data DIR --workers 0 --batches 300
"""
import argparse
import bisect
import glob
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

RECORD_BYTES = 1024
BATCH = 256


class RecordsDataset(Dataset):
    """Fixed-size records in sorted shard files, one np.memmap per file."""

    def __init__(self, directory):
        self.files = sorted(glob.glob(os.path.join(directory, "part-*.bin")))
        if not self.files:
            raise SystemExit(f"compare_torch.py: no part-*.bin under {directory}")
        self.maps = [np.memmap(f, dtype=np.uint8, mode="r").reshape(-1, RECORD_BYTES)
                     for f in self.files]
        self.first = [0]
        for m in self.maps:
            self.first.append(self.first[-1] + m.shape[0])

    def __len__(self):
        return self.first[-1]

    def __getitem__(self, i):
        k = bisect.bisect_right(self.first, i) - 1
        return np.array(self.maps[k][i - self.first[k]])  # a writable copy of the record


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()

    ds = RecordsDataset(args.data)
    gen = torch.Generator()
    gen.manual_seed(1234)
    loader = DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(ds, generator=gen),
                        num_workers=args.workers)
    seen = samples = 0
    t0 = None
    done = False
    while not done:  # epochs restart as needed
        for batch in loader:
            if seen == 0:
                assert batch.shape == (BATCH, RECORD_BYTES) and batch.dtype == torch.uint8, \
                    (batch.shape, batch.dtype)
            if seen == args.warmup:
                t0 = time.perf_counter()
                cpu0 = time.process_time()
            if seen >= args.warmup:
                samples += batch.shape[0]
            seen += 1
            if seen == args.warmup + args.batches:
                done = True
                break
    s = time.perf_counter() - t0
    # This process's CPU only: with num_workers > 0 the workers' CPU is not included.
    cpu = time.process_time() - cpu0
    print(json.dumps({"impl": "pytorch", "what": "w1", "workers": args.workers,
                      "samples_per_s": samples / s, "batches": args.batches, "seconds": s,
                      "main_process_cpu_ns_per_sample": cpu * 1e9 / samples,
                      "torch": torch.__version__, "intra_op_threads": torch.get_num_threads()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
