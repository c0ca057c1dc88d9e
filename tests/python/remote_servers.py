"""Real servers on 127.0.0.1 for the remote-source tests, started and stopped by them:
s3rver (the S3-compatible server pinned in tests/support/s3, installed by
scripts/install-deps.sh with `npm ci`), nginx-light (plain HTTP and HTTPS with a certificate
made by openssl at test time), and FaultProxy, a TCP proxy written here that cuts, refuses,
stalls and throttles connections on request. Every wait is bounded."""
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
S3RVER = REPO / "tests/support/s3/node_modules/.bin/s3rver"
S3_KEY = "S3RVER"  # s3rver's built-in credentials; it checks every request's signature
S3_SECRET = "S3RVER"


def dir_bytes(d):
    """The bytes of the files under `d`, each file once: a download renamed from partial/ to
    objects/ while the walk runs keeps its inode, and is not counted twice. partial/ is read
    before objects/: the cache evicts a copy before it reserves the next download's bytes, so
    a walk in that order never counts an evicted copy beside the download that replaced it."""
    seen = {}
    for root, dirs, files in os.walk(d):
        dirs.sort(reverse=True)  # partial/ before objects/
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except FileNotFoundError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


class PeakSampler:
    """The largest size the directory `d` had, sampled every 2 ms while it runs."""

    def __init__(self, d):
        self.d, self.peak = d, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, dir_bytes(self.d))
            time.sleep(0.002)

    def __enter__(self):
        os.makedirs(self.d, exist_ok=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc=None, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def s3_missing_reason():
    """Why the S3 tests cannot run here, or None. Only an absent node is a reason: where node
    exists, scripts/install-deps.sh installs s3rver, and a missing one fails the tests."""
    if shutil.which("node") is None:
        return "node is not installed (scripts/install-deps.sh installs nodejs and s3rver)"
    return None


def _stop(proc):
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class S3Server:
    """s3rver serving `directory` (kept across restarts) on a fixed free port, with `bucket`."""

    def __init__(self, directory, bucket="bucket"):
        self.directory = Path(directory)
        self.bucket = bucket
        self.port = free_port()
        self.proc = None
        self.log = self.directory.parent / f"s3rver-{self.port}.log"

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        if not S3RVER.exists():
            raise RuntimeError(f"{S3RVER} is missing: run scripts/install-deps.sh (npm ci)")
        self.directory.mkdir(parents=True, exist_ok=True)
        # s3rver's continuation tokens use DES, which Node 17+ has only in OpenSSL's legacy
        # provider.
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["node", "--openssl-legacy-provider", str(S3RVER), "-d", str(self.directory),
                 "-a", "127.0.0.1", "-p", str(self.port), "--configure-bucket", self.bucket],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.port, self.proc)
        return self

    def stop(self):
        _stop(self.proc)
        self.proc = None

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}))

    def upload_dir(self, local_dir, prefix, pattern="*"):
        """Uploads the files of `local_dir` matching `pattern` under `prefix`; returns keys."""
        c = self.client()
        keys = []
        for f in sorted(Path(local_dir).glob(pattern)):
            if f.name.endswith(".fsidx"):
                continue
            key = f"{prefix}/{f.name}"
            c.upload_file(str(f), self.bucket, key)
            keys.append(key)
        return keys

    def env(self, endpoint=None):
        """The environment a flowstate process reads the store with."""
        return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint or self.endpoint}


class Nginx:
    """nginx serving `root` over HTTP, or HTTPS with a self-signed certificate for 127.0.0.1
    (its path in `ca`, for AWS_CA_BUNDLE), on a free port. Ranges and ETags are nginx's own."""

    def __init__(self, root, work, tls=False):
        self.root = Path(root)
        self.work = Path(work)
        self.tls = tls
        self.port = free_port()
        self.proc = None
        self.ca = None

    @property
    def url(self):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self):
        w = self.work
        w.mkdir(parents=True, exist_ok=True)
        listen = f"127.0.0.1:{self.port}"
        tls = ""
        if self.tls:
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                 "-keyout", str(w / "key.pem"), "-out", str(w / "cert.pem"),
                 "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                check=True, capture_output=True, timeout=60)
            self.ca = str(w / "cert.pem")
            listen += " ssl"
            tls = f"ssl_certificate {w}/cert.pem; ssl_certificate_key {w}/key.pem;"
        (w / "nginx.conf").write_text(f"""
daemon off;
master_process off;
worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log {w}/access.log;
  client_body_temp_path {w}/body;
  proxy_temp_path {w}/proxy;
  fastcgi_temp_path {w}/fastcgi;
  uwsgi_temp_path {w}/uwsgi;
  scgi_temp_path {w}/scgi;
  types {{ }}
  default_type application/octet-stream;
  server {{
    listen {listen};
    {tls}
    root {self.root};
  }}
}}
""")
        self.proc = subprocess.Popen(["nginx", "-p", str(w), "-c", str(w / "nginx.conf"),
                                      "-e", str(w / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for_port(self.port, self.proc)
        return self

    def stop(self):
        _stop(self.proc)
        self.proc = None

    def requests(self):
        """The request lines nginx logged ("GET /shard-0001.tar HTTP/1.1"), in order."""
        log = self.work / "access.log"
        if not log.exists():
            return []
        return [line.split('"')[1] for line in log.read_text().splitlines() if '"' in line]


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of `upstream_port`. Each new connection takes the
    next fault of `faults` (then passes through):

      ("reset", n)   pass the response's first n bytes, then reset the connection (RST)
      ("status", c)  answer HTTP status c (503, 429) without asking the upstream
      ("stall", s)   read the request, then send nothing for s seconds and close
      ("close", 0)   close the connection at once, before any answer
      ("pass", 0)    no fault

    `rate` caps the bytes per second sent to the client, per connection; `total_rate` caps the
    bytes per second of all connections together, as a link of that bandwidth would (a
    connection between two requests leaves its share to the others). `always` is a fault
    applied to every connection once `faults` is empty (None: pass through). Request lines seen
    are kept in `requests`, their arrival times in `times`; `bytes` counts the bytes of the
    answers passed to the clients (headers included)."""

    LINK_BURST_S = 0.005
    LINK_SLACK_S = 0.002

    def __init__(self, upstream_port, faults=(), rate=None, always=None, total_rate=None):
        self.upstream_port = upstream_port
        self.faults = list(faults)
        self.rate = rate
        self.total_rate = total_rate
        self.link_free = 0.0  # with total_rate: when the link has sent what it was given
        self.always = always
        self.requests = []
        self.times = []  # when each request of `requests` arrived (time.monotonic())
        self.connections = 0
        self.bytes = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopped = True
        self.sock.close()
        self.thread.join(timeout=5)

    def _accept(self):
        while not self.stopped:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                fault = self.faults.pop(0) if self.faults else self.always
            threading.Thread(target=self._serve, args=(client, fault), daemon=True).start()

    @staticmethod
    def _read_request(client):
        data = b""
        client.settimeout(10)
        while b"\r\n\r\n" not in data:
            chunk = client.recv(65536)
            if not chunk:
                break
            data += chunk
        return data

    @staticmethod
    def _reset(sock):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        sock.close()

    def _serve(self, client, fault):
        upstream = None
        try:
            request = self._read_request(client)
            line = request.split(b"\r\n", 1)[0].decode("latin-1")
            with self.lock:
                self.requests.append(line)
                self.times.append(time.monotonic())
            kind, arg = fault if fault and fault[0] != "pass" else (None, None)
            if kind == "status":
                reason = {503: "Service Unavailable", 429: "Too Many Requests"}.get(arg, "Error")
                client.sendall(f"HTTP/1.1 {arg} {reason}\r\nContent-Length: 0\r\n"
                               "Connection: close\r\n\r\n".encode())
                client.close()
                return
            if kind == "stall":
                time.sleep(min(arg, 30))
                client.close()
                return
            if kind == "close":
                self._reset(client)
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30)
            upstream.sendall(request)
            sent = 0
            limit = arg if kind == "reset" else None
            start = time.monotonic()
            # flowstate sends GET and HEAD only (no request body): pass the upstream's answer
            # until it closes.
            while True:
                chunk = upstream.recv(65536)
                if not chunk:
                    break
                if limit is not None and sent + len(chunk) >= limit:
                    client.sendall(chunk[: max(0, limit - sent)])
                    self._reset(client)
                    return
                client.sendall(chunk)
                sent += len(chunk)
                with self.lock:
                    self.bytes += len(chunk)
                if self.rate:
                    ahead = sent / self.rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
                if self.total_rate:
                    # The link's clock (a token bucket): each chunk takes len / total_rate of
                    # it, after what every connection sent before; an idle link saves at most
                    # LINK_BURST_S of credit, and a connection sleeps only once it is more than
                    # LINK_SLACK_S ahead (a sleep per chunk would cost more than it paces).
                    with self.lock:
                        now = time.monotonic()
                        self.link_free = (max(self.link_free, now - self.LINK_BURST_S) +
                                          len(chunk) / self.total_rate)
                        ahead = self.link_free - now
                    if ahead > self.LINK_SLACK_S:
                        time.sleep(ahead)
            client.close()
        except OSError:
            try:
                client.close()
            except OSError:
                pass
        finally:
            if upstream is not None:
                upstream.close()


# --- Running the flowstate command from the remote tests --------------------------------------

# Cleared from the environment of every run: the tests say what they want.
_CLEARED = ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "FLOWSTATE_CACHE_LIMIT",
            "FLOWSTATE_CACHE_DIR", "FLOWSTATE_LISTING_MAX_AGE", "FLOWSTATE_REMOTE_BLOCK",
            "FLOWSTATE_REMOTE_PLAN")


def cli_path():
    """The flowstate command (FLOWSTATE_CLI); the test is skipped without it."""
    path = os.environ.get("FLOWSTATE_CLI")
    if not path or not os.path.exists(path):
        import pytest  # only the tests need it (bench/ imports this module too)
        pytest.skip("FLOWSTATE_CLI does not name the flowstate command")
    return path


def clean_env(more):
    """This process's environment without _CLEARED, with `more` (values made strings)."""
    e = os.environ.copy()
    for k in _CLEARED:
        e.pop(k, None)
    e.update({k: str(v) for k, v in more.items()})
    return e


def run(args, env=None, check=True, timeout=120):
    """Runs `flowstate ARGS` in clean_env(env); raises with its output unless it exits 0."""
    r = subprocess.run([cli_path(), *args], capture_output=True, text=True,
                       env=clean_env(env or {}), timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}: {' '.join(args)}\n{r.stdout}\n{r.stderr}")
    return r


def digest_lines(path):
    """step -> the line's digest; a step written twice (a resume redoes the steps after its
    checkpoint) must have the same digest both times."""
    out = {}
    for line in path.read_text().splitlines():
        step, rest = line.split(" ", 1)
        assert out.setdefault(int(step), rest) == rest, f"step {step} differs when redone"
    return out


def sigkill_after_checkpoint(yaml, env, ck, out, every, at, steps, extra=("--epochs", "2")):
    """Runs YAML with checkpoints every `every` steps into `ck` and digests into `out`, SIGKILLs
    it once a checkpoint of step >= `at` exists (within 90 s), and checks it was killed mid-run:
    its digests reach `at` and stop before `steps`."""
    p = subprocess.Popen([cli_path(), "run", str(yaml), *extra, "--digests", str(out),
                          "--checkpoint-dir", str(ck), "--checkpoint-every", str(every)],
                         env=clean_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    end = time.monotonic() + 90
    while time.monotonic() < end and p.poll() is None and not any(
            int(d.name[5:]) >= at for d in ck.glob("step-*") if d.name[5:].isdigit()):
        time.sleep(0.01)
    assert p.poll() is None, p.stderr.read()
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    done = digest_lines(out)
    assert at <= max(done) < steps, (at, max(done), steps)
