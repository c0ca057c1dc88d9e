#!/usr/bin/python3
"""Issue 24's image baseline: torchvision over the same WebDataset tars as flowstate.

A map-style Dataset over the tar members (an index of (jpg offset, size, label) built once with
tarfile; each worker opens the archives itself and reads a member with os.pread), PIL decode,
torchvision's RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize(ImageNet),
DataLoader(batch_size=256, shuffle=True, num_workers=2, persistent_workers=True) — what a
competent PyTorch user writes. Prints one JSON line: images/s over --batches batches after
--warmup batches. Run with Debian's interpreter: /usr/bin/python3.

    /usr/bin/python3 bench/images_torch.py --data DIR --workers 2 --batches 20
"""
import argparse
import glob
import io
import json
import os
import tarfile
import time

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

BATCH = 256


class TarImages(Dataset):
    def __init__(self, directory):
        self.files = sorted(glob.glob(os.path.join(directory, "images-*.tar")))
        if not self.files:
            raise SystemExit(f"images_torch.py: no images-*.tar under {directory}")
        self.items = []  # (file index, offset, size, label)
        for f, path in enumerate(self.files):
            with tarfile.open(path) as t:
                jpg = {}
                for m in t.getmembers():
                    key, ext = m.name.split(".", 1)
                    if ext == "jpg":
                        jpg[key] = (m.offset_data, m.size)
                    elif ext == "cls":
                        label = int(t.extractfile(m).read())
                        self.items.append((f, *jpg[key], label))
        self.fds = None
        self.transform = transforms.Compose([
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if self.fds is None:  # per worker process
            self.fds = [os.open(p, os.O_RDONLY) for p in self.files]
        f, offset, size, label = self.items[i]
        data = os.pread(self.fds[f], size, offset)
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return self.transform(img), label


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    ds = TarImages(a.data)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=a.workers,
                        persistent_workers=a.workers > 0, drop_last=True)
    n, t0, it = 0, None, None
    while n < a.warmup + a.batches:
        it = iter(loader) if it is None else it
        try:
            x, y = next(it)
        except StopIteration:
            it = None
            continue
        n += 1
        if n == a.warmup:
            t0 = time.perf_counter()
    secs = time.perf_counter() - t0
    assert x.shape == (BATCH, 3, 224, 224)
    print(json.dumps({"impl": "torchvision", "workers": a.workers, "batches": a.batches,
                      "images_per_s": a.batches * BATCH / secs}))


if __name__ == "__main__":
    main()
