#!/usr/bin/env python3
"""How the page cache holds a file: the sizes of the folios its pages are in (root only).

Maps FILE, touches a byte per page (reading it into the cache where it is not), then for every
page reads its frame from /proc/self/pagemap and the frame's flags from /proc/kpageflags
(compound head / tail) and prints how many pages lie in folios of each size. A file in 2 MiB
folios is mapped by the kernel a PMD (512 pages) at a time; one in 4 KiB folios a page at a
time, and on this project's VM each page's first touch by a process then costs microseconds in
the hypervisor (bench/RESULTS.md, "Issue 26: W2 bars").

    sudo bench/page_cache_folios.py /tmp/flowstate-w2/corpus.bin
"""
import collections
import mmap
import struct
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: page_cache_folios.py FILE")
    path = sys.argv[1]
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    pages = len(m) // 4096
    total = 0
    for i in range(0, len(m), 4096):
        total += m[i]
    base = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(path.split("/")[-1]):
                base = int(line.split("-")[0], 16)
                break
    if base is None:
        sys.exit(f"{path}: its mapping is not in /proc/self/maps")
    sizes = collections.Counter()
    run = 0
    with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
        for p in range(pages):
            pm.seek((base // 4096 + p) * 8)
            frame = struct.unpack("Q", pm.read(8))[0] & ((1 << 55) - 1)
            kf.seek(frame * 8)
            flags = struct.unpack("Q", kf.read(8))[0]
            if (flags >> 16) & 1:  # a compound tail: the folio goes on
                run += 1
                continue
            if run:
                sizes[run] += 1
            run = 1
    if run:
        sizes[run] += 1
    counted = sum(k * v for k, v in sizes.items())
    for k in sorted(sizes):
        print(f"{k * 4} KiB folios: {sizes[k]} ({100 * k * sizes[k] / counted:.1f}% of pages)")
    print(f"mapping at {base:#x}, 2 MiB aligned: {base % (2 << 20) == 0}")


if __name__ == "__main__":
    main()
