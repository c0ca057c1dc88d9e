"""Range reads of remote `indexed` and `records` sources (issue 23, nodes/sources/
remote_blocks.h) against real servers on 127.0.0.1 (tests/python/remote_servers.py): an
`indexed` source over s3rver (`s3://bucket/ix/corpus`, the .idx fetched whole, the .bin by
blocks of 64 KiB, documents across block boundaries) through a global shuffle, pack and batch
gives the digests of the same pipeline on local files with a cache of about a quarter of the
data, its peak sampled within the limit — through the fault proxy's resets and 503s during
ranged GETs, and through a SIGKILL mid-epoch and a resume; over HTTPS from nginx the same; a
globally shuffled `records` source on a cache of a quarter of its data reads blocks, far fewer
bytes than downloading an object per miss; a limit below the look-ahead is a configuration
error at build time. Each test starts and stops its own servers; every wait is bounded."""
import struct
import time

import pytest

from remote_servers import (FaultProxy, Nginx, PeakSampler, S3Server, digest_lines, run,
                           s3_missing_reason, sigkill_after_checkpoint)

BLOCK = 64 * 1024
DOCS = 3000
RECORD_BYTES = 4096
SHARDS = 8
RECORDS_PER_SHARD = 64  # 256 KiB shards, 2 MiB in all


def indexed_pipeline(path, paths, lookahead=None):
    extra = f", lookahead: {lookahead}" if lookahead else ""
    path.write_text(
        f"seed: 7\nsource: {{type: indexed, paths: \"{paths}\", field: tokens{extra}}}\n"
        "nodes:\n  - shuffle: {mode: global}\n  - pack: {length: 256, separator: 0}\n"
        "  - batch: {size: 8}\n")
    return path


def records_pipeline(path, paths):
    path.write_text(
        f"seed: 3\nsource: {{type: records, paths: \"{paths}\", record_bytes: {RECORD_BYTES}}}\n"
        "nodes:\n  - shuffle: {mode: global}\n  - batch: {size: 16}\n")
    return path


def run_digests(tmp, yaml, env, extra=()):
    out = tmp / f"digests-{time.monotonic_ns()}.txt"
    run(["run", str(yaml), "--digests", str(out), *extra], env=env)
    return digest_lines(out)




def documents_across_blocks(idx_path):
    """How many documents of the index cross a boundary of BLOCK-byte blocks of the .bin."""
    data = idx_path.read_bytes()
    sequences = struct.unpack_from("<Q", data, 18)[0]
    lengths = struct.unpack_from(f"<{sequences}i", data, 34)
    pointers = struct.unpack_from(f"<{sequences}q", data, 34 + 4 * sequences)
    return sum(1 for p, n in zip(pointers, lengths)
               if n > 0 and p // BLOCK != (p + 2 * n - 1) // BLOCK)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("blocks-data")
    (d / "ix").mkdir()
    run(["gen", "indexed", "--out", str(d / "ix/corpus"), "--docs", str(DOCS)])
    run(["gen", "records", "--out", str(d / "records"), "--records",
         str(SHARDS * RECORDS_PER_SHARD), "--record-bytes", str(RECORD_BYTES), "--shards",
         str(SHARDS)])
    return d


@pytest.fixture
def s3(tmp_path, data):
    reason = s3_missing_reason()
    if reason:
        pytest.skip(reason)
    server = S3Server(tmp_path / "s3").start()
    try:
        server.upload_dir(data / "ix", "ix", "corpus.*")
        server.upload_dir(data / "records", "rec", "part-*.bin")
        yield server
    finally:
        server.stop()


def indexed_limit(data):
    """The .idx, and a quarter of the .bin (at least the look-ahead's 8 blocks and one)."""
    idx = (data / "ix/corpus.idx").stat().st_size
    return idx + max((data / "ix/corpus.bin").stat().st_size // 4, 9 * BLOCK)


def cache_env(tmp, limit, **more):
    return {"FLOWSTATE_CACHE_DIR": tmp / "cache", "FLOWSTATE_CACHE_LIMIT": limit,
            "FLOWSTATE_REMOTE_BLOCK": BLOCK, "FLOWSTATE_REMOTE_BACKOFF": "0.02", **more}


def test_indexed_over_s3_through_shuffle_pack_batch_is_the_local_run_on_a_quarter_cache(
        tmp_path, data, s3):
    assert documents_across_blocks(data / "ix/corpus.idx") >= 20  # the straddles are tested
    want = run_digests(tmp_path, indexed_pipeline(tmp_path / "local.yaml",
                                                  data / "ix/corpus.idx"), {})
    limit = indexed_limit(data)
    assert limit < (data / "ix/corpus.bin").stat().st_size  # the data does not fit
    proxy = FaultProxy(s3.port).start()
    try:
        yaml = indexed_pipeline(tmp_path / "remote.yaml", "s3://bucket/ix/corpus")
        with PeakSampler(tmp_path / "cache") as sampler:
            got = run_digests(tmp_path, yaml, {**s3.env(proxy.url), **cache_env(tmp_path, limit)})
        assert got == want
        assert sampler.peak <= limit, (sampler.peak, limit)
        gets = [r for r in proxy.requests if r.startswith("GET ") and "list-type" not in r]
        blocks = -(-(data / "ix/corpus.bin").stat().st_size // BLOCK)
        print(f"limit {limit}, peak {sampler.peak}, {len(gets)} GETs for {blocks} blocks, "
              f"{proxy.bytes} bytes through the proxy")
        assert len(gets) >= blocks  # every block was read (the .idx is one GET more)
    finally:
        proxy.stop()


def test_indexed_on_a_cache_that_holds_it_downloads_every_block_once_and_reads_warm(
        tmp_path, data, s3):
    want = run_digests(tmp_path, indexed_pipeline(tmp_path / "local.yaml",
                                                  data / "ix/corpus.idx"), {},
                       extra=("--epochs", "2"))
    size = sum((data / f"ix/corpus.{e}").stat().st_size for e in ("idx", "bin"))
    blocks = -(-(data / "ix/corpus.bin").stat().st_size // BLOCK)
    proxy = FaultProxy(s3.port).start()
    try:
        yaml = indexed_pipeline(tmp_path / "remote.yaml", "s3://bucket/ix/corpus")
        env = {**s3.env(proxy.url), **cache_env(tmp_path, size)}
        assert run_digests(tmp_path, yaml, env, extra=("--epochs", "2")) == want
        gets = [r for r in proxy.requests if r.startswith("GET ") and "list-type" not in r]
        assert len(gets) == blocks + 1, gets  # each block once over two epochs, and the .idx
        before = len(proxy.requests)
        assert run_digests(tmp_path, yaml, env, extra=("--epochs", "2")) == want
        warm = [r for r in proxy.requests[before:] if r.startswith("GET ")
                and "list-type" not in r]
        assert warm == [], warm  # a warm cache: no block downloaded again
    finally:
        proxy.stop()


def test_indexed_over_https_from_nginx_reads_ranges_to_the_local_digests(tmp_path, data):
    want = run_digests(tmp_path, indexed_pipeline(tmp_path / "local.yaml",
                                                  data / "ix/corpus.idx"), {})
    nginx = Nginx(data / "ix", tmp_path / "nginx", tls=True).start()
    try:
        yaml = indexed_pipeline(tmp_path / "remote.yaml", f"{nginx.url}/corpus.idx")
        env = {**cache_env(tmp_path, indexed_limit(data)), "AWS_CA_BUNDLE": nginx.ca}
        assert run_digests(tmp_path, yaml, env) == want
        ranged = [r for r in nginx.requests() if r.startswith("GET /corpus.bin")]
        assert len(ranged) >= 2, nginx.requests()
    finally:
        nginx.stop()


def test_resets_and_503s_during_ranged_gets_are_retried_within_the_block(tmp_path, data, s3):
    want = run_digests(tmp_path, indexed_pipeline(tmp_path / "local.yaml",
                                                  data / "ix/corpus.idx"), {})
    # The listing (2 pages) and the .idx pass; then block GETs are cut mid-body or refused.
    faults = [("pass", 0)] * 3 + [("reset", 20_000), ("status", 503), ("reset", 40_000),
                                  ("status", 429), ("reset", 300), ("close", 0)] * 3
    proxy = FaultProxy(s3.port, faults=faults).start()
    try:
        yaml = indexed_pipeline(tmp_path / "remote.yaml", "s3://bucket/ix/corpus")
        env = {**s3.env(proxy.url), **cache_env(tmp_path, indexed_limit(data)),
               "FLOWSTATE_REMOTE_CONNECTIONS": 2}
        assert run_digests(tmp_path, yaml, env) == want
        assert not proxy.faults, "every fault was used"
        # No partial download is left counted as a copy.
        assert not list((tmp_path / "cache" / "partial").glob("*.part"))
    finally:
        proxy.stop()


def test_sigkill_mid_epoch_then_resume_is_the_uninterrupted_run(tmp_path, data, s3):
    want = run_digests(tmp_path, indexed_pipeline(tmp_path / "local.yaml",
                                                  data / "ix/corpus.idx"), {},
                       extra=("--epochs", "2"))
    yaml = indexed_pipeline(tmp_path / "remote.yaml", "s3://bucket/ix/corpus")
    ck = tmp_path / "ck"
    out = tmp_path / "killed.txt"
    limit = indexed_limit(data)
    steps = max(want)
    proxy = FaultProxy(s3.port, rate=2_000_000).start()  # 2 MB/s: each block about 33 ms
    try:
        at = steps // 4
        env = {**s3.env(proxy.url), **cache_env(tmp_path, limit)}
        sigkill_after_checkpoint(yaml, env, ck, out, 10, at, steps)
    finally:
        proxy.stop()
    with PeakSampler(tmp_path / "cache") as sampler:
        run(["run", str(yaml), "--epochs", "2", "--resume", "--checkpoint-dir", str(ck),
             "--digests", str(out)], env={**s3.env(), **cache_env(tmp_path, limit)})
    assert digest_lines(out) == want
    assert sampler.peak <= limit


def test_global_shuffle_over_records_on_a_quarter_cache_downloads_blocks_not_objects(
        tmp_path, data, s3):
    block = 16 * 1024  # 4 records a block, 16 blocks a shard
    want = run_digests(tmp_path, records_pipeline(tmp_path / "local.yaml",
                                                  data / "records/part-*.bin"), {})
    shard = RECORDS_PER_SHARD * RECORD_BYTES
    total = SHARDS * shard
    limit = total // 4
    proxy = FaultProxy(s3.port).start()
    try:
        yaml = records_pipeline(tmp_path / "remote.yaml", "s3://bucket/rec/part-*.bin")
        with PeakSampler(tmp_path / "cache") as sampler:
            got = run_digests(tmp_path, yaml, {**s3.env(proxy.url),
                                               **cache_env(tmp_path, limit,
                                                           FLOWSTATE_REMOTE_BLOCK=block)})
        assert got == want
        assert sampler.peak <= limit, (sampler.peak, limit)
        gets = [r for r in proxy.requests if r.startswith("GET ") and "list-type" not in r]
        # Each GET is one block; a whole-object read per miss would download a shard for each.
        whole = len(gets) * shard
        print(f"{len(gets)} block GETs, {proxy.bytes} bytes through the proxy for {total} "
              f"bytes of data; an object per miss: {whole} bytes")
        assert len(gets) >= total // block  # every block at least once
        assert proxy.bytes < whole / 10
        assert proxy.bytes < 8 * total  # the misses of a quarter cache, not more
    finally:
        proxy.stop()


def test_a_limit_below_the_block_look_ahead_is_a_config_error_at_build_time(tmp_path, s3):
    yaml = indexed_pipeline(tmp_path / "remote.yaml", "s3://bucket/ix/corpus", lookahead=8)
    r = run(["run", str(yaml)], env={**s3.env(), **cache_env(tmp_path, 6 * BLOCK)},
            check=False, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "FLOWSTATE_CACHE_LIMIT" in r.stderr and "look-ahead" in r.stderr, r.stderr
    assert "lookahead: 8 blocks" in r.stderr, r.stderr
    assert not list((tmp_path / "cache" / "objects").glob("*.obj")), "nothing was downloaded"
    indexed_pipeline(yaml, "s3://bucket/ix/corpus", lookahead=2)
    run(["run", str(yaml), "--steps", "5"], env={**s3.env(), **cache_env(tmp_path, 6 * BLOCK)})
