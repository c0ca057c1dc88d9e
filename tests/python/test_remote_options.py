"""A source's `cache` and `remote` options, the job's cache defaults (`flowstate run
--cache-dir/--cache-limit`, `Loader(cache_dir=, cache_limit=)`) and Python's `checkpoint_dir`
(issue 23), against s3rver on 127.0.0.1 behind the counting proxy (tests/python/
remote_servers.py): two sources with their own cache directories each fill their own, a
per-source endpoint is used over the environment's, Python keyword arguments reach the same
options, and a Python job with a checkpoint_dir lists once, len() included. Each test starts
and stops its own servers."""
import os

import pytest

import flowstate
from remote_servers import FaultProxy, free_port
from test_remote import (RECORD_BYTES, SHARDS, cache_env, digests, lists, local_data,  # noqa: F401
                         pipeline, records_source, run, s3)

PAGES = (SHARDS + 2 + 1) // 2  # 6 keys under data/records/ (test_remote's s3 fixture), 2 a page


def plain(path, source):
    """A pipeline read in order (no shuffle): a cache smaller than the source serves it."""
    path.write_text(f"seed: 3\nsource: {source}\nnodes:\n  - batch: {{size: 64}}\n")
    return path


def objects_in(cache):
    d = cache / "objects"
    return sorted(p.name for p in d.glob("*.obj")) if d.exists() else []


def write_mix(tmp_path, prefix, caches, name):
    """A mix of two records sources, shards 0-1 and 2-3 of `prefix`, with `caches[i]` as
    source i's `cache` option (None: none)."""
    inputs = []
    for i, (part, cache) in enumerate(zip(("0000[01]", "0000[23]"), caches)):
        extra = f", cache: {{dir: '{cache}'}}" if cache else ""
        path = tmp_path / f"{name}_in{i}.yaml"
        path.write_text(f"seed: {i + 1}\nsource: {{type: records, paths: "
                        f"'{prefix}/part-{part}.bin', record_bytes: {RECORD_BYTES}{extra}}}\n"
                        "nodes:\n  - shuffle: {mode: global}\n")
        inputs.append(path.name)
    mix = tmp_path / f"{name}.yaml"
    mix.write_text(f"seed: 9\nsource: {{type: mix, inputs: [{', '.join(inputs)}], "
                   "weights: [1, 1], stop: all_exhausted}\nnodes:\n  - batch: {size: 32}\n")
    return mix


def test_each_source_fills_its_own_cache_dir_and_cache_dir_is_the_jobs_default(
        tmp_path, local_data, s3):
    want = digests(tmp_path, write_mix(tmp_path, local_data / "records", [None, None], "local"))
    a, job, env_dir = tmp_path / "cache-a", tmp_path / "cache-job", tmp_path / "env"
    yaml = write_mix(tmp_path, "s3://bucket/data/records", [a, None], "remote")
    env = {**s3.env(), **cache_env(env_dir)}
    assert digests(tmp_path, yaml, env, ["--cache-dir", str(job)]) == want
    # Source 0's option is over the job's default, which is over FLOWSTATE_CACHE_DIR.
    assert len(objects_in(a)) == 2
    assert len(objects_in(job)) == 2
    assert set(objects_in(a)).isdisjoint(objects_in(job))
    assert objects_in(env_dir / "cache") == []
    # Without --cache-dir the second source uses the environment's directory.
    assert digests(tmp_path, yaml, env) == want
    assert len(objects_in(env_dir / "cache")) == 2
    assert len(objects_in(a)) == 2


def test_cache_limit_from_the_command_line_and_from_a_source_reach_the_cache(
        tmp_path, local_data, s3):
    env = {**s3.env(), **cache_env(tmp_path, limit="1GiB")}
    yaml = pipeline(tmp_path / "r.yaml", records_source("s3://bucket/data/records/part-*.bin"))
    # A shard is 512 KB: a limit of 600 KB cannot hold the look-ahead and one more.
    r = run(["run", str(yaml), "--cache-limit", "600KB"], env=env, check=False)
    assert r.returncode == 2, r.stderr
    assert "raise cache_limit" in r.stderr and "600000 bytes" in r.stderr, r.stderr
    small = pipeline(tmp_path / "s.yaml", records_source(
        "s3://bucket/data/records/part-*.bin")[:-1] + ", cache: {limit: 700KB}}")
    r = run(["run", str(small), "--cache-limit", "10GiB"], env=env, check=False)
    assert r.returncode == 2, r.stderr
    assert "raise records.cache.limit" in r.stderr and "700000 bytes" in r.stderr, r.stderr
    bad = run(["run", str(yaml), "--cache-limit", "lots"], env=env, check=False)
    assert bad.returncode == 2 and "--cache-limit" in bad.stderr, bad.stderr
    # Enough (the look-ahead is 1 file + 1): the run completes under the limit.
    ok = plain(tmp_path / "ok.yaml", records_source(
        "s3://bucket/data/records/part-*.bin")[:-1] + ", lookahead: 1}")
    want = digests(tmp_path, plain(tmp_path / "l.yaml",
                                   records_source(local_data / "records/part-*.bin")))
    assert digests(tmp_path, ok, env, ["--cache-limit", "1200KB"]) == want


def test_a_sources_endpoint_is_used_over_the_environments(tmp_path, local_data, s3):
    proxy = FaultProxy(s3.port).start()
    try:
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        env = {**s3.env(dead), **cache_env(tmp_path), "FLOWSTATE_REMOTE_ATTEMPTS": "2"}
        want = digests(tmp_path, pipeline(tmp_path / "l.yaml",
                                          records_source(local_data / "records/part-*.bin")))
        src = records_source("s3://bucket/data/records/part-*.bin")[:-1]
        yaml = pipeline(tmp_path / "r.yaml", src + f", remote: {{endpoint: '{proxy.url}'}}}}")
        assert digests(tmp_path, yaml, env) == want
        assert len(lists(proxy.requests)) >= 1 and proxy.requests, proxy.requests
        # The environment's endpoint alone: refused connections, retried remote.attempts times.
        plain = pipeline(tmp_path / "p.yaml",
                         src + ", remote: {attempts: 3, backoff: 0.01, timeout: 2}}")
        r = run(["run", str(plain)], env=env, check=False)
        assert r.returncode == 3, r.stderr
        assert "after 3 attempts" in r.stderr, r.stderr
        assert s3.env()["AWS_SECRET_ACCESS_KEY"] not in r.stderr
    finally:
        proxy.stop()


def test_a_resume_may_move_the_cache_and_the_endpoint_and_equals_an_uninterrupted_run(
        tmp_path, local_data, s3):
    """The options are free: a checkpoint written with one cache and endpoint resumes with
    others (set with --set, as a launcher would) to the digests of a run without a stop."""
    proxy = FaultProxy(s3.port).start()
    try:
        want = digests(tmp_path, pipeline(tmp_path / "l.yaml",
                                          records_source(local_data / "records/part-*.bin")))
        first, second = tmp_path / "cache-1", tmp_path / "cache-2"
        yaml = pipeline(tmp_path / "r.yaml", records_source(
            "s3://bucket/data/records/part-*.bin")[:-1] +
            f", cache: {{dir: '{first}'}}, remote: {{endpoint: '{s3.endpoint}'}}}}")
        env = {**s3.env(f"http://127.0.0.1:{free_port()}"), **cache_env(tmp_path / "env")}
        ck, out = tmp_path / "ck", tmp_path / "d.txt"
        run(["run", str(yaml), "--steps", "40", "--checkpoint-dir", str(ck),
             "--checkpoint-every", "10", "--digests", str(out)], env=env)
        assert len(objects_in(first)) == SHARDS and proxy.requests == []
        run(["run", str(yaml), "--resume", "--checkpoint-dir", str(ck), "--digests", str(out),
             "--set", f"source.cache.dir={second}", "--set", f"source.remote.endpoint={proxy.url}"],
            env=env)
        assert out.read_text() == want
        # The saved listing was read (no list request); the objects came through the new
        # endpoint into the new cache.
        assert lists(proxy.requests) == [] and len(objects_in(second)) == SHARDS, proxy.requests
    finally:
        proxy.stop()


def test_validate_schema_and_inspect_show_the_options_and_no_secret(tmp_path, local_data, s3):
    env = {**s3.env(), **cache_env(tmp_path), "AWS_SESSION_TOKEN": "TOKEN-SECRET-XYZ"}
    src = records_source("s3://bucket/data/records/part-*.bin")[:-1]
    yaml = pipeline(tmp_path / "r.yaml", src + f", cache: {{dir: '{tmp_path / 'c'}', "
                    f"limit: 1GiB}}, remote: {{endpoint: '{s3.endpoint}', attempts: 4}}}}")
    shown = run(["validate", str(yaml), "--no-data"], env=env).stdout
    assert f"cache.dir: {tmp_path / 'c'} (free)" in shown, shown
    assert "cache.limit: 1GiB (free)" in shown and "remote.attempts: 4 (free)" in shown, shown
    assert f"remote.endpoint: {s3.endpoint} (free)" in shown, shown
    schema = run(["schema"], env=env).stdout
    assert "remote.endpoint" in schema and "cache.limit" in schema, schema
    ck = tmp_path / "ck"
    run(["run", str(yaml), "--steps", "5", "--checkpoint-dir", str(ck)], env=env)
    inspected = run(["inspect", str(ck)], env=env).stdout
    saved = "".join(p.read_text(errors="replace") for p in ck.rglob("*") if p.is_file())
    for secret in (s3.env()["AWS_SECRET_ACCESS_KEY"], s3.env()["AWS_ACCESS_KEY_ID"],
                   "TOKEN-SECRET-XYZ"):
        assert secret not in shown and secret not in inspected and secret not in saved, secret
    # Free options: where the bytes come from is not the pipeline's identity.
    bare = pipeline(tmp_path / "bare.yaml", records_source("s3://bucket/data/records/part-*.bin"))
    fp = [line for line in shown.splitlines() if line.startswith("fingerprint:")]
    assert fp and fp == [line for line in run(["validate", str(bare), "--no-data"],
                                              env=env).stdout.splitlines()
                         if line.startswith("fingerprint:")]


@pytest.fixture
def s3_env(s3, monkeypatch, tmp_path):
    """The in-process environment of a Python job reading s3rver (keys only: the endpoint is
    the source's option)."""
    for k, v in s3.env(f"http://127.0.0.1:{free_port()}").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FLOWSTATE_CACHE_DIR", str(tmp_path / "env-cache"))
    monkeypatch.setenv("FLOWSTATE_S3_PAGE_KEYS", "2")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return s3


def batches(loader):
    return [b["data"].numpy().tobytes() for b in loader]


def test_python_kwargs_and_checkpoint_dir_list_once_len_included(tmp_path, local_data, s3_env):
    proxy = FaultProxy(s3_env.port).start()
    try:
        def source():
            return flowstate.records(paths="s3://bucket/data/records/part-*.bin",
                                     record_bytes=RECORD_BYTES,
                                     cache={"dir": str(tmp_path / "py-cache")},
                                     remote={"endpoint": proxy.url, "attempts": 3})
        want = batches(flowstate.Loader(
            flowstate.records(paths=str(local_data / "records/part-*.bin"),
                              record_bytes=RECORD_BYTES).shuffle(mode="global").batch(size=64),
            epochs=1))
        pipe = source().shuffle(mode="global").batch(size=64).build()
        assert "cache.dir" in pipe.describe() and "remote.attempts: 3 (free)" in pipe.describe()
        # Without a checkpoint_dir: the Loader lists, and len()'s probe lists again.
        before = len(proxy.requests)
        loader = flowstate.Loader(pipe, epochs=1)
        assert len(loader) == len(want)
        assert len(lists(proxy.requests[before:])) == 2 * PAGES
        loader.close()
        # With one: listed once for the job -- the Loader, len(), a second Loader on it.
        ck = tmp_path / "ck"
        before = len(proxy.requests)
        loader = flowstate.Loader(pipe, epochs=1, checkpoint_dir=ck)
        assert len(loader) == len(want)
        assert batches(loader) == want
        loader.close()
        again = flowstate.Loader(pipe, epochs=1, checkpoint_dir=ck)
        assert len(again) == len(want)
        again.close()
        assert len(lists(proxy.requests[before:])) == PAGES, proxy.requests[before:]
        assert len(list((ck / "listings").glob("*.json"))) == 1
        assert len(objects_in(tmp_path / "py-cache")) == SHARDS
        assert objects_in(tmp_path / "env-cache") == []
    finally:
        proxy.stop()


def test_python_loader_cache_dir_and_cache_limit_are_the_jobs_defaults(
        tmp_path, local_data, s3_env):
    pipe = flowstate.records(paths="s3://bucket/data/records/part-*.bin",
                             record_bytes=RECORD_BYTES,
                             remote={"endpoint": s3_env.endpoint}).batch(size=64).build()
    want = batches(flowstate.Loader(
        flowstate.records(paths=str(local_data / "records/part-*.bin"),
                          record_bytes=RECORD_BYTES).batch(size=64), epochs=1))
    job = tmp_path / "job-cache"
    assert batches(flowstate.Loader(pipe, epochs=1, cache_dir=job, cache_limit="1GiB")) == want
    assert len(objects_in(job)) == SHARDS
    assert objects_in(tmp_path / "env-cache") == []
    with pytest.raises(flowstate.ConfigError, match="cache_limit"):
        flowstate.Loader(pipe, epochs=1, cache_dir=job, cache_limit=1000)
    with pytest.raises(flowstate.ConfigError, match="byte size"):
        flowstate.Loader(pipe, epochs=1, cache_limit="lots")
    with pytest.raises(flowstate.ConfigError, match="unknown parameter 'dri'"):
        flowstate.records(paths="s3://bucket/x.bin", record_bytes=8,
                          cache={"dri": "x"}).batch(size=1).build()
