"""The native Loader keeps torch's conventions too: one epoch per iteration, len per epoch,
set_epoch; dtypes torch 1.13 lacks; user frames in tracebacks; lifetimes at interpreter exit;
close(); worker processes for Python sources; the no-shard warning."""
import os
import subprocess
import sys
import textwrap
import traceback
import warnings

import flowstate
import numpy as np
import pytest
import torch
from conftest import every_epoch

# ---- epochs ----


def test_each_for_loop_is_one_epoch_and_len_is_per_epoch(records_doc):
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc))
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        infos = [b.info for b in loader]
        assert len(infos) == len(loader) == 63
        assert {i.epoch for i in infos} == {epoch} and infos[-1].is_last_in_epoch
        seen.append(infos[0].step)
    assert seen == [0, 63, 126] and loader.epoch == 3
    with pytest.raises(flowstate.Error, match="next epoch is 3"):
        loader.set_epoch(5)


def test_a_bounded_loader_refuses_an_iteration_past_its_epochs(records_doc):
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc), epochs=1)
    assert len(list(loader)) == 63
    with pytest.raises(flowstate.Error, match="ran its 1 epoch"):
        list(loader)


def test_after_a_resume_the_loop_continues_the_saved_epoch(records_doc):
    p = flowstate.Pipeline.from_dict(records_doc)
    a = flowstate.Loader(p)
    for _ in range(70):
        next(a)  # next() crosses epochs: 7 batches into epoch 1
    b = flowstate.Loader(p)
    b.load_state_dict(a.state_dict())
    assert b.epoch == 1
    b.set_epoch(1)  # what a torch loop calls: the same epoch, no change
    rest = [x.info.index_in_epoch for x in b]
    assert rest == list(range(7, 63))


def test_workers_arguments(records_doc):
    p = flowstate.Pipeline.from_dict(records_doc)
    assert len(list(flowstate.Loader(p, workers="auto"))) == 63
    # "inline": each batch made in next(), on the calling thread; the same batches.
    def data(loader):
        return [b["data"].numpy().tobytes() for b in loader]
    inline = data(flowstate.Loader(p, workers="inline"))
    assert len(inline) == 63 and inline == data(flowstate.Loader(p, workers=2))
    d = dict(records_doc, workers="inline")
    assert data(flowstate.Loader(flowstate.Pipeline.from_dict(d))) == inline
    with pytest.raises(flowstate.ConfigError, match="workers=0"):
        flowstate.Loader(p, workers=0)
    with pytest.raises(flowstate.ConfigError, match="num_workers"):
        flowstate.Loader(p, num_workers=2)  # a file source: threads, not processes


# ---- Python sources in worker processes ----


def slow_square(v):
    return v * v


def test_python_parts_in_worker_processes_give_the_same_batches_and_states(records_doc):
    def make():
        return (flowstate.from_sequence(list(range(90)), name="ints").seed(4)
                .shuffle(mode="global").map(slow_square, name="square")
                .filter(lambda v: v % 3 != 0, name="no3").batch(size=7).build())
    reference = [b.value.tolist() for b in every_epoch(flowstate.Loader(make(), epochs=2))]
    assert sorted(sum(reference[:len(reference) // 2], [])) == sorted(
        i * i for i in range(90) if i * i % 3)
    for workers in (1, 3):
        got = [b.value.tolist() for b in every_epoch(
            flowstate.Loader(make(), epochs=2, num_workers=workers))]
        assert got == reference
    a = flowstate.Loader(make(), epochs=2, num_workers=2)
    for _ in range(9):
        next(a)
    b = flowstate.Loader(make(), epochs=2, num_workers=0)
    b.load_state_dict(a.state_dict())
    a.close()
    assert [x.value.tolist() for x in every_epoch(b)] == reference[9:]


def test_checkpoint_of_a_plan_is_the_delivered_batch_not_the_planned_ones(tmp_path):
    p = flowstate.from_sequence(list(range(100)), name="ints").batch(size=5).build()
    a = flowstate.Loader(p, num_workers=2, prefetch_factor=4)
    for _ in range(3):
        next(a)
    assert a.save_checkpoint(tmp_path / "ck").endswith("step-000000000003")
    b = flowstate.Loader(p)
    assert b.restore(tmp_path / "ck")["step"] == 3
    assert next(b).value.tolist() == [15, 16, 17, 18, 19]


# ---- dtypes ----


def write_indexed(prefix, docs):
    """A Megatron-LM indexed data set of uint16 documents, written as its format says."""
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 2]).astype(np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.uint64(1).tobytes() + np.uint8(8).tobytes())
        f.write(np.uint64(len(docs)).tobytes() + np.uint64(len(docs) + 1).tobytes())
        f.write(sizes.tobytes() + pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    np.concatenate(docs).astype(np.uint16).tofile(f"{prefix}.bin")


def test_indexed_uint16_through_pack_and_batch_reaches_torch_widened(tmp_path):
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 65535, size=rng.integers(5, 90), dtype=np.uint16) for _ in range(40)]
    write_indexed(tmp_path / "corpus", docs)
    p = (flowstate.indexed(paths=str(tmp_path / "corpus.idx")).pack(length=64, separator=0)
         .batch(size=4).build())
    rows = [b["tokens"] for b in flowstate.Loader(p)]
    assert rows[0].dtype == torch.int32  # torch 1.13 has no uint16: widened, by the rule
    stream = np.concatenate([np.append(d, 0) for d in docs]).astype(np.int64)
    got = torch.cat(rows).flatten().numpy()
    assert np.array_equal(got, stream[:len(got)]) and got.max() > 32767


def test_types_torch_lacks_follow_the_documented_rule():
    def export(values, dtype):
        a = np.array(values, dtype=dtype)
        return flowstate._flowstate._export_view_for_test(a.tobytes(), 0, [len(values)], dtype)
    assert export([1, 65535], "uint16").tolist() == [1, 65535]
    assert export([1, 2**32 - 1], "uint32").dtype == torch.int64
    assert export([2**63 - 1], "uint64").tolist() == [2**63 - 1]
    with pytest.raises(flowstate.Error, match="field 'test' of dtype uint64 holds "
                                              "18446744073709551615"):
        export([2**64 - 1], "uint64")


# ---- errors and lifetimes ----


def test_a_callbacks_exception_keeps_the_users_frame(data_dir):
    def fails(sample):
        raise ValueError("from the user's map")  # the user's line
    p = (flowstate.records(paths=str(data_dir / "*.bin"), record_bytes=16)
         .map(fails, name="fails").batch(size=4).build())
    with pytest.raises(ValueError) as e:
        next(flowstate.Loader(p))
    text = "".join(traceback.format_exception(e.type, e.value, e.tb))
    assert "raise ValueError(\"from the user's map\")  # the user's line" in text, text
    assert e.value.flowstate_node == "fails"


def test_every_method_after_close_raises_flowstate_error(records_doc):
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(records_doc))
    next(loader)
    loader.close()
    for call in (lambda: next(loader), loader.state_dict, loader.state, lambda: len(loader),
                 lambda: iter(loader), loader.stats, lambda: loader.skip(1, 2),
                 lambda: loader.save_checkpoint("x"), lambda: loader.restore("x"),
                 lambda: loader.fingerprint):
        with pytest.raises(flowstate.Error, match="closed"):
            call()


def test_a_module_level_file_written_in_the_loop_is_complete_at_exit(tmp_path, data_dir):
    """No reference to __main__ outlives the interpreter's shutdown: a collate defined in
    __main__, a file opened at module level and written in the loop, no close()/del."""
    out = tmp_path / "log.txt"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import flowstate
        log = open({str(out)!r}, "w")

        def collate(items):
            return items

        loader = flowstate.Loader(flowstate.from_sequence(list(range(100)), name="ints",
                                                          collate=collate).batch(size=10).build(),
                                  workers=2)
        for b in loader:
            log.write(f"{{b.info.step}}\\n")
        log.write("end\\n")
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=os.environ.copy(), timeout=120)
    assert run.returncode == 0, run.stderr
    assert out.read_text().split() == [str(i) for i in range(10)] + ["end"]


def test_no_shard_under_a_world_size_warns_once(records_doc, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        flowstate.Pipeline.from_dict(records_doc)
    assert any("world size 4 but the pipeline has no shard" in str(x.message) for x in w)
    doc = dict(records_doc, nodes=[{"shard": {}}] + records_doc["nodes"])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        flowstate.Pipeline.from_dict(doc)
    assert not any("no shard" in str(x.message) for x in w)


def test_the_command_warns_of_a_missing_shard_too(tmp_path, data_dir, cli):
    (tmp_path / "p.yaml").write_text(
        f"source: {{type: records, paths: \"{data_dir}/*.bin\", record_bytes: 16}}\n"
        "nodes:\n  - batch: {size: 8}\n")
    env = dict(os.environ, WORLD_SIZE="4", RANK="0")
    run = subprocess.run([cli, "validate", str(tmp_path / "p.yaml")], capture_output=True,
                         text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "world size 4 but the pipeline has no shard node" in run.stderr
    env["WORLD_SIZE"] = "1"
    run = subprocess.run([cli, "validate", str(tmp_path / "p.yaml")], capture_output=True,
                         text=True, env=env, timeout=60)
    assert "no shard" not in run.stderr
