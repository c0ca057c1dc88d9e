"""flowstate.DataLoader: torch.utils.data.DataLoader's signature and conventions, with an exact
mid-epoch resume through state_dict()/load_state_dict() for any num_workers.

Each epoch is a flowstate pipeline over the dataset -- `from_sequence` (map-style: `__len__`
and `__getitem__`, O(1) resume by index) or `from_iterable` (an IterableDataset: its
state_dict() when it has one) -- then a global shuffle from (seed, epoch) when shuffle=True,
a shard for this rank under torch.distributed or the launcher's RANK/WORLD_SIZE (like
DistributedSampler: one shuffled order, rank r takes every world-th position, padded so that
every rank takes the same number of steps), and a batch. The Python work of each batch
(__getitem__, collate_fn) runs in the calling process (num_workers=0) or in worker processes
(flowstate/_workers.py).
"""

import os
import warnings

import numpy as np

from . import (CheckpointError, ConfigError, Error, Loader, _C, _workers, default_collate,
               from_iterable, from_sequence)

#: Version of the dict DataLoader.state_dict() returns.
DATALOADER_STATE_VERSION = 1
_KIND = "flowstate.DataLoader"


def _epoch_seed(seed, epoch):
    """The pipeline seed of epoch `epoch`: each epoch's order is a function of (seed, epoch)
    alone, so set_epoch(e) and a resume are O(1)."""
    s = np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, epoch, 0x6466]).generate_state(2)
    return ((int(s[0]) << 32) | int(s[1])) & 0x7FFFFFFFFFFFFFFF


def _rank_world():
    """(rank, world) from an initialized torch.distributed, else the launcher's variables."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    return rank, world


def _is_iterable_dataset(dataset):
    try:
        import torch.utils.data as tud
        if isinstance(dataset, tud.IterableDataset):
            return True
    except ImportError:  # pragma: no cover
        pass
    return not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"))


def _default_convert(item):
    import torch.utils.data

    return torch.utils.data.default_convert(item)


class DataLoader:
    """torch.utils.data.DataLoader's signature and conventions, exactly resumable.

        loader = flowstate.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2,
                                      seed=1234)
        for epoch in range(start_epoch, epochs):
            loader.set_epoch(epoch)
            for x, y in loader:          # what collate_fn returns: tuples stay tuples
                ...
        torch.save({"loader": loader.state_dict(), ...}, "ckpt.pt")
        loader.load_state_dict(torch.load("ckpt.pt")["loader"])   # the next batch, exactly

    As torch: `num_workers=0` runs in the calling process; `collate_fn=None` is torch's
    default collate; `shuffle=True` reshuffles every epoch, from `seed` and the epoch;
    `len()` is batches per epoch for this rank; each `iter()` is one epoch (the next one,
    unless set_epoch said otherwise); under torch.distributed (or RANK/WORLD_SIZE) each
    rank takes its share, every rank the same number of steps. Beyond torch: a state saved
    with num_workers=4 restores with 0, 1 or 8 and gives the same batches; Python, numpy
    and torch's global random generators are seeded per batch from (seed, epoch, step), so
    augmentations drawn from them do not depend on num_workers either.

    `seed`: the order's seed; None draws one from torch's default generator (or
    `generator`), once, and state_dict() keeps it. A custom `sampler` or a `batch_sampler`
    is refused (ConfigError naming it): flowstate plans the order itself. SequentialSampler,
    RandomSampler (without replacement) and DistributedSampler are translated (its
    shuffle, seed, rank, num_replicas, drop_last, and the epoch its set_epoch sets).
    `loader.info` is the BatchInfo of the last batch (step, epoch, is_last_in_epoch, ...),
    for flowstate.GradientAccumulator.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 seed=None):
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        if batch_sampler is not None:
            raise ConfigError("batch_sampler: flowstate.DataLoader plans its batches itself (that "
                              "is what makes them resumable); use batch_size, shuffle, drop_last "
                              "and seed")
        if multiprocessing_context not in (None, "fork"):
            ctx = getattr(multiprocessing_context, "get_start_method", lambda: None)()
            if ctx != "fork":
                raise ConfigError(f"multiprocessing_context={multiprocessing_context!r}: "
                                  "flowstate's workers are forked (the 'fork' start method)")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r}: 0 (the calling process) or more "
                              "worker processes")
        if persistent_workers and num_workers == 0:
            raise ConfigError("persistent_workers=True needs num_workers > 0 (as in torch)")
        if timeout < 0:
            raise ConfigError(f"timeout={timeout!r}: seconds, 0 or more")
        if batch_size is not None and (isinstance(batch_size, bool) or
                                       not isinstance(batch_size, int) or batch_size < 1):
            raise ConfigError(f"batch_size={batch_size!r}: a positive int, or None for "
                              "unbatched items")
        if pin_memory_device and pin_memory_device != "cuda" and not pin_memory_device.startswith(
                "cuda:"):
            raise ConfigError(f"pin_memory_device={pin_memory_device!r}: CUDA only")

        self._iterable = _is_iterable_dataset(dataset)
        rank, world = _rank_world()
        uneven = "pad"
        self._sampler = None  # a DistributedSampler, whose set_epoch the loader follows
        if sampler is not None:
            shuffle, rank, world, uneven, seed, generator = self._translate(
                sampler, shuffle, rank, world, uneven, seed, generator)
            if hasattr(sampler, "num_replicas"):
                self._sampler = sampler
        if self._iterable and shuffle:
            raise ConfigError("shuffle=True with an IterableDataset: an iterable has no order "
                              "to shuffle by index (as in torch); shuffle inside it, or use a "
                              "map-style dataset")
        self.shuffle = bool(shuffle)
        self._rank, self._world, self._uneven = rank, world, uneven
        # What the batches depend on besides the dataset and the seed: a state_dict saved
        # with other values is refused, also at an epoch's end (where it holds no plan state).
        self._config = {"batch_size": batch_size, "drop_last": self.drop_last,
                        "shuffle": self.shuffle, "rank": rank, "world": world, "uneven": uneven}
        self._seed_given = seed is not None
        if seed is None:
            import torch
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self.seed = int(seed)
        self._epoch = 0
        self._resume = None          # (epoch, plan state) to continue within
        self._step_base = 0          # steps of the epochs before this one
        self._current = None         # the Loader of the epoch being iterated
        self._current_epoch = None
        self._pool = None
        self._len = None
        self._name = (f"{type(dataset).__module__}.{type(dataset).__qualname__}"
                      + (f"[{len(dataset)}]" if hasattr(dataset, "__len__") else ""))
        self.info = None
        self._closed = False

    @staticmethod
    def _translate(sampler, shuffle, rank, world, uneven, seed, generator):
        import torch.utils.data as tud

        if shuffle:
            raise ConfigError("sampler and shuffle=True are mutually exclusive (as in torch)")
        if isinstance(sampler, tud.SequentialSampler):
            return False, rank, world, uneven, seed, generator
        if type(sampler) is tud.RandomSampler:
            if sampler.replacement or sampler._num_samples is not None:
                raise ConfigError("sampler=RandomSampler(replacement=True or num_samples=...): "
                                  "not an order of the dataset, which flowstate plans itself")
            return True, rank, world, uneven, seed, generator or sampler.generator
        try:
            from torch.utils.data.distributed import DistributedSampler
        except ImportError:  # pragma: no cover
            DistributedSampler = ()
        if type(sampler) is DistributedSampler:
            return (sampler.shuffle, sampler.rank, sampler.num_replicas,
                    "drop" if sampler.drop_last else "pad",
                    seed if seed is not None else sampler.seed, generator)
        raise ConfigError(f"sampler={type(sampler).__name__}: flowstate.DataLoader plans the "
                          "order itself (that is what makes it resumable); it takes "
                          "SequentialSampler, RandomSampler and DistributedSampler, or "
                          "shuffle=/seed=")

    # -- pipelines --
    def _collate(self):
        if self.batch_size is None:
            convert = self.collate_fn or _default_convert
            return lambda items: convert(items[0])
        return self.collate_fn or default_collate

    def _pipeline(self, epoch):
        if self._iterable:
            # Not sized by its __len__: torch takes that for an estimate (it warns when an
            # epoch yields more), and a size would make a shorter epoch an error.
            ds = self.dataset
            b = from_iterable(lambda: ds, name=self._name, collate=self._collate())
        else:
            b = from_sequence(self.dataset, name=self._name, collate=self._collate())
        b.seed(_epoch_seed(self.seed, epoch))
        if self.shuffle:
            b.shuffle(mode="global")
        if self._world > 1 and not self._iterable:
            b.shard(rank=self._rank, world=self._world, uneven=self._uneven)
        b.batch(size=self.batch_size or 1, drop_last=self.drop_last)
        return b.build()

    def _loader(self, epoch):
        loader = Loader(self._pipeline(epoch), epochs=1, num_workers=self.num_workers,
                        prefetch_factor=self.prefetch_factor, timeout=self.timeout,
                        worker_init_fn=self.worker_init_fn, pin_memory=self.pin_memory,
                        _pool=self._pool)
        if self.persistent_workers and self._pool is None:
            # One pool for every epoch: the dataset, maps and collate are the same.
            self._pool = _workers.Pool(loader._plan.program, self.num_workers,
                                       self.worker_init_fn, self.timeout)
            loader._pool, loader._owns_pool = self._pool, False
        return loader

    # -- iteration --
    @property
    def epoch(self):
        """The epoch the next iteration yields (or the one being iterated)."""
        return self._epoch

    def set_epoch(self, epoch):
        """The epoch the next iteration yields: its order is a function of (seed, epoch). The
        epoch of a loaded state_dict continues where the state stopped; any other starts at
        its beginning."""
        self._check_open()
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): a non-negative int")
        if epoch == self._epoch:
            return
        if self._resume is not None:
            warnings.warn(f"set_epoch({epoch}) after load_state_dict of epoch {self._epoch}: "
                          "the loaded position is dropped", stacklevel=2)
            self._resume = None
        self._epoch = epoch
        if not self._iterable:
            self._step_base = epoch * len(self)

    def __iter__(self):
        self._check_open()
        if self._sampler is not None:
            # A DistributedSampler's set_epoch decides the epoch, as in torch.
            self.set_epoch(self._sampler.epoch)
        return self._run_epoch(self._epoch)

    def _run_epoch(self, epoch):
        if self._current is not None:
            self._current.close()
        loader = self._loader(epoch)
        if self._resume is not None and self._resume[0] == epoch:
            loader.load_state(self._resume[1])
        self._resume = None
        self._current, self._current_epoch = loader, epoch
        base, done = self._step_base, 0
        for b in loader:
            self.info = b.info._replace(epoch=epoch, step=base + b.info.index_in_epoch)
            done = b.info.index_in_epoch + 1
            yield b.value
        if self._current is loader:
            loader.close()
            self._current = None
        self._epoch = epoch + 1
        self._step_base = base + done

    def __len__(self):
        """Batches per epoch for this rank (TypeError for an iterable of unknown length)."""
        self._check_open()
        if self._len is None:
            if self._iterable:
                # Not by planning a batch: that would iterate the user's dataset once.
                if not hasattr(self.dataset, "__len__"):
                    raise TypeError("len() of a DataLoader over an IterableDataset without "
                                    "__len__")
                n, bs = len(self.dataset), self.batch_size or 1
                self._len = n // bs if self.drop_last else -(-n // bs)
            else:
                self._len = len(Loader(self._pipeline(0), epochs=1))
        return self._len

    # -- state --
    def state_dict(self):
        """A small picklable dict: the position after the last batch yielded (the epoch, the
        plan's state within it) and the seed. load_state_dict() on a DataLoader over the same
        dataset continues with the next batch exactly, with any num_workers."""
        self._check_open()
        cur, info = self._current, self.info
        if cur is not None and info is not None and info.epoch == self._current_epoch:
            if info.is_last_in_epoch:
                epoch, state, base = self._current_epoch + 1, None, info.step + 1
            else:
                epoch, state = self._current_epoch, cur.state()
                base = info.step - info.index_in_epoch
        else:
            epoch, base = self._epoch, self._step_base
            state = self._resume[1] if self._resume is not None else None
        step = base + (_C.state_fields(state)["step"] if state is not None else 0)
        return {"version": DATALOADER_STATE_VERSION, "kind": _KIND, "epoch": epoch,
                "state": state, "seed": self.seed, "step_base": base, "step": step,
                "dataset": self._name, "config": dict(self._config)}

    def load_state_dict(self, state_dict):
        """Continues from state_dict(): the next iteration yields the batch after the saved
        one. A state of another dataset, or of another explicit seed, is a CheckpointError."""
        self._check_open()
        if not isinstance(state_dict, dict) or state_dict.get("kind") != _KIND:
            raise CheckpointError("state_dict: not a flowstate.DataLoader state_dict (a "
                                  "flowstate.Loader's goes to Loader.load_state_dict)")
        if state_dict.get("version") != DATALOADER_STATE_VERSION:
            raise CheckpointError(f"state_dict: version {state_dict.get('version')} is not "
                                  f"{DATALOADER_STATE_VERSION}; upgrade flowstate")
        if state_dict["dataset"] != self._name:
            raise CheckpointError(f"state_dict: saved over dataset {state_dict['dataset']}, "
                                  f"this DataLoader reads {self._name}")
        if self._seed_given and state_dict["seed"] != self.seed:
            raise CheckpointError(f"state_dict: saved with seed={state_dict['seed']}, this "
                                  f"DataLoader has seed={self.seed}")
        differ = [f"{k}={state_dict['config'].get(k)!r} (now {v!r})"
                  for k, v in self._config.items() if state_dict["config"].get(k) != v]
        if differ:
            raise CheckpointError("state_dict: saved by a DataLoader whose batches differ: "
                                  + ", ".join(differ))
        self.seed = state_dict["seed"]
        if self._current is not None:
            self._current.close()
            self._current = None
        self._epoch = state_dict["epoch"]
        self._step_base = state_dict["step_base"]
        self._resume = None
        self.info = None
        if state_dict["state"] is not None:
            # Checked now: a state of another pipeline is refused here, naming what differs.
            probe = Loader(self._pipeline(self._epoch), epochs=1)
            probe.load_state(state_dict["state"])
            probe.close()
            self._resume = (self._epoch, state_dict["state"])

    def _check_open(self):
        if self._closed:
            raise Error("this flowstate.DataLoader is closed")

    def close(self):
        """Stops the worker processes; every later call raises flowstate.Error."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._current.close()
            self._current = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
