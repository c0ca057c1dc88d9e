"""Issue 24 (text), the PyTorch side: raw JSON Lines text -> python3-sentencepiece -> rows of
2048 ids (the model's EOS after each document) -> batches of 8, with torch's DataLoader
(num_workers=2 by default), as a PyTorch user writes it: an IterableDataset whose every worker
reads the files, takes its share of a shuffled document order, tokenizes each document with
`sp.encode` and packs the ids into rows. Prints one JSON line (tokens/s over one epoch), as
bench/text_flowstate does, for bench/text_compare.sh.

    /usr/bin/python3 bench/text_torch.py --data DIR [--workers 2] [--chunk 0]

DIR holds `flowstate gen text`'s text-*.jsonl and m.model. --chunk N encodes N documents per
`sp.encode` call (its list form, one thread per call here) instead of one at a time.
"""
import argparse
import glob
import json
import os
import resource
import time

import numpy as np
import sentencepiece as spm
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

LENGTH = 2048
BATCH = 8


class PackedText(IterableDataset):
    def __init__(self, files, model, seed=1234, chunk=0):
        self.files, self.model, self.seed, self.chunk = files, model, seed, chunk

    def documents(self):
        """This worker's share of the documents, in a shuffled order (one order per epoch)."""
        lines = []
        for f in self.files:
            with open(f, "rb") as fh:
                lines += fh.readlines()
        order = torch.randperm(len(lines), generator=torch.Generator().manual_seed(self.seed))
        info = get_worker_info()
        if info is not None:
            order = order[info.id::info.num_workers]
        for i in order.tolist():
            yield json.loads(lines[i])["text"]

    def token_lists(self, sp):
        if not self.chunk:
            for text in self.documents():
                yield sp.encode(text)
            return
        texts = []
        for text in self.documents():
            texts.append(text)
            if len(texts) == self.chunk:
                yield from sp.encode(texts, num_threads=1)
                texts = []
        if texts:
            yield from sp.encode(texts, num_threads=1)

    def __iter__(self):
        sp = spm.SentencePieceProcessor(model_file=self.model)
        eos = sp.eos_id()
        buf = np.empty(0, dtype=np.int32)
        pending = []
        have = 0
        for ids in self.token_lists(sp):
            ids.append(eos)
            pending.append(np.asarray(ids, dtype=np.int32))
            have += len(ids)
            if have >= LENGTH:
                buf = np.concatenate([buf] + pending)
                pending, rows = [], len(buf) // LENGTH
                for r in range(rows):
                    yield torch.from_numpy(buf[r * LENGTH:(r + 1) * LENGTH].copy())
                buf = buf[rows * LENGTH:]
                have = len(buf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(a.data, "text-*.jsonl")))
    ds = PackedText(files, os.path.join(a.data, "m.model"), chunk=a.chunk)
    t0 = time.perf_counter()
    cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    loader = DataLoader(ds, batch_size=BATCH, num_workers=a.workers,
                        **({"prefetch_factor": 4} if a.workers else {}))
    rows = batches = 0
    for b in loader:
        rows += b.shape[0]
        batches += 1
    s = time.perf_counter() - t0
    del loader  # its workers exit and are waited for: their CPU time is then the children's
    cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu0 + \
        sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
    print(json.dumps({"what": "text", "impl": "torch", "workers": a.workers, "chunk": a.chunk,
                      "tokens_per_s": rows * LENGTH / s, "batches": batches, "seconds": s,
                      "cores": cpu / s,
                      **({"label": a.label} if a.label else {})}), flush=True)


if __name__ == "__main__":
    main()
