"""Remote sources against real servers on 127.0.0.1 (tests/python/remote_servers.py): an
`s3://` pipeline on s3rver and an `https://...{a..b}` pipeline on nginx give the digests of
the same pipeline on local files — through the fault proxy's resets, 503/429 answers and
stalls, a SIGKILL mid-download, a server restart mid-download and a checkpoint resume — and
the cache's limit holds (its directory's peak size, sampled). Each test starts and stops its
own servers; every wait is bounded."""
import os
import signal
import subprocess
import threading
import time

import pytest

from remote_servers import FaultProxy, Nginx, S3Server, cli_path, dir_bytes, run, s3_missing_reason

RECORD_BYTES = 256
RECORDS = 8000  # 4 shards of 512 KB
SHARDS = 4


def pipeline(path, source, seed=11):
    # tar samples differ in size: batched ragged.
    batch = "{size: 64, collate: ragged}" if "type: tar" in source else "{size: 64}"
    path.write_text(f"seed: {seed}\nsource: {source}\n"
                    f"nodes:\n  - shuffle: {{mode: global}}\n  - batch: {batch}\n")
    return path


def digests(tmp, yaml, env=None, extra=()):
    out = tmp / f"digests-{time.monotonic_ns()}.txt"
    run(["run", str(yaml), "--digests", str(out), *extra], env=env)
    return out.read_text()


def records_source(paths):
    return f'{{type: records, paths: "{paths}", record_bytes: {RECORD_BYTES}}}'


def tar_source(paths):
    return f'{{type: tar, paths: "{paths}", fields: [tokens, cls]}}'


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote-data")
    run(["gen", "records", "--out", str(d / "records"), "--records", str(RECORDS),
         "--record-bytes", str(RECORD_BYTES), "--shards", str(SHARDS)])
    run(["gen", "tar", "--out", str(d / "tar"), "--samples", "600", "--shards", str(SHARDS)])
    return d


@pytest.fixture
def s3(tmp_path, local_data):
    reason = s3_missing_reason()
    if reason:
        pytest.skip(reason)
    server = S3Server(tmp_path / "s3").start()
    try:
        server.upload_dir(local_data / "records", "data/records", "part-*.bin")
        server.upload_dir(local_data / "tar", "data/tar", "shard-*.tar")
        # Keys under the prefix that the glob does not match: another name, a "subdirectory".
        server.client().put_object(Bucket="bucket", Key="data/records/part-README",
                                   Body=b"not data")
        server.client().put_object(Bucket="bucket", Key="data/records/part-old/part-9.bin",
                                   Body=b"x" * RECORD_BYTES)
        yield server
    finally:
        server.stop()


def cache_env(tmp, limit=None, **more):
    e = {"FLOWSTATE_CACHE_DIR": str(tmp / "cache"), "FLOWSTATE_REMOTE_BACKOFF": "0.02"}
    if limit is not None:
        e["FLOWSTATE_CACHE_LIMIT"] = str(limit)
    e.update({k: str(v) for k, v in more.items()})
    return e


def gets(requests):
    return [r for r in requests if r.startswith("GET ") and "list-type=2" not in r]


def lists(requests):
    return [r for r in requests if "list-type=2" in r]


def test_s3_records_and_tar_give_the_local_digests_and_a_second_run_reads_the_cache(
        tmp_path, local_data, s3):
    proxy = FaultProxy(s3.port).start()
    try:
        env = {**s3.env(proxy.url), **cache_env(tmp_path), "FLOWSTATE_S3_PAGE_KEYS": "2"}
        for source, local, remote, keys in [
                (records_source, local_data / "records/part-*.bin",
                 "s3://bucket/data/records/part-*.bin", SHARDS + 2),
                (tar_source, local_data / "tar/shard-*.tar", "s3://bucket/data/tar/shard-*.tar",
                 SHARDS)]:
            want = digests(tmp_path, pipeline(tmp_path / "local.yaml", source(local)))
            yaml = pipeline(tmp_path / "remote.yaml", source(remote))
            before = len(proxy.requests)
            assert digests(tmp_path, yaml, env) == want
            first = proxy.requests[before:]
            # Listed once, page by page (2 keys a page), each matching object fetched once.
            assert len(gets(first)) == SHARDS, first
            assert len(lists(first)) == (keys + 1) // 2, first
            before = len(proxy.requests)
            assert digests(tmp_path, yaml, env) == want
            assert gets(proxy.requests[before:]) == [], "a warm cache downloads nothing"
    finally:
        proxy.stop()


def test_https_brace_ranges_through_nginx_give_the_local_digests(tmp_path, local_data):
    nginx = Nginx(local_data / "tar", tmp_path / "nginx", tls=True).start()
    try:
        want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          tar_source(local_data / "tar/shard-*.tar")))
        yaml = pipeline(tmp_path / "remote.yaml",
                        tar_source(f"{nginx.url}/shard-{{00000..00003}}.tar"))
        env = {**cache_env(tmp_path), "AWS_CA_BUNDLE": nginx.ca}
        assert digests(tmp_path, yaml, env) == want
        reqs = nginx.requests()
        assert sorted(r.split()[1] for r in reqs if r.startswith("GET ")) == [
            f"/shard-{k:05d}.tar" for k in range(SHARDS)]
        # Without the certificate the server is not trusted: a data error naming the URL.
        r = run(["run", str(yaml)], env=cache_env(tmp_path / "other"), check=False)
        assert r.returncode == 3, r.stderr
        assert f"{nginx.url}/shard-0000" in r.stderr
    finally:
        nginx.stop()


def test_http_range_resume_after_cuts_through_nginx(tmp_path, local_data):
    nginx = Nginx(local_data / "records", tmp_path / "nginx").start()
    # The 4 HEADs pass; the first GET is cut twice.
    proxy = FaultProxy(nginx.port, faults=[("pass", 0)] * SHARDS +
                       [("reset", 70_000), ("reset", 200_000)]).start()
    try:
        want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          records_source(local_data / "records/part-*.bin")))
        yaml = pipeline(tmp_path / "remote.yaml",
                        records_source(f"{proxy.url}/part-{{00000..00003}}.bin"))
        assert digests(tmp_path, yaml, {**cache_env(tmp_path),
                                        "FLOWSTATE_REMOTE_CONNECTIONS": "1"}) == want
        log = (nginx.work / "access.log").read_text().splitlines()
        assert len(log) == SHARDS * 2 + 2, log  # a HEAD and a GET each, and two resumed GETs
    finally:
        proxy.stop()
        nginx.stop()


def test_faults_503_429_resets_stalls_are_retried_and_change_nothing(tmp_path, local_data, s3):
    faults = [("status", 503), ("status", 429), ("close", 0), ("stall", 3), ("reset", 300),
              ("status", 503), ("reset", 300_000), ("status", 500), ("reset", 5)]
    proxy = FaultProxy(s3.port, faults=faults).start()
    try:
        want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          records_source(local_data / "records/part-*.bin")))
        yaml = pipeline(tmp_path / "remote.yaml",
                        records_source("s3://bucket/data/records/part-*.bin"))
        env = {**s3.env(proxy.url), **cache_env(tmp_path), "FLOWSTATE_REMOTE_TIMEOUT": "1",
               "FLOWSTATE_REMOTE_CONNECTIONS": "2", "FLOWSTATE_REMOTE_ATTEMPTS": "12"}
        t = time.monotonic()
        assert digests(tmp_path, yaml, env) == want
        assert time.monotonic() - t < 60
        # Every fault cost a connection; a resumed GET may finish inside a later fault's
        # byte allowance, so the count is at least the faults plus the list.
        assert proxy.connections >= len(faults) + 1
        assert not proxy.faults, "every fault was met"
    finally:
        proxy.stop()


def test_an_error_after_the_retries_names_url_status_and_attempts_and_no_secret(
        tmp_path, s3):
    proxy = FaultProxy(s3.port, always=("status", 503)).start()
    try:
        yaml = pipeline(tmp_path / "remote.yaml",
                        records_source("s3://bucket/data/records/part-*.bin"))
        env = {**s3.env(proxy.url), **cache_env(tmp_path), "FLOWSTATE_REMOTE_ATTEMPTS": "3",
               "AWS_SESSION_TOKEN": "TOKEN-SECRET-XYZ"}
        r = run(["run", str(yaml)], env=env, check=False)
        assert r.returncode == 3, r.stderr
        assert "cannot list 's3://bucket/data/records/part-'" in r.stderr, r.stderr
        assert "HTTP 503 (after 3 attempts)" in r.stderr, r.stderr
        assert proxy.connections == 3
        for secret in ("TOKEN-SECRET-XYZ", "Signature=", "Credential="):
            assert secret not in r.stderr + r.stdout
    finally:
        proxy.stop()
    # A glob that matches nothing, and a bucket that does not exist.
    for pattern, message in [("s3://bucket/data/records/nothing-*.bin", "no object matches"),
                             ("s3://no-such-bucket/x/*.bin", "HTTP 404")]:
        yaml = pipeline(tmp_path / "bad.yaml", records_source(pattern))
        r = run(["run", str(yaml)], env={**s3.env(), **cache_env(tmp_path)}, check=False)
        assert r.returncode == 3 and message in r.stderr, r.stderr


def wait_for(pred, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def partials(cache):
    return list((cache / "partial").glob("*.part")) if (cache / "partial").exists() else []


def started(cache):
    def check():
        for f in partials(cache):
            try:
                if f.stat().st_size > 0:
                    return True
            except FileNotFoundError:
                pass
        return False
    return check


def test_sigkill_mid_download_leaves_no_partial_copy_and_the_rerun_equals_local(
        tmp_path, local_data, s3):
    want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                      records_source(local_data / "records/part-*.bin")))
    yaml = pipeline(tmp_path / "remote.yaml",
                    records_source("s3://bucket/data/records/part-*.bin"))
    sizes = {f.stat().st_size for f in (local_data / "records").glob("part-*.bin")}
    proxy = FaultProxy(s3.port, rate=1_000_000).start()  # 1 MB/s: 2 s for the 4 shards
    env = {**os.environ, **s3.env(proxy.url), **cache_env(tmp_path),
           "FLOWSTATE_REMOTE_CONNECTIONS": "2"}
    cache = tmp_path / "cache"
    try:
        p = subprocess.Popen([cli_path(), "run", str(yaml)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(started(cache))
        time.sleep(0.3)  # some bytes in
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        assert partials(cache), "killed mid-download"
        # Every copy counted whole is whole; the killed download is a partial file only.
        copies = list((cache / "objects").glob("*.obj"))
        for obj in copies:
            assert obj.stat().st_size in sizes
        assert len(copies) < SHARDS
    finally:
        proxy.stop()
    # The rerun (no throttle) removes the dead writer's partial file and reads the same data.
    assert digests(tmp_path, yaml, {**s3.env(), **cache_env(tmp_path)}) == want
    assert not partials(cache)


def test_checkpoint_resume_on_s3_equals_an_uninterrupted_run(
        tmp_path, local_data, s3):
    yaml = pipeline(tmp_path / "remote.yaml",
                    records_source("s3://bucket/data/records/part-*.bin"))
    env = {**s3.env(), **cache_env(tmp_path)}
    whole = digests(tmp_path, yaml, env)
    ck = tmp_path / "ck"
    first = tmp_path / "first.txt"
    run(["run", str(yaml), "--steps", "50", "--checkpoint-dir", str(ck), "--checkpoint-every",
         "10", "--digests", str(first)], env=env)
    # A fresh cache: the resume downloads again, and the checkpoint names objects, not copies.
    env2 = {**s3.env(), **cache_env(tmp_path / "fresh")}
    run(["run", str(yaml), "--resume", "--checkpoint-dir", str(ck), "--digests", str(first)],
        env=env2)
    assert first.read_text() == whole
    # A changed object: test_a_resume_reads_the_listed_versions_and_a_changed_object_is_...


def test_a_server_restart_mid_download_is_retried(tmp_path, local_data, s3):
    want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                      records_source(local_data / "records/part-*.bin")))
    yaml = pipeline(tmp_path / "remote.yaml",
                    records_source("s3://bucket/data/records/part-*.bin"))
    proxy = FaultProxy(s3.port, rate=1_000_000).start()
    env = {**os.environ, **s3.env(proxy.url), **cache_env(tmp_path),
           "FLOWSTATE_REMOTE_ATTEMPTS": "20", "FLOWSTATE_REMOTE_BACKOFF": "0.1",
           "FLOWSTATE_REMOTE_TIMEOUT": "2"}
    try:
        out = tmp_path / "d.txt"
        p = subprocess.Popen([cli_path(), "run", str(yaml), "--digests", str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wait_for(started(tmp_path / "cache"))
        s3.stop()
        time.sleep(1.5)
        s3.start()
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.read_text() == want
    finally:
        proxy.stop()



def test_the_cache_limit_holds_and_a_too_small_limit_is_a_config_error(
        tmp_path, local_data, s3):
    c = s3.client()
    shard = RECORDS // SHARDS * RECORD_BYTES  # 512 KB
    for f in sorted((local_data / "records").glob("part-*.bin")):
        c.upload_file(str(f), "bucket", f"other/{f.name}")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "my-notes.txt").write_text("not a cached copy")
    foreign = len("not a cached copy")
    limit = 6 * shard  # one data set (4 shards) fits, not two
    env = {**s3.env(), **cache_env(tmp_path, limit=limit)}
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], dir_bytes(cache) - foreign)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for prefix in ["data/records", "other", "data/records", "other"]:
            yaml = pipeline(tmp_path / "remote.yaml",
                            records_source(f"s3://bucket/{prefix}/part-*.bin"))
            digests(tmp_path, yaml, env)
    finally:
        stop.set()
        sampler.join()
    print(f"cache limit {limit} bytes, peak {peak[0]} bytes")
    assert peak[0] <= limit  # the lock file is empty
    assert peak[0] >= 4 * shard  # it was used
    assert (cache / "my-notes.txt").read_text() == "not a cached copy"
    # A limit below one source's objects: a configuration error at build time, exit 2.
    r = run(["run", str(tmp_path / "remote.yaml")],
            env={**s3.env(), **cache_env(tmp_path, limit="1MiB")}, check=False)
    assert r.returncode == 2, r.stderr
    assert "FLOWSTATE_CACHE_LIMIT" in r.stderr and "is smaller than" in r.stderr


def listing_files(ck):
    return sorted((ck / "listings").glob("*.json")) if (ck / "listings").exists() else []


def test_a_job_lists_once_and_a_resume_reads_the_listing_saved_beside_the_checkpoints(
        tmp_path, local_data, s3):
    """Lists per job = the pages of one listing: a resume (warm or cold cache) lists nothing;
    the saved listing holds no secret; --data-changed continue lists again."""
    proxy = FaultProxy(s3.port).start()
    try:
        yaml = pipeline(tmp_path / "remote.yaml",
                        records_source("s3://bucket/data/records/part-*.bin"))
        env = {**s3.env(proxy.url), **cache_env(tmp_path), "FLOWSTATE_S3_PAGE_KEYS": "2",
               "AWS_SESSION_TOKEN": "TOKEN-SECRET-XYZ"}
        pages = (SHARDS + 2 + 1) // 2  # 6 keys under the prefix, 2 a page
        whole = digests(tmp_path, yaml, env)
        ck = tmp_path / "ck"
        out = tmp_path / "d.txt"
        before = len(proxy.requests)
        run(["run", str(yaml), "--steps", "40", "--checkpoint-dir", str(ck),
             "--checkpoint-every", "10", "--digests", str(out)], env=env)
        assert len(lists(proxy.requests[before:])) == pages
        [saved] = listing_files(ck)
        text = saved.read_text()
        assert "s3://bucket/data/records/part-00001.bin" in text
        for secret in ("TOKEN-SECRET-XYZ", "127.0.0.1", s3.env()["AWS_SECRET_ACCESS_KEY"]):
            assert secret not in text, secret
        # The resume reads the saved listing: no list request, warm cache: no GET either.
        before = len(proxy.requests)
        run(["run", str(yaml), "--resume", "--steps", "80", "--checkpoint-dir", str(ck),
             "--checkpoint-every", "10", "--digests", str(out)], env=env)
        assert proxy.requests[before:] == [], proxy.requests[before:]
        # A cold cache: the objects are fetched, still not listed.
        before = len(proxy.requests)
        run(["run", str(yaml), "--resume", "--checkpoint-dir", str(ck), "--digests", str(out)],
            env={**env, **cache_env(tmp_path / "cold")})
        assert lists(proxy.requests[before:]) == []
        assert len(gets(proxy.requests[before:])) == SHARDS
        assert out.read_text() == whole
        # --data-changed continue lists afresh (and saves what it listed).
        before = len(proxy.requests)
        run(["run", str(yaml), "--resume", "--data-changed", "continue", "--checkpoint-dir",
             str(ck)], env=env)
        assert len(lists(proxy.requests[before:])) == pages
        # --overwrite starts the job afresh: the saved listing goes with the checkpoints.
        before = len(proxy.requests)
        run(["run", str(yaml), "--steps", "10", "--overwrite", "--checkpoint-dir", str(ck)],
            env=env)
        assert len(lists(proxy.requests[before:])) == pages
    finally:
        proxy.stop()


def test_a_resume_reads_the_listed_versions_and_a_changed_object_is_refused_naming_it(
        tmp_path, local_data, s3):
    """The job's data is what it listed: a resume on a changed bucket reads the versions it
    listed (cached) exactly, refuses to download a version the server no longer has, and with
    --data-changed continue (which lists again) refuses the changed object by its ETag —
    leaving the saved listing as it was."""
    want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                      records_source(local_data / "records/part-*.bin")))
    yaml = pipeline(tmp_path / "remote.yaml",
                    records_source("s3://bucket/data/records/part-*.bin"))
    env = {**s3.env(), **cache_env(tmp_path)}
    ck = tmp_path / "ck"
    out = tmp_path / "d.txt"
    run(["run", str(yaml), "--steps", "20", "--checkpoint-dir", str(ck), "--checkpoint-every",
         "10", "--digests", str(out)], env=env)
    [saved] = listing_files(ck)
    listed = saved.read_text()
    s3.client().put_object(Bucket="bucket", Key="data/records/part-00001.bin",
                           Body=b"\x07" * (RECORDS // SHARDS * RECORD_BYTES))
    # A cold cache: the listed version is gone from the server.
    r = run(["run", str(yaml), "--resume", "--checkpoint-dir", str(ck)],
            env={**env, **cache_env(tmp_path / "cold")}, check=False)
    assert r.returncode == 3, r.stderr
    assert "'s3://bucket/data/records/part-00001.bin' changed on the server" in r.stderr
    # Listing again: the object's ETag is not the checkpoint's.
    r = run(["run", str(yaml), "--resume", "--data-changed", "continue", "--checkpoint-dir",
             str(ck)], env=env, check=False)
    assert r.returncode == 4, r.stderr
    assert "s3://bucket/data/records/part-00001.bin: the object changed (ETag" in r.stderr, \
        r.stderr
    assert saved.read_text() == listed, "a refused restore keeps the job's listing"
    # The warm cache holds the listed versions: the resume reads them, exactly.
    run(["run", str(yaml), "--resume", "--checkpoint-dir", str(ck), "--digests", str(out)],
        env=env)
    assert out.read_text() == want


def test_under_mpirun_rank_zero_lists_once_for_every_rank(tmp_path, local_data, s3):
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed")
    proxy = FaultProxy(s3.port).start()
    try:
        yaml = tmp_path / "remote.yaml"
        yaml.write_text("seed: 3\nsource: " +
                        records_source("s3://bucket/data/records/part-*.bin") +
                        "\nnodes:\n  - shard: {}\n  - shuffle: {mode: global}\n"
                        "  - batch: {size: 64}\n")
        env = {**os.environ, **s3.env(proxy.url), **cache_env(tmp_path),
               "FLOWSTATE_S3_PAGE_KEYS": "2", "OMPI_ALLOW_RUN_AS_ROOT": "1",
               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
            env.pop(k, None)
        ck = tmp_path / "ck"
        pages = (SHARDS + 2 + 1) // 2
        for extra in ([], ["--resume"]):
            before = len(proxy.requests)
            r = subprocess.run([mpirun, "--oversubscribe", "-np", "3", cli_path(), "run",
                                str(yaml), "--checkpoint-dir", str(ck), "--checkpoint-every",
                                "5", "--steps", "20", "--digests",
                                str(tmp_path / "d-{rank}.txt"), *extra],
                               env=env, capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            seen = lists(proxy.requests[before:])
            # One listing for the job (3 ranks), none on the resume.
            assert len(seen) == (0 if extra else pages), seen
        for k in range(3):
            assert (tmp_path / f"d-{k}.txt").read_text()
    finally:
        proxy.stop()


def test_the_request_rate_bound_spaces_every_request_of_the_process(tmp_path, local_data, s3):
    """FLOWSTATE_REMOTE_RATE=4: the list pages and the GETs of 2 connections arrive at the
    server at least 1/4 s apart (the proxy's clock), and the data is the same."""
    proxy = FaultProxy(s3.port).start()
    try:
        want = digests(tmp_path, pipeline(tmp_path / "local.yaml",
                                          records_source(local_data / "records/part-*.bin")))
        yaml = pipeline(tmp_path / "remote.yaml",
                        records_source("s3://bucket/data/records/part-*.bin"))
        rate = 4.0
        env = {**s3.env(proxy.url), **cache_env(tmp_path), "FLOWSTATE_S3_PAGE_KEYS": "2",
               "FLOWSTATE_REMOTE_CONNECTIONS": "2", "FLOWSTATE_REMOTE_RATE": str(rate)}
        assert digests(tmp_path, yaml, env) == want
        times = sorted(proxy.times)
        assert len(times) == (SHARDS + 2 + 1) // 2 + SHARDS, proxy.requests
        gaps = [b - a for a, b in zip(times, times[1:])]
        print(f"rate {rate}/s: {len(times)} requests over {times[-1] - times[0]:.2f} s, "
              f"smallest gap {min(gaps):.3f} s")
        # The process starts them 1/rate apart; the proxy sees each a little later (connect,
        # scheduling on a loaded machine: up to 0.15 s allowed). Unbounded, the GETs of the 2
        # connections arrive together.
        assert min(gaps) >= 1 / rate - 0.15, gaps
        assert times[-1] - times[0] >= (len(times) - 1) / rate - 0.15
    finally:
        proxy.stop()
