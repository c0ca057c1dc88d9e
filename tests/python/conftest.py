"""pytest for the `flowstate` package. Run by ctest (test `python.pytest`, label `python`)
with PYTHONPATH at the build tree's python/ directory; without the package (not built, or no
torch) every test is skipped, not failed."""
import pytest

from remote_servers import cli_path

torch = pytest.importorskip("torch", reason="needs PyTorch (python3-torch)")
flowstate = pytest.importorskip("flowstate", reason="the flowstate package is not built")
np = pytest.importorskip("numpy")

RECORD_BYTES = 16
RECORDS = 1000  # per file
FILES = 2


def record(i):
    """The bytes of record i: its index as uint32, then 12 bytes derived from it."""
    r = np.zeros(RECORD_BYTES, dtype=np.uint8)
    r[:4] = np.frombuffer(np.uint32(i).tobytes(), dtype=np.uint8)
    r[4:] = (np.arange(12) * 7 + i) % 251
    return r


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    for f in range(FILES):
        rows = np.stack([record(f * RECORDS + i) for i in range(RECORDS)])
        rows.tofile(d / f"part-{f:05d}.bin")
    return d


@pytest.fixture
def records_doc(data_dir):
    """A pipeline document over the test records."""
    return {
        "seed": 7,
        "source": {"type": "records", "paths": str(data_dir / "*.bin"), "record_bytes": RECORD_BYTES},
        "nodes": [{"shuffle": {"mode": "global"}}, {"batch": {"size": 32}}],
    }


@pytest.fixture
def cli():
    """The flowstate command (FLOWSTATE_CLI); the test is skipped without it."""
    return cli_path()


def every_epoch(loader):
    """The batches of every epoch a bounded loader has left (of an unbounded one, the current
    epoch's): one `for` loop per epoch, as a training loop takes them."""
    return [b for _ in range(loader.epoch, loader.epochs or loader.epoch + 1) for b in loader]
