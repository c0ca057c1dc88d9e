"""A warm job that reuses a listing (issue 23, nodes/sources/remote_listing.h): with
FLOWSTATE_LISTING_MAX_AGE (or a source's `remote.listing_max_age`) a job reads the listing the
cache directory saved no longer ago than that instead of listing, and over a warm cache sends
no request at all — with the digests of the same pipeline on local files, for `records` and
`indexed` (whose .idx and .bin are two listings). Off by default: every job lists. An expired
or unreadable saved listing is listed again. The rule for an object changed since: a copy the
cache holds is the listed version (the snapshot is read whole), and one it does not hold is
downloaded with If-Match on the listed ETag — refused naming the object, never mixed; with
the reuse off, the job lists and reads the new version. Real s3rver behind the fault proxy
(tests/python/remote_servers.py), whose log counts the requests."""
import os
import shutil
import time

import pytest

from remote_servers import FaultProxy, S3Server, S3_SECRET, run, s3_missing_reason

RECORD_BYTES = 4096
SHARDS = 4
RECORDS_PER_SHARD = 64
DOCS = 1000


def records_yaml(path, paths, extra=""):
    path.write_text(
        f"seed: 3\nsource: {{type: records, paths: \"{paths}\", record_bytes: {RECORD_BYTES}"
        f"{extra}}}\nnodes:\n  - shuffle: {{mode: global}}\n  - batch: {{size: 16}}\n")
    return path


def indexed_yaml(path, paths):
    path.write_text(
        f"seed: 7\nsource: {{type: indexed, paths: \"{paths}\", field: tokens}}\n"
        "nodes:\n  - shuffle: {mode: global}\n  - pack: {length: 256, separator: 0}\n"
        "  - batch: {size: 8}\n")
    return path


def digests(tmp, yaml, env=None):
    out = tmp / f"digests-{time.monotonic_ns()}.txt"
    run(["run", str(yaml), "--digests", str(out)], env=env)
    return out.read_text()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("warm-data")
    run(["gen", "records", "--out", str(d / "records"), "--records",
         str(SHARDS * RECORDS_PER_SHARD), "--record-bytes", str(RECORD_BYTES), "--shards",
         str(SHARDS)])
    (d / "ix").mkdir()
    run(["gen", "indexed", "--out", str(d / "ix/corpus"), "--docs", str(DOCS)])
    return d


@pytest.fixture
def store(tmp_path, data):
    reason = s3_missing_reason()
    if reason:
        pytest.skip(reason)
    server = S3Server(tmp_path / "s3").start()
    proxy = None
    try:
        server.upload_dir(data / "records", "rec", "part-*.bin")
        server.upload_dir(data / "ix", "ix", "corpus.*")
        proxy = FaultProxy(server.port).start()
        yield server, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()


def counts(proxy, since):
    seen = proxy.requests[since:]
    lists = sum("list-type=2" in r for r in seen)
    return lists, len(seen) - lists


def requests_of_run(tmp, yaml, env, proxy, want):
    """Runs `yaml` with `env`, checks its digests are `want`; the (list, GET) requests it made."""
    start = len(proxy.requests)
    assert digests(tmp, yaml, env) == want
    return counts(proxy, start)


def env_of(tmp, server, proxy, **more):
    return {**server.env(proxy.url), "FLOWSTATE_CACHE_DIR": tmp / "cache", **more}


def test_a_reused_listing_over_a_warm_cache_sends_no_request(tmp_path, data, store):
    server, proxy = store
    want = digests(tmp_path, records_yaml(tmp_path / "local.yaml", data / "records/part-*.bin"))
    yaml = records_yaml(tmp_path / "s3.yaml", "s3://bucket/rec/part-*.bin")
    reuse = env_of(tmp_path, server, proxy, FLOWSTATE_LISTING_MAX_AGE=600)
    lists, gets = requests_of_run(tmp_path, yaml, reuse, proxy, want)
    assert lists == 1 and gets >= SHARDS, (lists, gets)  # listed, saved, downloaded
    saved = list((tmp_path / "cache/listings").glob("*.json"))
    assert len(saved) == 1, saved
    text = saved[0].read_text()
    assert "s3://bucket/rec/part-" in text and S3_SECRET not in text and "127.0.0.1" not in text
    # No listing, no GET: nothing reaches the store.
    assert requests_of_run(tmp_path, yaml, reuse, proxy, want) == (0, 0)
    # The option in the pipeline does what the variable does.
    opt = records_yaml(tmp_path / "opt.yaml", "s3://bucket/rec/part-*.bin",
                       ", remote: {listing_max_age: 600}")
    assert requests_of_run(tmp_path, opt, env_of(tmp_path, server, proxy), proxy, want) == (0, 0)
    # Off (the default): the job lists, and the warm cache serves the bytes.
    assert requests_of_run(tmp_path, yaml, env_of(tmp_path, server, proxy), proxy, want) == (1, 0)
    # Another endpoint (the store directly) is another listing: listed, not read from the proxy's.
    start_direct = len(list((tmp_path / "cache/listings").glob("*.json")))
    assert digests(tmp_path, yaml, {**reuse, **server.env()}) == want
    assert len(list((tmp_path / "cache/listings").glob("*.json"))) == start_direct + 1


def test_indexed_reuses_both_listings(tmp_path, data, store):
    server, proxy = store
    want = digests(tmp_path, indexed_yaml(tmp_path / "local.yaml", data / "ix/corpus.idx"))
    yaml = indexed_yaml(tmp_path / "s3.yaml", "s3://bucket/ix/corpus")
    reuse = env_of(tmp_path, server, proxy, FLOWSTATE_LISTING_MAX_AGE=600)
    lists, _ = requests_of_run(tmp_path, yaml, reuse, proxy, want)
    assert lists == 2  # the .idx and the .bin patterns
    assert requests_of_run(tmp_path, yaml, reuse, proxy, want) == (0, 0)


def test_an_expired_or_unreadable_saved_listing_is_listed_again(tmp_path, data, store):
    server, proxy = store
    want = digests(tmp_path, records_yaml(tmp_path / "local.yaml", data / "records/part-*.bin"))
    yaml = records_yaml(tmp_path / "s3.yaml", "s3://bucket/rec/part-*.bin")
    reuse = env_of(tmp_path, server, proxy, FLOWSTATE_LISTING_MAX_AGE=60)
    assert digests(tmp_path, yaml, reuse) == want
    (saved,) = (tmp_path / "cache/listings").glob("*.json")
    old = time.time() - 120
    os.utime(saved, (old, old))  # two minutes old: past the 60 s
    assert requests_of_run(tmp_path, yaml, reuse, proxy, want) == (1, 0)
    assert saved.stat().st_mtime > old + 60  # saved again
    saved.write_text('{"format": 1, "pattern": "s3://bucket/rec/part-*.b')  # cut short
    assert requests_of_run(tmp_path, yaml, reuse, proxy, want) == (1, 0)
    assert saved.read_text().endswith("}\n")  # replaced whole
    bad = run(["run", str(yaml)], env={**reuse, "FLOWSTATE_LISTING_MAX_AGE": "-1"}, check=False)
    assert bad.returncode == 2 and "FLOWSTATE_LISTING_MAX_AGE" in bad.stderr, bad.stderr


def test_an_object_changed_since_the_reused_listing_is_never_mixed_in(tmp_path, data, store):
    server, proxy = store
    yaml = records_yaml(tmp_path / "s3.yaml", "s3://bucket/rec/part-*.bin")
    old_want = digests(tmp_path, records_yaml(tmp_path / "old.yaml",
                                              data / "records/part-*.bin"))
    reuse = env_of(tmp_path, server, proxy, FLOWSTATE_LISTING_MAX_AGE=600)
    assert digests(tmp_path, yaml, reuse) == old_want
    # The store's first shard is replaced by other bytes of the same size (another ETag).
    new = tmp_path / "new"
    shutil.copytree(data / "records", new, ignore=shutil.ignore_patterns("*.fsidx"))
    first = sorted(new.glob("part-*.bin"))[0]
    first.write_bytes(bytes(b ^ 0x5A for b in first.read_bytes()))
    server.client().upload_file(str(first), server.bucket, f"rec/{first.name}")
    new_want = digests(tmp_path, records_yaml(tmp_path / "new.yaml", new / "part-*.bin"))
    assert new_want != old_want
    # Cached whole, the snapshot the listing names is read: the old version, consistently.
    assert digests(tmp_path, yaml, reuse) == old_want
    # Its copies gone, the old version cannot be read: the download is refused, naming it.
    shutil.rmtree(tmp_path / "cache/objects")
    r = run(["run", str(yaml)], env=reuse, check=False)
    assert r.returncode == 3, r.stderr
    assert f"s3://bucket/rec/{first.name}" in r.stderr and "changed on the server" in r.stderr
    assert S3_SECRET not in r.stderr
    # Without the reuse the job lists: the new version, whole.
    assert digests(tmp_path, yaml, env_of(tmp_path, server, proxy)) == new_want
