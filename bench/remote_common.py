"""What issue 23's remote benchmarks share (bench/remote_bench.py, remote_plan_bench.py,
remote_warm_ab.py): running the CLI with an environment of its own, the W1- and W2-shaped data
sets they make with `flowstate gen`, and the pipelines they run over them, local or remote.
"""
import os
import resource
import subprocess
import time
from pathlib import Path

SHARDS = 8
RECORD_BYTES = 4096


def run(cli, args, env, check=True):
    """Runs `cli args` under `env` added to a copy of ours without the AWS variables a
    developer's shell may hold; returns (wall s, CPU s, stderr)."""
    e = os.environ.copy()
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    e.update(env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([cli, *args], env=e, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and r.returncode != 0:
        raise SystemExit(f"{cli} {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stderr


class DataSet:
    """W1's shape (`records` of RECORD_BYTES in SHARDS files, `mib` MiB) or W2's (an indexed
    corpus of `docs` documents), generated under `work` unless it is there already."""

    def __init__(self, cli, work, workload, mib=256, docs=200000):
        self.workload = workload
        if workload == "w2":
            self.dir, self.glob, self.prefix = Path(work) / "indexed", "corpus.*", "w2"
            if not self.dir.exists():
                self.dir.mkdir(parents=True)
                run(cli, ["gen", "indexed", "--out", str(self.dir / "corpus"), "--docs",
                          str(docs)], {})
            self.local_paths, self.s3_paths = str(self.dir / "corpus.idx"), "s3://bucket/w2/corpus"
        else:
            self.dir, self.glob, self.prefix = Path(work) / "records", "part-*.bin", "w1"
            if not self.dir.exists():
                run(cli, ["gen", "records", "--out", str(self.dir), "--records",
                          str(mib * (1 << 20) // RECORD_BYTES), "--record-bytes",
                          str(RECORD_BYTES), "--shards", str(SHARDS)], {})
            self.local_paths = str(self.dir / "part-*.bin")
            self.s3_paths = "s3://bucket/w1/part-*.bin"

    def files(self):
        """The data's files (not the sidecar index files a run may write beside them)."""
        return [f for f in self.dir.glob(self.glob) if not f.name.endswith(".fsidx")]

    def bytes(self):
        return sum(f.stat().st_size for f in self.files())

    def yaml(self, path, paths):
        """Writes the workload's pipeline over `paths` (local or s3://) to `path`: W1 is records
        -> global shuffle -> batch 256, W2 bench/w2_compare.sh's indexed -> global shuffle ->
        pack 2048 -> batch 8."""
        path = Path(path)
        if self.workload == "w2":
            path.write_text(f'seed: 1234\nsource: {{type: indexed, paths: "{paths}", '
                            'field: tokens}\nnodes:\n  - shuffle: {mode: global}\n'
                            '  - pack: {length: 2048, separator: 0}\n  - batch: {size: 8}\n')
        else:
            path.write_text(f'seed: 1\nsource: {{type: records, paths: "{paths}", '
                            f'record_bytes: {RECORD_BYTES}}}\n'
                            'nodes:\n  - shuffle: {mode: global}\n  - batch: {size: 256}\n')
        return path
