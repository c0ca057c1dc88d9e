"""Python sequences and iterables of any type as sources; map, filter, collate; gradient
accumulation."""
import dataclasses
import pickle
import warnings

import flowstate
import numpy as np
import pytest
import torch
from conftest import every_epoch, record


@dataclasses.dataclass
class Item:
    x: float
    label: int


def items(n=50):
    return [Item(x=i * 0.5, label=i % 3) for i in range(n)]


def collate_items(batch):
    return {"x": torch.tensor([b.x for b in batch]), "label": torch.tensor([b.label for b in batch])}


def records(doc):
    """A builder on the records source of `doc` (conftest's records_doc)."""
    return flowstate.records(**{k: v for k, v in doc["source"].items() if k != "type"})


def drain(loader, key):
    return [(b.info.step, b[key].clone()) for b in every_epoch(loader)]


def test_dataclass_items_through_from_sequence_and_collate():
    p = flowstate.from_sequence(items(), name="items", collate=collate_items).batch(size=8).build()
    batches = list(flowstate.Loader(p))
    assert len(batches) == 7
    assert torch.equal(batches[0]["x"], torch.arange(8) * 0.5)
    assert torch.equal(batches[6]["label"], torch.tensor([48 % 3, 49 % 3]))
    assert batches[6].info.is_last_in_epoch and batches[6].info.remainder == 2


def test_default_collate_stacks_like_pytorch():
    seq = [{"a": i, "b": torch.full((2,), float(i)), "c": (i, i * 2)} for i in range(6)]
    b = next(flowstate.Loader(flowstate.from_sequence(seq, name="dicts").batch(size=3).build()))
    assert torch.equal(b["a"], torch.tensor([0, 1, 2]))
    assert b["b"].shape == (3, 2)
    assert [t.tolist() for t in b["c"]] == [[0, 1, 2], [0, 2, 4]]
    d = next(flowstate.Loader(flowstate.from_sequence(items(), name="items").batch(size=2).build()))
    assert torch.equal(d["label"], torch.tensor([0, 1]))  # a dataclass collates by field


@pytest.mark.parametrize("cut", [0, 3, 7, 11])
def test_sequence_with_shuffle_resumes_exactly(cut):
    def make():
        return (flowstate.from_sequence(items(), name="items", collate=collate_items).seed(3)
                .shuffle(mode="buffer", size=10).batch(size=4).build())
    reference = drain(flowstate.Loader(make(), epochs=2), "x")
    assert sorted(torch.cat([x for _, x in reference[:13]]).tolist()) == [i * 0.5 for i in range(50)]
    a = flowstate.Loader(make(), epochs=2)
    for _ in range(cut):
        next(a)
    sd = pickle.loads(pickle.dumps(a.state_dict()))
    b = flowstate.Loader(make(), epochs=2, workers=1)
    b.load_state_dict(sd)
    rest = drain(b, "x")
    assert [s for s, _ in rest] == [s for s, _ in reference[cut:]]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(rest, reference[cut:]))


class Counter:
    """An iterator with state_dict/load_state_dict (as torchdata's stateful iterators)."""

    def __init__(self, n):
        self.n, self.i = n, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return {"v": self.i - 1}

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


@pytest.mark.parametrize("cut", [0, 2, 5, 9])
def test_generator_with_state_dict_resumes_exactly(cut):
    made = []

    def factory(epoch):
        made.append(epoch)
        return Counter(23)

    def make():
        return flowstate.from_iterable(factory, name="counter").batch(size=5).build()
    reference = drain(flowstate.Loader(make(), epochs=2), "v")
    assert len(reference) == 10 and reference[4][1].tolist() == [20, 21, 22]
    a = flowstate.Loader(make(), epochs=2)
    for _ in range(cut):
        next(a)
    sd = a.state_dict()
    b = flowstate.Loader(make(), epochs=2)
    b.load_state_dict(sd)
    rest = drain(b, "v")
    assert [s for s, _ in rest] == list(range(cut, 10))
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(rest, reference[cut:]))


def test_generator_without_state_replays_with_a_warning():
    def make():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            p = flowstate.from_iterable(lambda: (i * i for i in range(12)), name="squares") \
                .batch(size=4).build()
        assert any("replay" in str(x.message) for x in w)
        return p
    reference = drain(flowstate.Loader(make()), "squares")
    a = flowstate.Loader(make())
    next(a)
    b = flowstate.Loader(make())
    b.load_state_dict(a.state_dict())
    rest = drain(b, "squares")
    assert [t.tolist() for _, t in rest] == [[16, 25, 36, 49], [64, 81, 100, 121]]
    assert [t.tolist() for _, t in rest] == [t.tolist() for _, t in reference[1:]]


def test_the_accelerate_example():
    class OnlyIter:
        def __iter__(self):
            return iter(range(16))
    obj = OnlyIter()
    loader = flowstate.Loader(
        flowstate.from_iterable(lambda: iter(obj), name="ints").batch(size=4).device_copy().build())
    got = [b.value for b in loader]
    assert [t.tolist() for t in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert all(isinstance(t, torch.Tensor) for t in got)


def test_from_sequence_with_collate_and_device_copy():
    p = (flowstate.from_sequence(items(10), name="items", collate=collate_items)
         .batch(size=4).device_copy().build())
    batches = list(flowstate.Loader(p))
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0]]
    assert [b["x"].tolist() for b in batches] == [[0.0, 0.5, 1.0, 1.5], [2.0, 2.5, 3.0, 3.5],
                                                  [4.0, 4.5]]
    # "auto": the collated tensors move to the GPU when there is one, else stay on the host.
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert all(b["x"].device.type == expected and b["label"].device.type == expected
               for b in batches)
    for b in batches:
        b.wait()  # a host wait: nothing to wait for on the host


def test_map_tensors_walks_dicts_lists_and_tuples():
    value = {"a": torch.arange(3), "b": [torch.ones(2), (torch.zeros(1), 7)], "c": "text"}
    moved = flowstate._map_tensors(value, lambda t: t + 1)
    assert moved["a"].tolist() == [1, 2, 3] and moved["b"][0].tolist() == [2.0, 2.0]
    assert moved["b"][1][0].tolist() == [1.0] and moved["b"][1][1] == 7
    assert isinstance(moved["b"][1], tuple) and moved["c"] == "text"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a lent one)")
def test_python_batches_move_to_the_device_on_the_current_stream():
    p = (flowstate.from_sequence(items(10), name="items", collate=collate_items)
         .batch(size=4).device_copy(device="cuda:0").build())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        batches = [(b["x"] * 2, b["label"].clone()) for b in flowstate.Loader(p)]
    torch.cuda.synchronize()
    assert all(x.device.type == "cuda" for x, _ in batches)
    assert [x.cpu().tolist() for x, _ in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0],
                                                      [8.0, 9.0]]


def test_python_map_and_filter():
    p = (flowstate.from_sequence(list(range(40)), name="ints")
         .map(lambda v: v * 10, name="times10").filter(lambda v: v % 20 == 0, name="even")
         .batch(size=5).build())
    batches = list(flowstate.Loader(p, workers=3))
    assert [b.value.tolist() for b in batches] == [[0, 20, 40, 60, 80], [100, 120, 140, 160, 180],
                                                   [200, 220, 240, 260, 280],
                                                   [300, 320, 340, 360, 380]]
    assert batches[-1].info.is_last_in_epoch


def test_a_failing_map_raises_the_original_exception_naming_the_node():
    class Boom(KeyError):
        pass

    def explode(v):
        if v == 13:
            raise Boom("thirteen")
        return v
    p = flowstate.from_sequence(list(range(40)), name="ints").map(explode, name="explode") \
        .batch(size=4).build()
    loader = flowstate.Loader(p)
    with pytest.raises(Boom) as e:
        for _ in loader:
            pass
    assert e.value.flowstate_node == "explode"
    assert any("explode" in n for n in getattr(e.value, "__notes__", []))


def test_gradient_accumulator_syncs_at_every_nth_and_at_the_epochs_last_batch():
    p = flowstate.from_sequence(list(range(22)), name="ints").batch(size=4).build()  # 6 batches
    acc = flowstate.GradientAccumulator(steps=4, batch_size=4)
    syncs = [(b.info.epoch, b.info.index_in_epoch) for b in every_epoch(flowstate.Loader(p, epochs=2))
             if acc.sync_gradients(b)]
    assert syncs == [(0, 3), (0, 5), (1, 3), (1, 5)]
    # Mid-window after a resume: the answer depends on batch.info only.
    a = flowstate.Loader(p, epochs=2)
    for _ in range(2):
        next(a)
    b = flowstate.Loader(p, epochs=2)
    b.load_state_dict(a.state_dict())
    assert [acc.sync_gradients(x) for x in b][:4] == [False, True, False, True]


@pytest.mark.parametrize("cut", [0, 1, 4, 9, 13, 19])
def test_a_generator_with_state_dict_can_be_buffer_shuffled_and_resumes_exactly(cut):
    calls = {"next": 0}

    class Counted(Counter):
        def __next__(self):
            calls["next"] += 1
            return super().__next__()

    def make():
        return (flowstate.from_iterable(lambda: Counted(61), name="counter").seed(11)
                .shuffle(mode="buffer", size=7).batch(size=6).build())
    reference = drain(flowstate.Loader(make(), epochs=2), "v")
    values = [v for _, t in reference[:11] for v in t.tolist()]
    assert sorted(values) == list(range(61)) and values != list(range(61))
    a = flowstate.Loader(make(), epochs=2)
    for _ in range(cut):
        next(a)
    sd = pickle.loads(pickle.dumps(a.state_dict()))
    del a
    b = flowstate.Loader(make(), epochs=2, workers=1, prefetch=1)
    calls["next"] = 0
    b.load_state_dict(sd)
    rest = drain(b, "v")
    assert [s for s, _ in rest] == [s for s, _ in reference[cut:]]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(rest, reference[cut:]))


def test_a_shuffled_generator_resumes_without_reproducing_the_consumed_prefix():
    calls = {"next": 0}

    class Counted(Counter):
        def __next__(self):
            calls["next"] += 1
            return super().__next__()

    def make():
        return (flowstate.from_iterable(lambda: Counted(6000), name="counter")
                .shuffle(mode="buffer", size=20).batch(size=6).build())
    a = flowstate.Loader(make())
    for _ in range(500):  # 3000 items consumed
        next(a)
    sd = a.state_dict()
    expected = next(a)["v"].tolist()
    b = flowstate.Loader(make(), workers=1, prefetch=1)
    calls["next"] = 0
    b.load_state_dict(sd)
    assert next(b)["v"].tolist() == expected
    # About four buffers (80 items) re-produced to rebuild the buffer, plus what the graph
    # prepares ahead — cheap batches travel in groups of up to 32 (192 items), and a message or
    # two may be in flight: never the 3000 consumed.
    assert calls["next"] < 600, calls


def test_the_interpreter_exits_cleanly_with_a_loader_running_python_callbacks(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "exit.py"
    script.write_text(
        "import flowstate\n"
        "p = flowstate.from_sequence(list(range(100000)), name='i').map(lambda v: v + 1)"
        ".batch(size=10).build()\n"
        "loader = flowstate.Loader(p, workers=2)\n"
        "print(next(loader).value[:3].tolist())\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1, 2, 3]"


def test_a_sequence_can_be_sharded():
    def rank(r):
        p = flowstate.from_sequence(list(range(20)), name="ints").shard(world=2, rank=r) \
            .batch(size=5).build()
        return [v for b in flowstate.Loader(p) for v in b.value.tolist()]
    a, b = rank(0), rank(1)
    assert len(a) == len(b) == 10 and sorted(a + b) == list(range(20))


def test_python_map_and_filter_on_tensor_samples(records_doc):
    # A map on a records source gets a dict field -> read-only numpy view and returns a dict of
    # arrays (numpy, torch, anything numpy.asarray takes).
    def index_and_sum(sample):
        row = sample["data"]
        assert isinstance(row, np.ndarray) and not row.flags.writeable
        return {"index": row[:4].view(np.uint32).astype(np.int64),
                "total": torch.tensor([int(row[4:].sum())])}
    p = (records(records_doc)
         .map(index_and_sum, name="index_and_sum")
         .filter(lambda s: int(s["index"][0]) % 2 == 0, name="even")
         .batch(size=10).build())
    batches = list(flowstate.Loader(p))
    assert sorted(batches[0]) == ["index", "total"]
    index = torch.cat([b["index"].flatten() for b in batches])
    assert index.dtype == torch.int64 and index.tolist() == list(range(0, 2000, 2))
    total = torch.cat([b["total"].flatten() for b in batches])
    assert total.tolist() == [int(record(i)[4:].sum()) for i in range(0, 2000, 2)]


def test_a_python_map_on_tensor_samples_cannot_write_the_source(records_doc):
    def in_place(sample):
        sample["data"][0] = 1  # the view is read-only: it may map the file itself
        return sample
    p = (records(records_doc)
         .map(in_place, name="in_place").batch(size=4).build())
    with pytest.raises(ValueError) as e:
        next(flowstate.Loader(p))
    assert e.value.flowstate_node == "in_place"


def test_a_python_map_returning_a_non_mapping_for_tensor_samples_is_an_error(records_doc):
    p = (records(records_doc)
         .map(lambda s: 3, name="three").batch(size=4).build())
    with pytest.raises(flowstate.Error, match="map 'three' returned int for a sample of tensor "
                                              "fields; return a dict field -> array") as e:
        next(flowstate.Loader(p))
    assert e.value.node == "three"
