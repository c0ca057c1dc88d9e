"""flowstate.DataLoader: torch's signature and conventions, worker processes, exact resume."""
import os
import pickle
import random
import signal

import flowstate
import numpy as np
import pytest
import torch
import torch.utils.data as tud


class Squares(tud.Dataset):
    """A map-style dataset of (x, y) tuples; x draws from the global generators, as an
    augmentation would."""

    def __init__(self, n=103, noisy=False):
        self.n, self.noisy = n, noisy

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.tensor([float(i), float(i) * 0.5])
        if self.noisy:
            x = x + torch.rand(2) + random.random() + float(np.random.rand())
        return x, i * i


def epoch_values(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v)
                                    for (x, y), (u, v) in zip(a, b))


def test_unshuffled_batches_equal_torch_dataloader():
    ds = Squares()
    ours = epoch_values(flowstate.DataLoader(ds, batch_size=10))
    theirs = epoch_values(tud.DataLoader(ds, batch_size=10))
    assert same(ours, theirs)
    assert len(flowstate.DataLoader(ds, batch_size=10)) == len(tud.DataLoader(ds, batch_size=10))
    assert len(flowstate.DataLoader(ds, batch_size=10, drop_last=True)) == 10


def test_each_iteration_is_one_epoch_and_shuffle_reshuffles_from_seed_and_epoch():
    loader = flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=5)
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        ys = [y for _, y in loader]
        assert len(ys) == len(loader) == 13
        assert loader.info.is_last_in_epoch and loader.info.epoch == epoch
        epochs.append(torch.cat(ys).tolist())
    for e in epochs:
        assert sorted(e) == [i * i for i in range(103)]
    assert epochs[0] != epochs[1] != epochs[2]
    # The order of epoch 2 is a function of (seed, 2): set_epoch jumps there directly.
    other = flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=5)
    other.set_epoch(2)
    assert torch.cat([y for _, y in other]).tolist() == epochs[2]
    # Iterating again without set_epoch continues with the next epoch.
    again = flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=5)
    assert [torch.cat([y for _, y in again]).tolist() for _ in range(2)] == epochs[:2]


@pytest.mark.parametrize("workers", [1, 2])
def test_batches_are_identical_for_any_num_workers_with_random_augmentation(workers):
    ds = Squares(noisy=True)
    base = flowstate.DataLoader(ds, batch_size=7, shuffle=True, seed=11)
    par = flowstate.DataLoader(ds, batch_size=7, shuffle=True, seed=11, num_workers=workers)
    for _ in range(2):
        assert same(epoch_values(base), epoch_values(par))


@pytest.mark.parametrize("cut", [3, 12, 14, 20])
@pytest.mark.parametrize("save_workers,load_workers", [(2, 0), (0, 2), (2, 1)])
def test_state_saved_with_some_workers_resumes_exactly_with_others(cut, save_workers,
                                                                  load_workers):
    def make(n):
        return flowstate.DataLoader(Squares(noisy=True), batch_size=8, shuffle=True, seed=3,
                                    num_workers=n)
    ref = make(0)
    reference = epoch_values(ref) + epoch_values(ref)  # 13 batches per epoch
    a = make(save_workers)
    got, sd = [], None
    for epoch in range(2):
        for x, y in a:
            got.append((x.clone(), y.clone()))
            if len(got) == cut:
                sd = pickle.loads(pickle.dumps(a.state_dict()))
                break
        if sd is not None:
            break
    a.close()
    b = make(load_workers)
    b.load_state_dict(sd)
    rest = []
    for epoch in range(b.epoch, 2):
        b.set_epoch(epoch)
        rest += epoch_values(b)
    assert same(got + rest, reference)
    assert b.info.step == 25 and b.info.epoch == 1


def test_worker_exception_is_raised_with_the_workers_traceback():
    class Bad(Squares):
        def __getitem__(self, i):
            if i == 13:
                raise ValueError(f"bad item {i}")  # the user's line
            return super().__getitem__(i)

    for workers in (0, 2):
        loader = flowstate.DataLoader(Bad(), batch_size=4, num_workers=workers)
        with pytest.raises(ValueError, match="bad item 13") as e:
            list(loader)
        text = "".join(__import__("traceback").format_exception(e.type, e.value, e.tb))
        assert 'raise ValueError(f"bad item {i}")  # the user\'s line' in text, text
        if workers:
            assert "flowstate worker" in str(e.value) and e.value.flowstate_worker_pid > 0


def test_a_worker_that_dies_is_an_error_naming_its_pid_and_the_items_not_a_hang():
    class Dies(Squares):
        def __getitem__(self, i):
            if i == 21:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().__getitem__(i)

    loader = flowstate.DataLoader(Dies(), batch_size=4, num_workers=2, timeout=60)
    with pytest.raises(flowstate.Error, match=r"pid \d+\) was killed by SIGKILL while running "
                                              r"step 5 \(epoch 0, items \[20, 21, 22, 23\]\)"):
        list(loader)


def test_worker_init_fn_and_worker_info():
    seen = []

    class Who(Squares):
        def __getitem__(self, i):
            info = flowstate.get_worker_info()
            return torch.tensor([info.id if info else -1, info.num_workers if info else 0]), i

    def init(worker_id):
        assert flowstate.get_worker_info().id == worker_id

    got = [x for x, _ in flowstate.DataLoader(Who(8), batch_size=2, num_workers=2,
                                              worker_init_fn=init)]
    assert [t[:, 0].tolist() for t in got] == [[0, 0], [1, 1], [0, 0], [1, 1]]
    assert flowstate.get_worker_info() is None
    seen.append(got)


def test_persistent_workers_keep_their_processes_across_epochs():
    loader = flowstate.DataLoader(Squares(), batch_size=8, num_workers=2,
                                  persistent_workers=True)
    list(loader)
    pids = loader._pool.pids
    list(loader)
    assert loader._pool.pids == pids
    loader.close()


def test_arguments_it_cannot_honour_are_refused_by_name():
    ds = Squares()
    with pytest.raises(flowstate.ConfigError, match="batch_sampler"):
        flowstate.DataLoader(ds, batch_sampler=tud.BatchSampler(tud.SequentialSampler(ds), 4,
                                                                False))
    with pytest.raises(flowstate.ConfigError, match="sampler=WeightedRandomSampler"):
        flowstate.DataLoader(ds, sampler=tud.WeightedRandomSampler([1.0] * 103, 10))
    with pytest.raises(flowstate.ConfigError, match="persistent_workers"):
        flowstate.DataLoader(ds, persistent_workers=True)
    with pytest.raises(flowstate.ConfigError, match="shuffle=True with an IterableDataset"):
        flowstate.DataLoader(Stream(), shuffle=True)
    # The samplers it can translate.
    assert same(epoch_values(flowstate.DataLoader(ds, batch_size=9,
                                                  sampler=tud.SequentialSampler(ds))),
                epoch_values(flowstate.DataLoader(ds, batch_size=9)))


def test_ranks_split_like_distributed_sampler_with_equal_steps(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    seen, steps = [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        loader = flowstate.DataLoader(Squares(100), batch_size=8, shuffle=True, seed=2)
        ys = [y for _, y in loader]
        steps.append(len(ys))
        assert len(loader) == len(ys)
        seen += torch.cat(ys).tolist()
    assert steps == [5, 5, 5]  # 34 per rank: 100 padded to 102
    assert sorted(set(seen)) == [i * i for i in range(100)] and len(seen) == 102
    # A DistributedSampler says the same.
    sampler = tud.distributed.DistributedSampler(Squares(100), num_replicas=3, rank=1, seed=2)
    loader = flowstate.DataLoader(Squares(100), batch_size=8, sampler=sampler)
    sampler.set_epoch(4)
    list(loader)
    assert loader.info.epoch == 4


class Stream(tud.IterableDataset):
    """An iterable dataset with a position it can save."""

    def __init__(self, n=30):
        self.n, self.i = n, 0

    def __iter__(self):
        self.i = 0
        while self.i < self.n:
            self.i += 1
            yield {"v": torch.tensor([self.i - 1]), "sq": (self.i - 1) ** 2}

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def test_iterable_dataset_through_workers_and_unbatched():
    class Sized(Stream):
        def __len__(self):
            return self.n

    assert len(flowstate.DataLoader(Sized(), batch_size=4)) == 8
    assert len(flowstate.DataLoader(Sized(), batch_size=4, drop_last=True)) == 7
    with pytest.raises(TypeError, match="without __len__"):
        len(flowstate.DataLoader(Stream(), batch_size=4))
    plain = [b["v"].flatten().tolist() for b in flowstate.DataLoader(Stream(), batch_size=4)]
    assert plain[0] == [0, 1, 2, 3] and plain[-1] == [28, 29]
    par = [b["v"].flatten().tolist() for b in flowstate.DataLoader(Stream(), batch_size=4,
                                                                    num_workers=2)]
    assert par == plain
    one = list(flowstate.DataLoader(Squares(5), batch_size=None))
    assert len(one) == 5 and one[2][1] == 4 and torch.equal(one[2][0], torch.tensor([2.0, 1.0]))


def test_after_close_every_method_raises_flowstate_error():
    loader = flowstate.DataLoader(Squares(), batch_size=8)
    next(iter(loader))
    loader.close()
    for call in (lambda: iter(loader), loader.state_dict, lambda: len(loader),
                 lambda: loader.set_epoch(1)):
        with pytest.raises(flowstate.Error, match="closed"):
            call()


def test_a_state_of_another_dataset_or_seed_is_refused():
    a = flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=1)
    next(iter(a))
    sd = a.state_dict()
    with pytest.raises(flowstate.CheckpointError, match="seed=1"):
        flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=2).load_state_dict(sd)
    with pytest.raises(flowstate.CheckpointError, match="dataset"):
        flowstate.DataLoader(Squares(50), batch_size=8, shuffle=True, seed=1).load_state_dict(sd)
    with pytest.raises(flowstate.CheckpointError, match="batch_size=8 \\(now 4\\)"):
        flowstate.DataLoader(Squares(), batch_size=4, shuffle=True, seed=1).load_state_dict(sd)
    # Also a state at an epoch's end, which holds no plan state.
    e = flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=1)
    list(e)
    assert e.state_dict()["state"] is None and e.state_dict()["epoch"] == 1
    with pytest.raises(flowstate.CheckpointError, match="drop_last=False \\(now True\\)"):
        flowstate.DataLoader(Squares(), batch_size=8, shuffle=True, seed=1,
                             drop_last=True).load_state_dict(e.state_dict())
    # A drawn seed is the saved one after the load.
    c = flowstate.DataLoader(Squares(), batch_size=8, shuffle=True)
    c.load_state_dict(sd)
    assert c.seed == 1


def test_timeout_pin_memory_and_the_options_that_need_workers():
    import time

    class Slow(Squares):
        def __getitem__(self, i):
            time.sleep(5)
            return super().__getitem__(i)

    loader = flowstate.DataLoader(Slow(4), batch_size=2, num_workers=1, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(flowstate.Error, match=r"no batch from worker 0 within timeout=0.5 s "
                                              r"\(it is running step 0 \(epoch 0, items \[0, 1\]\)\)"):
        next(iter(loader))
    assert time.monotonic() - t0 < 4
    loader.close()
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="pin_memory=True, but no CUDA device"):
            next(iter(flowstate.DataLoader(Squares(4), batch_size=2, pin_memory=True)))
    with pytest.raises(flowstate.ConfigError, match="prefetch_factor"):
        next(iter(flowstate.DataLoader(Squares(4), batch_size=2, prefetch_factor=4)))
    with pytest.raises(flowstate.ConfigError, match="multiprocessing_context='spawn'"):
        flowstate.DataLoader(Squares(4), multiprocessing_context="spawn")
