#!/usr/bin/python3
"""How the size of the writes that made a file decides its page-cache folios (bench/RESULTS.md,
"Issue 23: a warm cache"): writes a 64 MiB file in pieces of CHUNK bytes (after an ftruncate
to its size, as the object cache's partial files are made, or not), fsyncs it, and prints its
folios with bench/page_cache_folios.py.

    bench/write_folios.py /tmp/f 16384 && bench/write_folios.py /tmp/f 2097152 --truncate
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("path")
ap.add_argument("chunk", type=int)
ap.add_argument("--truncate", action="store_true")
a = ap.parse_args()
size = 64 << 20
data = os.urandom(1 << 20) * 64
fd = os.open(a.path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
if a.truncate:
    os.ftruncate(fd, size)
for off in range(0, size, a.chunk):
    os.pwrite(fd, data[off:off + a.chunk], off)
os.fsync(fd)
os.close(fd)
sys.exit(subprocess.call([sys.executable, str(Path(__file__).parent / "page_cache_folios.py"),
                          a.path]))
