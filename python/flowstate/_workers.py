"""The Python parts of a pipeline with a Python source, run in the calling process or in
worker processes.

A pipeline whose source is a Python sequence or iterable runs as a *plan*: the C++ graph plans
every batch (shuffle, shard, filter, batch, the state) on the items' indices -- or, for an
iterable, on the items themselves -- and the Python side turns each planned batch into the
batch: `__getitem__` of each index, the Python maps in order, then `collate`. That Python work
is one *task* per batch, run in the calling process (`num_workers=0`) or by one of N worker
processes (`num_workers=N`, forked as torch's DataLoader forks them), whose collated tensors
come back through shared memory (torch.multiprocessing's reductions: the tensor bytes are not
pickled). Tasks are handed out in order and their results taken in order, so the batches are
the same for any number of workers, and the state of a batch is the plan's state when it was
planned -- a state saved with 4 workers restores with 0 or 8.

Each task runs with Python's, numpy's and torch's (CPU) global random generators seeded from
the pipeline's seed, the epoch and the step (and, in the calling process, put back afterwards):
augmentations drawn from them are the same whichever worker runs the task, and after a resume.
"""

import itertools
import os
import queue
import random
import signal
import time
import traceback
import weakref

import numpy as np

from . import _flowstate as _C

Error = _C.Error

_POLL_S = 0.2  # how often a waiting trainer looks for a dead worker


class WorkerInfo:
    """What `flowstate.get_worker_info()` returns inside a worker process (torch's fields)."""

    __slots__ = ("id", "num_workers", "seed", "dataset")

    def __init__(self, id, num_workers, seed, dataset):
        self.id, self.num_workers, self.seed, self.dataset = id, num_workers, seed, dataset

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


_worker_info = None


def get_worker_info():
    """In a worker process, its WorkerInfo (id, num_workers, seed, dataset); None in the
    calling process. Like torch.utils.data.get_worker_info."""
    return _worker_info


def _in_node(e, node):
    """Marks an exception raised by the user's code with the node it came from (as the
    native Loader's callbacks are marked)."""
    if getattr(e, "flowstate_node", None) is None:
        try:
            e.flowstate_node = node
            if hasattr(e, "add_note"):
                e.add_note(f"raised in flowstate node '{node}'")
        except (AttributeError, TypeError):  # an exception type without a __dict__
            pass


class Program:
    """What a task runs: read each index of `dataset` (or take the planned items as they are,
    when `dataset` is None), apply `maps` -- (name, fn) pairs -- in order, then `collate` the
    list. `source` names the source in messages."""

    def __init__(self, dataset, maps, collate, seed, source="source"):
        self.dataset = dataset
        self.maps = list(maps)
        self.collate = collate
        self.seed = seed
        self.source = source

    def item(self, key, maps_before=None):
        """One item with the maps before position `maps_before` (all maps by default): what a
        Python filter in the plan looks at."""
        x = self._read(key) if self.dataset is not None else key
        for name, fn in self.maps[:maps_before]:
            x = self._call(name, fn, x)
        return x

    def _read(self, i):
        try:
            return self.dataset[i]
        except BaseException as e:
            _in_node(e, self.source)
            raise

    @staticmethod
    def _call(name, fn, x):
        try:
            return fn(x)
        except BaseException as e:
            _in_node(e, name)
            raise

    def run(self, payload):
        if self.dataset is not None:
            items = [self._read(i) for i in payload]
        else:
            items = list(payload)
        for name, fn in self.maps:
            items = [self._call(name, fn, x) for x in items]
        return self._call("collate", self.collate, items)


_M64 = 0xFFFFFFFFFFFFFFFF


def _mix(x):
    """splitmix64's finalizer: a bijection of 64-bit ints that spreads every input bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


def task_seed(seed, epoch, step):
    """The seed of the global generators for the task of (epoch, step): 63 bits, a hash of the
    three (a few integer operations: numpy's SeedSequence took ~190 us a batch)."""
    h = _mix((seed & _M64) ^ 0x9E3779B97F4A7C15)
    h = _mix(h ^ (epoch & _M64))
    return _mix(h ^ (step & _M64)) >> 1


def _seed_globals(s):
    import torch

    random.seed(s)
    np.random.seed(s & 0xFFFFFFFF)
    # The CPU generator only: torch.manual_seed would also queue a CUDA seeding, whose lazy
    # call records a formatted stack (~100 us a batch), and the trainer's CUDA stream of
    # random numbers is not the task's business.
    torch.default_generator.manual_seed(s)


class _SavedGlobals:
    """The global generators' states, put back after a task run in the calling process, so that
    the trainer's own random stream (dropout, its own shuffles) is not touched."""

    def __init__(self):
        import torch

        self.r = random.getstate()
        self.n = np.random.get_state()
        self.t = torch.get_rng_state()

    def restore(self):
        import torch

        random.setstate(self.r)
        np.random.set_state(self.n)
        torch.set_rng_state(self.t)


def run_here(program, payload, seed):
    """A task in the calling process (num_workers=0): the user's exception propagates as
    it is, with its own frames."""
    saved = _SavedGlobals()
    try:
        _seed_globals(seed)
        return program.run(payload)
    finally:
        saved.restore()


class _Failure:
    """An exception raised in a worker, sent back with its formatted traceback."""

    def __init__(self, exc, worker_id, pid, where):
        self.type = type(exc)
        self.message = str(exc)
        self.node = getattr(exc, "flowstate_node", None)
        self.worker_id, self.pid, self.where = worker_id, pid, where
        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            import pickle

            pickle.dumps(self.type)
        except Exception:
            self.type = RuntimeError

    def reraise(self):
        msg = (f"Caught {self.type.__name__} in flowstate worker {self.worker_id} (pid "
               f"{self.pid}) {self.where}.\nOriginal {self.text}")
        if self.type is KeyError:  # KeyError quotes its message; keep it readable
            msg = KeyError(msg)
        try:
            exc = self.type(msg)
        except Exception:
            exc = Error(msg)
        if self.node is not None:
            _in_node(exc, self.node)
        exc.flowstate_worker = self.worker_id
        exc.flowstate_worker_pid = self.pid
        exc.flowstate_traceback = self.text
        raise exc


def _worker_loop(program, tasks, results, current, worker_id, num_workers, base_seed, init_fn):
    global _worker_info
    import torch

    # The trainer handles Ctrl-C; a worker ends when it is told to, or when the trainer dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    # A result's tensors go to shared memory named by file (torch_shm_manager removes what
    # a dead process leaves), not by a file descriptor that the trainer would have to fetch
    # from this process's sharer thread -- which waits for this process's GIL, held by the
    # user's Python code for up to a switch interval (5 ms) at a time.
    torch.multiprocessing.set_sharing_strategy("file_system")
    _worker_info = WorkerInfo(worker_id, num_workers, base_seed + worker_id, program.dataset)
    _seed_globals(base_seed + worker_id)
    parent = os.getppid()
    if init_fn is not None:
        try:
            init_fn(worker_id)
        except BaseException as e:  # noqa: B902 -- everything goes back to the trainer
            results.put((None, _Failure(e, worker_id, os.getpid(), "in worker_init_fn")))
            return
    while True:
        if not tasks._reader.poll(1.0):
            if os.getppid() != parent:  # the trainer is gone
                return
            continue
        task = tasks.get()
        if task is None:
            return
        ident, payload, seed, where = task
        current.value = ident  # what the trainer names if this process dies now
        try:
            _seed_globals(seed)
            out = program.run(payload)
        except BaseException as e:  # noqa: B902
            results.put((ident, _Failure(e, worker_id, os.getpid(), where)))
            continue
        results.put((ident, out))
        del out


def _describe_exit(code):
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Pool:
    """N worker processes running tasks of one Program. submit() hands a task to the worker
    whose turn it is (round robin, as torch does); result() returns the results in the order
    submitted. A worker that dies is an Error naming its pid and the batch it was running;
    an exception in a worker is raised again here with the worker's traceback."""

    def __init__(self, program, num_workers, worker_init_fn=None, timeout=0.0):
        import torch.multiprocessing as mp

        ctx = mp.get_context("fork")
        self.num_workers = num_workers
        self.timeout = float(timeout or 0)
        # Results too are written by the worker's own thread, right when the task ends (a
        # Queue's feeder thread would wait for the worker's GIL, which its next task holds for
        # a switch interval at a time). A worker killed while writing leaves the others
        # blocked on the lock: its death is found and the pool closed all the same.
        self._results = ctx.SimpleQueue()
        # Tasks are written by the trainer's own thread (SimpleQueue: no feeder thread, which
        # would have to win the trainer's GIL before a worker sees its next task).
        self._tasks = [ctx.SimpleQueue() for _ in range(num_workers)]
        # The task each worker is running (its ident), written by the worker as it starts one:
        # a result the worker had put may die with it in its queue's feeder thread.
        self._current = [ctx.RawValue("q", 0) for _ in range(num_workers)]
        base_seed = program.seed & 0x7FFFFFFF
        self._procs = []
        for w in range(num_workers):
            p = ctx.Process(target=_worker_loop, name=f"flowstate-worker-{w}",
                            args=(program, self._tasks[w], self._results, self._current[w], w,
                                  num_workers, base_seed, worker_init_fn),
                            daemon=True)
            p.start()
            self._procs.append(p)
        self._next_worker = itertools.cycle(range(num_workers))
        self._running = {}  # ident -> (worker, where)
        self._done = {}
        self._broken = None
        self._closed = False
        _live_pools.add(self)

    @property
    def pids(self):
        return [p.pid for p in self._procs]

    def submit(self, ident, payload, seed, where):
        if self._broken:
            raise Error(self._broken)
        w = next(self._next_worker)
        self._running[ident] = (w, where)
        self._tasks[w].put((ident, payload, seed, where))

    def outstanding(self):
        return len(self._running)

    def _dead(self):
        for w, p in enumerate(self._procs):
            if p.exitcode is None:
                continue
            running = self._running.get(self._current[w].value)
            if running is not None and running[0] == w:
                return (f"flowstate worker {w} (pid {p.pid}) {_describe_exit(p.exitcode)} "
                        f"while running {running[1]}")
            return f"flowstate worker {w} (pid {p.pid}) {_describe_exit(p.exitcode)}"
        return None

    def result(self, ident):
        """The result of task `ident` (waiting for it), or the worker's exception raised."""
        if self._broken:
            raise Error(self._broken)
        start = time.monotonic()
        while ident not in self._done:
            try:
                if not self._results._reader.poll(_POLL_S):
                    raise queue.Empty
                got, value = self._results.get()
            except Exception as e:  # noqa: B902
                # Empty, or a message a dying worker cut short (EOFError), or a tensor whose
                # sender is gone (its shared-memory handle cannot be received): a dead worker
                # is the error to report.
                dead = self._dead()
                if not dead and not isinstance(e, queue.Empty):
                    # A broken message is a worker's death seen before it can be reaped.
                    until = time.monotonic() + 2.0
                    while not dead and time.monotonic() < until:
                        time.sleep(0.02)
                        dead = self._dead()
                if dead:
                    self._broken = dead
                    self.close()
                    raise Error(dead) from None
                if not isinstance(e, queue.Empty):
                    raise
                if self.timeout and time.monotonic() - start > self.timeout:
                    w, where = self._running.get(ident, (None, "a batch"))
                    raise Error(f"flowstate: no batch from worker {w} within timeout="
                                f"{self.timeout:g} s (it is running {where})")
                continue
            if got is None:  # worker_init_fn failed
                self._broken = f"a worker's worker_init_fn raised {value.type.__name__}"
                self.close()
                value.reraise()
            self._done[got] = value
        value = self._done.pop(ident)
        self._running.pop(ident, None)
        if isinstance(value, _Failure):
            value.reraise()
        return value

    def close(self):
        """Stops the workers (results not taken are dropped)."""
        if self._closed:
            return
        self._closed = True
        _live_pools.discard(self)
        for q in self._tasks:
            try:
                q.put(None)
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=2.0)
            if p.exitcode is None:
                p.kill()
                p.join(timeout=2.0)
        for q in self._tasks + [self._results]:
            q.close()
        self._running.clear()
        self._done.clear()


_live_pools = weakref.WeakSet()


def close_all():
    """Stops every pool's workers (registered with atexit)."""
    for p in list(_live_pools):
        p.close()
