#!/usr/bin/python3
"""W2 with a Python/PyTorch packer in the style of Megatron-LM's GPTDataset.

The comparison point of docs/DESIGN.md §11 for workload W2: the document order is shuffled
with numpy, the sample index (for each row of 2048 tokens: the document it starts in and the
offset into it) is precomputed with numpy over that order, and `__getitem__` copies the
document slices of the row from the memory-mapped .bin into one int64 row, with an
end-of-document token (0) after each document, as Megatron-LM's GPTDataset does with its
doc_idx / sample_idx (samples are taken in order here, without Megatron's extra shuffle of
samples, so the rows are the stream flowstate cuts). A torch DataLoader batches 8 rows.

Written as a competent user would, and as fast as that (issue 26; the first version ran at
half the speed of an independently written one): the .bin is an `np.memmap` viewed as a plain
ndarray (Megatron-LM's `np.frombuffer` over the mapping: slicing a memmap object runs Python
code per slice), the per-row index lookups read Python lists (a numpy scalar per lookup costs
~100 ns), and each slice is converted to int64 straight into the row (no concatenate and
`astype` copy). Prints one JSON line:

    /usr/bin/python3 bench/w2_megatron_packer.py DIR/corpus.idx --workers 0 --epochs 1
"""

import argparse
import json
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LENGTH = 2048
BATCH = 8
EOS = 0
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def read_index(path):
    """(dtype, lengths, pointers in items) of a Megatron .idx of one sequence per document."""
    with open(path, "rb") as f:
        header = f.read(34)
    assert header[:9] == b"MMIDIDX\x00\x00", path
    dtype = DTYPES[header[17]]
    n = int(np.frombuffer(header, np.uint64, 1, 18)[0])
    lengths = np.memmap(path, np.int32, "r", 34, (n,))
    pointers = np.memmap(path, np.int64, "r", 34 + 4 * n, (n,))
    return dtype, np.array(lengths, np.int64), np.array(pointers) // np.dtype(dtype).itemsize


class PackedDataset(Dataset):
    """Rows of LENGTH tokens over documents in a shuffled order (GPTDataset's scheme)."""

    def __init__(self, idx_path, seed, epoch):
        dtype, lengths, pointers = read_index(idx_path)
        self.bin = np.memmap(idx_path[:-4] + ".bin", dtype, "r").view(np.ndarray)
        rng = np.random.RandomState(seed + epoch)
        order = rng.permutation(len(lengths)).astype(np.int64)  # doc_idx
        lengths = lengths[order]
        extents = lengths + 1  # the EOS after each document
        ends = np.cumsum(extents)
        rows = int(ends[-1]) // LENGTH  # the partial last row is dropped
        starts = np.arange(rows + 1, dtype=np.int64) * LENGTH
        # sample_idx: the document each row boundary falls in, and the offset into it.
        docs = np.searchsorted(ends, starts, side="right")
        docs[-1] = min(docs[-1], len(ends) - 1)
        self.sample_doc = docs.tolist()
        self.sample_off = (starts - (ends[docs] - extents[docs])).tolist()
        self.lengths = lengths.tolist()
        self.pointers = pointers[order].tolist()
        self.rows = rows

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        d0, o0 = self.sample_doc[i], self.sample_off[i]
        d1, o1 = self.sample_doc[i + 1], self.sample_off[i + 1]
        row = np.empty(LENGTH, np.int64)
        at = 0
        for d in range(d0, d1 + 1):
            begin = o0 if d == d0 else 0
            n = self.lengths[d]
            end = o1 if d == d1 else n + 1
            body = min(end, n)
            if body > begin:
                p = self.pointers[d]
                row[at : at + body - begin] = self.bin[p + begin : p + body]
                at += body - begin
            if end > n:
                row[at] = EOS
                at += 1
        assert at == LENGTH, (i, at)
        return torch.from_numpy(row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("idx")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = 0
    setup = 0.0
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        s0 = time.perf_counter()
        ds = PackedDataset(a.idx, 1234, epoch)
        setup += time.perf_counter() - s0
        loader = DataLoader(ds, batch_size=BATCH, num_workers=a.workers, drop_last=True)
        for batch in loader:
            assert batch.shape == (BATCH, LENGTH)
            rows += batch.shape[0]
    s = time.perf_counter() - t0
    out = {
        "impl": "megatron_py",
        "what": "w2",
        "workers": a.workers,
        "tokens_per_s": rows * LENGTH / s,
        "rows_per_s": rows / s,
        "seconds": s,
        "index_build_s": setup,
        "epochs": a.epochs,
    }
    if a.label:
        out["label"] = a.label
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
