"""`tar` and `lines` sources over URLs read lazily through the look-ahead window (issue 23,
nodes/sources/remote_window.h, remote_listing.h's object facts) against s3rver and nginx on
127.0.0.1: a `tar` source of 10 shards with a cache limit of 3 shards runs two epochs with the
digests of the same pipeline on local files and the cache directory's sampled peak within the
limit; a run killed with SIGKILL mid-epoch resumes to the uninterrupted digests without
reading the shards again to count them; the `https://host/shard-{00000..00009}.tar` brace form
through nginx does the same; a `lines` source likewise; a limit below the window is a
configuration error at build time naming the sizes; two sources over one small cache finish.
Each test starts and stops its own servers; every wait is bounded."""
import time

import pytest

from remote_servers import (FaultProxy, Nginx, PeakSampler, S3Server, digest_lines, run,
                           s3_missing_reason, sigkill_after_checkpoint)

SHARDS = 10
SAMPLES = 10000  # 1000 a shard, about 2 MB a shard
DOCS = 5000  # lines: 500 a shard
LOOKAHEAD = 2


def tar_source(paths, lookahead=LOOKAHEAD):
    return (f'{{type: tar, paths: "{paths}", fields: [tokens, cls], '
            f'lookahead: {lookahead}}}')


def lines_source(paths, lookahead=LOOKAHEAD):
    return f'{{type: lines, paths: "{paths}", lookahead: {lookahead}}}'


def pipeline(path, source, seed=5):
    # A buffer shuffle reads the files in order; samples differ in size: batched ragged.
    path.write_text(f"seed: {seed}\nsource: {source}\n"
                    "nodes:\n  - shuffle: {mode: buffer, size: 50}\n"
                    "  - batch: {size: 50, collate: ragged}\n")
    return path


def limit_of(files, n=LOOKAHEAD + 1):
    """The bytes of the `n` largest files: the look-ahead and one more."""
    return sum(sorted((f.stat().st_size for f in files), reverse=True)[:n])


def cache_env(tmp, limit):
    return {"FLOWSTATE_CACHE_DIR": str(tmp / "cache"), "FLOWSTATE_CACHE_LIMIT": str(limit),
            "FLOWSTATE_REMOTE_BACKOFF": "0.02"}


def run_digests(tmp, yaml, env, extra=("--epochs", "2")):
    out = tmp / f"digests-{time.monotonic_ns()}.txt"
    run(["run", str(yaml), "--digests", str(out), *extra], env=env)
    return digest_lines(out)




def gets(requests):
    return [r for r in requests if r.startswith("GET ") and "list-type" not in r]


def lists(requests):
    return [r for r in requests if "list-type" in r]


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("lazy-data")
    run(["gen", "tar", "--out", str(d / "tar"), "--samples", str(SAMPLES), "--shards",
         str(SHARDS)])
    run(["gen", "lines", "--out", str(d / "lines"), "--docs", str(DOCS), "--shards",
         str(SHARDS)])
    return d


@pytest.fixture
def s3(tmp_path, local_data):
    reason = s3_missing_reason()
    if reason:
        pytest.skip(reason)
    server = S3Server(tmp_path / "s3").start()
    try:
        server.upload_dir(local_data / "tar", "t", "shard-*.tar")
        server.upload_dir(local_data / "lines", "l", "docs-*.txt")
        yield server
    finally:
        server.stop()


def test_tar_of_10_shards_over_s3_with_a_cache_of_3_shards_gives_the_local_digests(
        tmp_path, local_data, s3):
    shards = sorted((local_data / "tar").glob("shard-*.tar"))
    limit = limit_of(shards)
    want = run_digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          tar_source(local_data / "tar/shard-*.tar")), {})
    yaml = pipeline(tmp_path / "remote.yaml", tar_source("s3://bucket/t/shard-*.tar"))
    proxy = FaultProxy(s3.port).start()
    (tmp_path / "cache").mkdir()
    ck = tmp_path / "ck"
    try:
        with PeakSampler(tmp_path / "cache") as sampler:
            got = run_digests(tmp_path, yaml, {**s3.env(proxy.url), **cache_env(tmp_path, limit)},
                              ("--epochs", "2", "--checkpoint-dir", str(ck),
                               "--checkpoint-every", "100"))
        assert got == want
        first = gets(proxy.requests)
        print(f"limit {limit} bytes ({sum(f.stat().st_size for f in shards)} in all), peak "
              f"{sampler.peak} bytes, {len(first)} GETs for {SHARDS} shards counted and 2 epochs")
        assert sampler.peak <= limit
        # Each shard read once to count it, then once an epoch (less what the cache held where
        # the count's last shards and the first epoch's, or two epochs, overlap).
        assert 3 * SHARDS - 6 <= len(first) <= 3 * SHARDS + 6, proxy.requests
        assert len(list((ck / "listings").glob("facts-*.json"))) == 1
        # A resume of the finished run's last checkpoint lists nothing and counts nothing.
        before = len(proxy.requests)
        got = run_digests(tmp_path, yaml, {**s3.env(proxy.url), **cache_env(tmp_path, limit)},
                          ("--epochs", "3", "--resume", "--checkpoint-dir", str(ck)))
        again = proxy.requests[before:]
        assert lists(again) == [], again
        assert len(gets(again)) <= SHARDS + 5, again  # the third epoch's reads alone
    finally:
        proxy.stop()


def test_sigkill_mid_epoch_with_a_small_cache_resumes_to_the_uninterrupted_digests(
        tmp_path, local_data, s3):
    limit = limit_of(sorted((local_data / "tar").glob("shard-*.tar")))
    want = run_digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          tar_source(local_data / "tar/shard-*.tar")), {})
    yaml = pipeline(tmp_path / "remote.yaml", tar_source("s3://bucket/t/shard-*.tar"))
    ck = tmp_path / "ck"
    out = tmp_path / "killed.txt"
    proxy = FaultProxy(s3.port, rate=4_000_000).start()  # 4 MB/s: about 0.5 s a shard
    try:
        # Mid-epoch 1 (200 steps an epoch): after the checkpoint of step 100.
        env = {**s3.env(proxy.url), **cache_env(tmp_path, limit)}
        sigkill_after_checkpoint(yaml, env, ck, out, 20, 100, 200)
    finally:
        proxy.stop()
    # The resume on the same small cache, a partial download and all, through an unthrottled
    # proxy: the listing and the counts are the job's, read from the checkpoint directory.
    proxy = FaultProxy(s3.port).start()
    try:
        with PeakSampler(tmp_path / "cache") as sampler:
            run(["run", str(yaml), "--epochs", "2", "--resume", "--checkpoint-dir", str(ck),
                 "--digests", str(out)], env={**s3.env(proxy.url), **cache_env(tmp_path, limit)})
        assert digest_lines(out) == want
        assert sampler.peak <= limit
        assert lists(proxy.requests) == [], proxy.requests
        # The rest of epoch 1 (at most 5 shards) and epoch 2, and no shard read to count it.
        assert len(gets(proxy.requests)) <= SHARDS + 5 + 4, proxy.requests
    finally:
        proxy.stop()


def test_https_brace_ranges_through_nginx_with_a_cache_of_3_shards(tmp_path, local_data):
    limit = limit_of(sorted((local_data / "tar").glob("shard-*.tar")))
    want = run_digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          tar_source(local_data / "tar/shard-*.tar")), {})
    nginx = Nginx(local_data / "tar", tmp_path / "nginx", tls=True).start()
    (tmp_path / "cache").mkdir()
    try:
        yaml = pipeline(tmp_path / "remote.yaml",
                        tar_source(f"{nginx.url}/shard-{{00000..{SHARDS - 1:05d}}}.tar"))
        with PeakSampler(tmp_path / "cache") as sampler:
            got = run_digests(tmp_path, yaml, {**cache_env(tmp_path, limit),
                                               "AWS_CA_BUNDLE": nginx.ca})
        assert got == want
        assert sampler.peak <= limit
        reqs = [r.split()[1] for r in nginx.requests() if r.startswith("GET ")]
        assert set(reqs) == {f"/shard-{k:05d}.tar" for k in range(SHARDS)}
    finally:
        nginx.stop()


def test_lines_over_s3_with_a_cache_of_3_files_gives_the_local_digests(
        tmp_path, local_data, s3):
    limit = limit_of(sorted((local_data / "lines").glob("docs-*.txt")))
    want = run_digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          lines_source(local_data / "lines/docs-*.txt")), {})
    yaml = pipeline(tmp_path / "remote.yaml", lines_source("s3://bucket/l/docs-*.txt"))
    (tmp_path / "cache").mkdir()
    with PeakSampler(tmp_path / "cache") as sampler:
        got = run_digests(tmp_path, yaml, {**s3.env(), **cache_env(tmp_path, limit)})
    assert got == want
    assert sampler.peak <= limit


def test_a_limit_below_the_window_is_a_config_error_at_build_naming_the_sizes(
        tmp_path, local_data, s3):
    shards = sorted((local_data / "tar").glob("shard-*.tar"))
    limit = limit_of(shards)
    yaml = pipeline(tmp_path / "remote.yaml", tar_source("s3://bucket/t/shard-*.tar", 3))
    r = run(["run", str(yaml)], env={**s3.env(), **cache_env(tmp_path, limit)}, check=False,
            timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"the cache limit {limit} bytes" in r.stderr, r.stderr
    assert f"smaller than the {limit_of(shards, 4)} bytes (" in r.stderr, r.stderr
    assert "of the 4 largest remote objects the look-ahead holds" in r.stderr, r.stderr
    assert "lookahead: 3" in r.stderr and "FLOWSTATE_CACHE_LIMIT" in r.stderr, r.stderr
    assert not list((tmp_path / "cache" / "objects").glob("*.obj")), "nothing was downloaded"


def test_two_sources_over_one_small_cache_finish_with_the_local_digests(
        tmp_path, local_data, s3):
    shards = sorted((local_data / "tar").glob("shard-*.tar"))
    half = SHARDS // 2
    # Each source's look-ahead of 1 file and one more: together the limit (less than the
    # data). Each window counting the whole limit as its own would wait for the other's copies.
    limit = limit_of(shards[:half], 2) + limit_of(shards[half:], 2)

    def mix(name, a, b):
        for tag, paths in (("a", a), ("b", b)):
            (tmp_path / f"{name}-{tag}.yaml").write_text(
                f"seed: 3\nsource: {{type: tar, paths: [{paths}], fields: [tokens, cls], "
                "lookahead: 1}\n")
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"seed: 9\nsource: {{type: mix, inputs: [{name}-a.yaml, {name}-b.yaml], "
                        "weights: [0.5, 0.5], stop: all_exhausted}\n"
                        "nodes:\n  - batch: {size: 50, collate: ragged}\n")
        return path

    local = [str(f) for f in shards]
    remote = [f"s3://bucket/t/{f.name}" for f in shards]
    want = run_digests(tmp_path, mix("local", ", ".join(local[:half]), ", ".join(local[half:])),
                       {}, ("--epochs", "1"))
    yaml = mix("remote", ", ".join(remote[:half]), ", ".join(remote[half:]))
    (tmp_path / "cache").mkdir()
    t = time.monotonic()
    with PeakSampler(tmp_path / "cache") as sampler:
        got = run_digests(tmp_path, yaml, {**s3.env(), **cache_env(tmp_path, limit),
                                           "FLOWSTATE_REMOTE_TIMEOUT": "5"}, ("--epochs", "1"))
    assert got == want
    assert sampler.peak <= limit
    assert time.monotonic() - t < 30
