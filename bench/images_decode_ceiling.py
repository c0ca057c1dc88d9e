#!/usr/bin/python3
"""Issue 24's ceiling: libjpeg-turbo's own decode speed on this CPU, one core, on the JPEGs of
the benchmark's tars — PIL's decode (Image.open + load, which is libjpeg-turbo's
jpeg_read_scanlines, full size and at the reduced size `draft` picks, i.e. the scaled IDCT)
with nothing else. Prints one JSON line per mode.

    /usr/bin/python3 bench/images_decode_ceiling.py --data DIR --images 500
"""
import argparse
import glob
import io
import json
import os
import tarfile
import time

from PIL import Image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--images", type=int, default=500)
    a = ap.parse_args()
    jpegs = []
    for path in sorted(glob.glob(os.path.join(a.data, "images-*.tar"))):
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.name.endswith(".jpg") and len(jpegs) < a.images:
                    jpegs.append(t.extractfile(m).read())
    pixels = 0
    for mode in ("full", "min_size_224"):
        t0 = time.perf_counter()
        for data in jpegs:
            img = Image.open(io.BytesIO(data))
            if mode == "min_size_224":
                # draft picks the smallest scale M/8 (M in 1, 2, 4, 8 for PIL) keeping both sides >= 224
                img.draft("RGB", (224, 224))
            img.load()
            pixels += img.size[0] * img.size[1]
        secs = time.perf_counter() - t0
        print(json.dumps({"impl": "libjpeg-turbo via PIL, 1 core", "mode": mode,
                          "images": len(jpegs), "images_per_s": len(jpegs) / secs}))


if __name__ == "__main__":
    main()
