"""The look-ahead window of remote `records` sources (issue 23, nodes/sources/remote_window.h)
against s3rver on 127.0.0.1: a cache limit of 3 shards serves a 10-shard data set for two
epochs with the digests of the same pipeline on local files and the cache directory's sampled
peak within the limit; a run killed with SIGKILL mid-epoch resumes on that small cache to the
uninterrupted run's digests; a limit below the look-ahead is a configuration error at build
time, and so is one that does not hold the look-ahead beside another process's on the same
cache directory (until that process is killed); an error about a record of a cached copy names
the URL. Each test starts and stops
its own servers; every wait is bounded. (Since range reads, a `records` source whose objects
exceed the limit, as here, reads them through nodes/sources/remote_blocks.h — with the default
4 MiB block each shard is one block — under the same front, look-ahead and straggler rules.)"""
import signal
import subprocess
import time

import pytest

from remote_servers import (FaultProxy, PeakSampler, S3Server, clean_env, cli_path, digest_lines,
                            run, s3_missing_reason, sigkill_after_checkpoint)

RECORD_BYTES = 256
SHARDS = 10
RECORDS = 10 * 1000  # 10 shards of 256 000 bytes
SHARD = RECORDS // SHARDS * RECORD_BYTES
LIMIT = 3 * SHARD  # the look-ahead (2 files) and one more


def pipeline(path, paths, lookahead=2):
    # A buffer shuffle reads the files in order, a hundred records mixed across their ends.
    # (A buffer whose records span more files than the cache holds downloads a shard again
    # for each record it kept from an unpinned file: tail reads are whole shards.)
    path.write_text(
        f"seed: 5\nsource: {{type: records, paths: \"{paths}\", record_bytes: {RECORD_BYTES}, "
        f"lookahead: {lookahead}}}\n"
        "nodes:\n  - shuffle: {mode: buffer, size: 100}\n  - batch: {size: 50}\n")
    return path


def cache_env(tmp, limit=LIMIT):
    return {"FLOWSTATE_CACHE_DIR": str(tmp / "cache"), "FLOWSTATE_CACHE_LIMIT": str(limit),
            "FLOWSTATE_REMOTE_BACKOFF": "0.02"}


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("window-data")
    run(["gen", "records", "--out", str(d), "--records", str(RECORDS), "--record-bytes",
         str(RECORD_BYTES), "--shards", str(SHARDS)])
    return d


@pytest.fixture
def s3(tmp_path, local_data):
    reason = s3_missing_reason()
    if reason:
        pytest.skip(reason)
    server = S3Server(tmp_path / "s3").start()
    try:
        server.upload_dir(local_data, "w", "part-*.bin")
        yield server
    finally:
        server.stop()


def test_a_cache_of_3_shards_reads_10_shards_for_two_epochs_as_local_files(
        tmp_path, local_data, s3):
    want = digest_lines(run_digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                                      local_data / "part-*.bin"), {}))
    proxy = FaultProxy(s3.port).start()
    cache = tmp_path / "cache"
    cache.mkdir()
    try:
        yaml = pipeline(tmp_path / "remote.yaml", "s3://bucket/w/part-*.bin")
        with PeakSampler(cache) as sampler:
            got = run_digests(tmp_path, yaml, {**s3.env(proxy.url), **cache_env(tmp_path)})
        assert digest_lines(got) == want
        n = len([r for r in proxy.requests if r.startswith("GET ") and "list-type" not in r])
        print(f"cache limit {LIMIT} bytes, peak {sampler.peak} bytes, {n} GETs for "
              f"{2 * SHARDS} shard reads")
        assert sampler.peak <= LIMIT
        assert sampler.peak >= 2 * SHARD  # the look-ahead held two shards at once
        # Each epoch downloads each shard once, less what the cache still held, plus at most
        # a few again where one epoch's last shards and the next one's first overlap.
        assert 2 * SHARDS - 3 <= n <= 2 * SHARDS + 4, proxy.requests
    finally:
        proxy.stop()


def run_digests(tmp, yaml, env, extra=("--epochs", "2")):
    out = tmp / f"digests-{time.monotonic_ns()}.txt"
    run(["run", str(yaml), "--digests", str(out), *extra], env=env)
    return out


def test_sigkill_mid_epoch_with_a_small_cache_resumes_to_the_uninterrupted_digests(
        tmp_path, local_data, s3):
    want = digest_lines(run_digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                                      local_data / "part-*.bin"), {}))
    yaml = pipeline(tmp_path / "remote.yaml", "s3://bucket/w/part-*.bin")
    ck = tmp_path / "ck"
    out = tmp_path / "killed.txt"
    proxy = FaultProxy(s3.port, rate=1_000_000).start()  # 1 MB/s: about 0.26 s a shard
    try:
        # Mid-epoch 1 (200 steps an epoch): after the checkpoint of step 60.
        env = {**s3.env(proxy.url), **cache_env(tmp_path)}
        sigkill_after_checkpoint(yaml, env, ck, out, 20, 60, 200)
    finally:
        proxy.stop()
    # The resume (no throttle) on the same small cache, partial download and all.
    with PeakSampler(tmp_path / "cache") as sampler:
        run(["run", str(yaml), "--epochs", "2", "--resume", "--checkpoint-dir", str(ck),
             "--digests", str(out)], env={**s3.env(), **cache_env(tmp_path)})
    assert digest_lines(out) == want
    assert sampler.peak <= LIMIT


def test_a_limit_below_the_look_ahead_is_a_config_error_at_build_time(tmp_path, s3):
    yaml = pipeline(tmp_path / "remote.yaml", "s3://bucket/w/part-*.bin", lookahead=3)
    r = run(["run", str(yaml)], env={**s3.env(), **cache_env(tmp_path)}, check=False,
            timeout=30)
    assert r.returncode == 2, r.stderr
    assert "FLOWSTATE_CACHE_LIMIT" in r.stderr and "look-ahead" in r.stderr, r.stderr
    assert "lookahead: 3" in r.stderr, r.stderr
    assert not list((tmp_path / "cache" / "objects").glob("*.obj")), "nothing was downloaded"
    # The same pipeline with the look-ahead the limit holds runs.
    pipeline(yaml, "s3://bucket/w/part-*.bin", lookahead=2)
    run(["run", str(yaml), "--steps", "5"], env={**s3.env(), **cache_env(tmp_path)})


def test_a_look_ahead_that_does_not_fit_beside_another_process_is_a_config_error_until_it_dies(
        tmp_path, s3):
    # Two processes on one cache directory whose limit holds one look-ahead: the first runs
    # (slowly, through a 100 KB/s link), the second is refused at build naming the first; once
    # the first is killed with SIGKILL, the kernel's lock on its reservation goes with it.
    yaml = pipeline(tmp_path / "remote.yaml", "s3://bucket/w/part-*.bin")
    proxy = FaultProxy(s3.port, rate=100_000).start()
    first = subprocess.Popen([cli_path(), "run", str(yaml), "--epochs", "50"],
                             env=clean_env({**s3.env(proxy.url), **cache_env(tmp_path)}),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        held = tmp_path / "cache" / "reservations" / str(first.pid)
        end = time.monotonic() + 30
        while time.monotonic() < end and first.poll() is None and not held.exists():
            time.sleep(0.01)
        assert first.poll() is None and held.exists(), first.stderr.read()
        r = run(["run", str(yaml), "--steps", "5"], env={**s3.env(), **cache_env(tmp_path)},
                check=False, timeout=30)
        assert r.returncode == 2, r.stderr
        assert f"that 1 other process on this machine (pid {first.pid}: {LIMIT} bytes) " \
            "reserve of it) is smaller than the" in r.stderr, r.stderr
        assert "give each process a cache directory of its own" in r.stderr, r.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        proxy.stop()
    run(["run", str(yaml), "--steps", "5"], env={**s3.env(), **cache_env(tmp_path)})
    assert not held.exists()  # the dead process's reservation was removed


def test_an_error_about_a_record_of_a_cached_copy_names_the_url_not_the_cache(tmp_path, s3):
    body = b'{"text": "a"}\n{"text": "b"}\n{"other": 1}\n{"text": "d"}\n'
    s3.client().put_object(Bucket="bucket", Key="j/bad.jsonl", Body=body)
    yaml = tmp_path / "lines.yaml"
    yaml.write_text('seed: 1\nsource: {type: lines, paths: "s3://bucket/j/bad.jsonl", '
                    'format: jsonl, json_fields: [text]}\nnodes:\n'
                    '  - batch: {size: 4, collate: ragged}\n')
    r = run(["run", str(yaml)], env={**s3.env(), **cache_env(tmp_path)}, check=False,
            timeout=30)
    assert r.returncode == 3, r.stderr
    offset = body.index(b'{"other"')
    assert f"'s3://bucket/j/bad.jsonl' line 3 (byte {offset}): key 'text' is missing" \
        in r.stderr, r.stderr
    assert str(tmp_path / "cache") not in r.stderr, r.stderr
