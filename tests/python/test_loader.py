"""The Loader: batches as torch tensors through DLPack, batch.info, state_dict, checkpoints."""
import gc
import pickle

import flowstate
import numpy as np
import pytest
import torch
from conftest import RECORD_BYTES, every_epoch, record


def index_of(row):
    return int(np.frombuffer(row[:4].numpy().tobytes(), dtype=np.uint32)[0])


def test_batches_hold_the_records_bytes(records_doc):
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc))
    seen = []
    for b in loader:
        t = b["data"]
        assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8
        assert list(b) == ["data"] and dict(b)["data"] is not None
        for row in t:
            i = index_of(row)
            assert np.array_equal(row.numpy(), record(i))
            seen.append(i)
    assert sorted(seen) == list(range(2000))


def test_batch_info(records_doc):
    batches = every_epoch(flowstate.Loader(flowstate.Pipeline.from_dict(records_doc), epochs=2))
    assert len(batches) == 126
    last = batches[62].info
    assert (last.step, last.epoch, last.index_in_epoch, last.batches_in_epoch) == (62, 0, 62, 63)
    assert last.is_last_in_epoch and last.num_samples == 16 and last.remainder == 16
    nxt = batches[63].info
    assert (nxt.step, nxt.epoch, nxt.index_in_epoch, nxt.is_last_in_epoch) == (63, 1, 0, False)


def test_batch_info_counts_the_padding_of_a_short_rank(records_doc):
    # 2000 records over 3 ranks: ranks 0 and 1 take 667, rank 2 takes 666 and one padding
    # sample (shard's default `uneven: pad`), so every rank takes the same number of steps.
    totals = {}
    for rank in range(3):
        doc = dict(records_doc)
        doc["nodes"] = [{"shard": {"rank": rank, "world": 3}}, {"batch": {"size": 32}}]
        infos = [b.info for b in flowstate.Loader(flowstate.Pipeline.from_dict(doc), epochs=1)]
        totals[rank] = (len(infos), sum(i.num_samples for i in infos), sum(i.padding for i in infos))
    assert totals == {0: (21, 667, 0), 1: (21, 667, 0), 2: (21, 667, 1)}


def test_len_is_known_for_a_sized_pipeline(records_doc):
    # torch's convention: batches per epoch, whatever the number of epochs.
    assert len(flowstate.Loader(flowstate.Pipeline.from_dict(records_doc), epochs=3)) == 63
    assert len(flowstate.Loader(flowstate.Pipeline.from_dict(records_doc))) == 63


def test_batch_is_a_read_only_mapping(records_doc):
    b = next(flowstate.Loader(flowstate.Pipeline.from_dict(records_doc)))
    with pytest.raises(TypeError):
        b["data"] = torch.zeros(1)
    assert "data" in b and len(b) == 1


def test_a_view_arrives_with_its_own_bytes():
    # A tensor 24 bytes into its buffer (a slice, a crop, a user's view). torch 1.13 ignores
    # DLPack's byte_offset, so the export must point at the view itself.
    data = bytes(range(64))
    t = flowstate._flowstate._export_view_for_test(data, 24, [2, 4])
    assert t.shape == (2, 4) and t.dtype == torch.uint8
    assert t.flatten().tolist() == list(range(24, 32))
    u = flowstate._flowstate._export_view_for_test(data, 60, [4])
    assert u.tolist() == [60, 61, 62, 63]


def test_tensors_share_the_buffer_and_outlive_the_loader(records_doc):
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc))
    b = next(loader)
    t = b["data"]
    again = b["data"]
    assert t.data_ptr() == again.data_ptr()  # one buffer, no copy per access
    expected = t.clone()
    del b, loader
    gc.collect()
    # Other loaders reuse pooled memory: the kept tensor must still hold its own bytes.
    for _ in flowstate.Loader(flowstate.Pipeline.from_dict(records_doc)):
        pass
    assert torch.equal(t, expected)


def drain(loader):
    return [(b.info.step, b["data"].clone()) for b in every_epoch(loader)]


@pytest.mark.parametrize("cut", [0, 1, 30, 62, 63, 100])
def test_state_dict_restores_the_next_batch_exactly(records_doc, cut):
    p = flowstate.Pipeline.from_dict(dict(records_doc, nodes=[
        {"shuffle": {"mode": "buffer", "size": 100}}, {"batch": {"size": 32}}]))
    reference = drain(flowstate.Loader(p, epochs=2))
    first = flowstate.Loader(p, epochs=2, workers=1)
    for _ in range(cut):
        next(first)
    sd = pickle.loads(pickle.dumps(first.state_dict()))
    assert sd["step"] == cut and sd["fingerprint"] == p.fingerprint
    # Counters and the source's data identity (each file's name, sampled blocks and stat).
    assert len(sd["state"]) < 2048
    del first
    second = flowstate.Loader(p, epochs=2, workers=3)  # another worker count
    second.load_state_dict(sd)
    rest = drain(second)
    assert [s for s, _ in rest] == [s for s, _ in reference[cut:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, reference[cut:]))


def test_a_mismatched_pipeline_is_refused_naming_the_field(records_doc):
    p = flowstate.Pipeline.from_dict(records_doc)
    loader = flowstate.Loader(p)
    next(loader)
    sd = loader.state_dict()
    other = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc, overrides={"batch.size": 16}))
    with pytest.raises(flowstate.CheckpointError, match="batch.size: 32 in checkpoint, 16 now"):
        other.load_state_dict(sd)
    with pytest.raises(flowstate.CheckpointError, match="missing 'state'"):
        other.load_state_dict({"version": 1, "fingerprint": 1})


def test_skip_checkpoint_restore_and_stats(tmp_path, records_doc):
    p = flowstate.Pipeline.from_dict(records_doc)
    reference = drain(flowstate.Loader(p))
    loader = flowstate.Loader(p)
    loader.skip(3, 5)
    got = [next(loader).info.step for _ in range(4)]
    assert got == [0, 1, 2, 6]
    path = loader.save_checkpoint(tmp_path / "ck", keep=3)
    assert path.endswith("step-000000000007")
    stats = loader.stats()
    assert {s["name"] for s in stats["stages"]} >= {"spine", "assemble"}
    resumed = flowstate.Loader(p)
    found = resumed.restore(tmp_path / "ck")
    assert found["step"] == 7
    rest = drain(resumed)
    assert [s for s, _ in rest] == list(range(7, 63))
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, reference[7:]))
    assert flowstate.Loader(p).restore(tmp_path / "empty") is None
    (tmp_path / "bad" / "step-000000000001.tmp").mkdir(parents=True)
    with pytest.raises(flowstate.CheckpointError):
        flowstate.Loader(p).restore(tmp_path / "bad")


def test_fields_are_dlpack_producers_with_the_stream_protocol(records_doc):
    # On a host batch the protocol is the CPU one (no stream); the CUDA stream handover itself
    # is tested against the fake CUDA runtime (tests/nodes/cuda/device_copy_cuda_test.cpp).
    b = next(flowstate.Loader(flowstate.Pipeline.from_dict(records_doc)))
    producer = b.dlpack("data")
    assert producer.__dlpack_device__() == (1, 0)  # kDLCPU, device 0
    t = torch.utils.dlpack.from_dlpack(producer)
    assert t.data_ptr() == b["data"].data_ptr() and torch.equal(t, b["data"])
    assert torch.equal(torch.utils.dlpack.from_dlpack(producer.__dlpack__(stream=None)), t)
    b.wait()  # a host batch: nothing to wait for
    b.wait(stream=1)
    with pytest.raises(KeyError):
        b.dlpack("nope")


def test_device_copy_auto_hands_out_the_same_batches(records_doc):
    # With a CUDA device, "auto" copies to it and the loop's batches are handed over to the
    # current stream: .cpu() on that stream sees the copied bytes.
    plain = [(b.info.step, b["data"].clone())
             for b in flowstate.Loader(flowstate.Pipeline.from_dict(records_doc))]
    doc = dict(records_doc, nodes=records_doc["nodes"] + [{"device_copy": {"device": "auto"}}])
    copied = [(b.info.step, b["data"].cpu().clone())
              for b in flowstate.Loader(flowstate.Pipeline.from_dict(doc))]
    assert [s for s, _ in copied] == [s for s, _ in plain]
    assert all(torch.equal(a, c) for (_, a), (_, c) in zip(plain, copied))
