"""Changing a mix's data from Python (issue 25): Loader.set_mix_weights at steps 100 and 250 in
a real process killed with SIGKILL after step 300 and resumed from its state_dict gives the
uninterrupted run's bytes; load_state_dict(state, data_changed="continue") opts into a changed
pipeline, which is refused without it."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import RECORD_BYTES, flowstate

SCRIPT = textwrap.dedent("""
    import hashlib, os, pickle, signal, sys
    import flowstate
    pipeline, ckpt, out, kill_after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    loader = flowstate.Loader(flowstate.Pipeline.from_yaml(pipeline))
    step = 0
    if os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            sd = pickle.load(f)
        loader.load_state_dict(sd)
        step = sd["step"]
    with open(out, "a") as log:
        while step < 400:
            if step == 100:
                loader.set_mix_weights("mix", [1, 5])
            if step == 250:
                loader.set_mix_weights("mix", [4, 1])
            b = next(loader)
            assert b.info.step == step
            log.write(f"{step} {hashlib.sha256(b['data'].numpy().tobytes()).hexdigest()}\\n")
            log.flush()
            step += 1
            if step % 50 == 0:
                with open(ckpt + ".tmp", "wb") as f:
                    pickle.dump(loader.state_dict(), f)
                os.replace(ckpt + ".tmp", ckpt)
                if step == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
    print(len(loader.data_changes))
""")


def write_mix(tmp_path, data_dir, inputs, weights):
    for name, (seed, part) in {"a": (1, 0), "b": (2, 1), "c": (3, 0)}.items():
        (tmp_path / f"in_{name}.yaml").write_text(
            f"seed: {seed}\nsource: {{type: records, paths: '{data_dir}/part-0000{part}.bin', "
            f"record_bytes: {RECORD_BYTES}}}\nnodes:\n  - shuffle: {{mode: global}}\n")
    path = tmp_path / "mix.yaml"
    path.write_text(f"seed: 9\nsource: {{type: mix, inputs: [{', '.join(inputs)}], "
                    f"weights: {weights}, stop: cycle}}\nnodes:\n  - batch: {{size: 4}}\n")
    return path


def run_script(tmp_path, pipeline, ckpt, out, kill_after=0):
    script = tmp_path / "train_mix.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), str(pipeline), str(ckpt), str(out),
                           str(kill_after)], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=300)


def test_weights_set_at_100_and_250_killed_at_300_resume_byte_identically(tmp_path, data_dir):
    pipeline = write_mix(tmp_path, data_dir, ["in_a.yaml", "in_b.yaml"], "[1, 1]")
    run = run_script(tmp_path, pipeline, tmp_path / "straight.pkl", tmp_path / "straight.txt")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "2"
    reference = (tmp_path / "straight.txt").read_text().splitlines()
    assert len(reference) == 400

    ckpt, out = tmp_path / "killed.pkl", tmp_path / "killed.txt"
    run = run_script(tmp_path, pipeline, ckpt, out, kill_after=300)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert len(out.read_text().splitlines()) == 300
    run = run_script(tmp_path, pipeline, ckpt, out)
    assert run.returncode == 0, run.stderr
    assert out.read_text().splitlines() == reference


def test_a_changed_mix_needs_the_opt_in(tmp_path, data_dir):
    before = flowstate.Loader(flowstate.Pipeline.from_yaml(
        write_mix(tmp_path, data_dir, ["in_a.yaml", "in_b.yaml"], "[1, 1]")))
    for _ in range(5):
        next(before)
    sd = before.state_dict()
    changed = write_mix(tmp_path, data_dir, ["in_a.yaml", "in_b.yaml", "in_c.yaml"], "[1, 1, 2]")
    loader = flowstate.Loader(flowstate.Pipeline.from_yaml(changed))
    with pytest.raises(flowstate.CheckpointError, match=r"data_changed=\"continue\""):
        loader.load_state_dict(sd)
    with pytest.raises(flowstate.ConfigError, match="data_changed='maybe'"):
        loader.load_state_dict(sd, data_changed="maybe")
    loader.load_state_dict(sd, data_changed="continue")
    assert next(loader).info.step == 5
    [(step, what)] = loader.data_changes
    assert step == 5
    assert "mix: input 2 added, from its beginning" in what
    text = flowstate.describe_state(loader.state_dict())
    assert ("data changes:\n  step 5: mix.weights: [1, 1] in checkpoint, [1, 1, 2] now\n"
            "      mix.inputs[2]: absent in checkpoint") in text
    with pytest.raises(flowstate.ConfigError, match="'nope' is not a mix node"):
        loader.set_mix_weights("nope", [1, 1, 1])


def test_a_file_added_to_the_glob_waits_for_the_next_epoch(tmp_path, data_dir):
    """A file added to the source's glob: refused without the opt-in; with it, epoch 0 finishes
    over the file it started with and epoch 1 is a fresh pipeline's over both."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(data_dir / "part-00000.bin", data / "part-00000.bin")
    doc = {"seed": 3, "epochs": 2,
           "source": {"type": "records", "paths": str(data / "*.bin"),
                      "record_bytes": RECORD_BYTES},
           "nodes": [{"shuffle": {"mode": "global"}}, {"batch": {"size": 50}}]}

    def ids(batch):
        return batch["data"].numpy()[:, :4].copy().view(np.uint32).ravel().tolist()

    before = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    first = [i for _ in range(4) for i in ids(next(before))]
    sd = before.state_dict()
    old_rest = [i for b in before if b.info.epoch == 0 for i in ids(b)]

    shutil.copy(data_dir / "part-00001.bin", data / "part-00001.bin")
    refused = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    with pytest.raises(flowstate.CheckpointError, match="part-00001.bin is new"):
        refused.load_state_dict(sd)
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    loader.load_state_dict(sd, data_changed="continue")
    batches = list(loader) + list(loader)  # the rest of epoch 0, then epoch 1
    rest = [i for b in batches if b.info.epoch == 0 for i in ids(b)]
    assert rest == old_rest
    assert sorted(first + rest) == list(range(1000))
    fresh = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    fresh_batches = list(fresh) + list(fresh)
    expected = [i for b in fresh_batches if b.info.epoch == 1 for i in ids(b)]
    assert [i for b in batches if b.info.epoch == 1 for i in ids(b)] == expected
    assert sorted(expected) == list(range(2000))
    [(step, what)] = loader.data_changes
    assert step == 4
    assert "part-00001.bin added (1000 records): epoch 0 finishes over the 1 files" in what


def test_a_file_removed_mid_epoch_under_a_shuffle_has_its_records_skipped(tmp_path, data_dir):
    """A file removed from the glob of a globally shuffled source mid-epoch: refused without the
    opt-in; with it, the rest of epoch 0 is the uninterrupted run's less the removed file's
    records, in order, and epoch 1 a fresh pipeline's over the files kept."""
    data = tmp_path / "data"
    data.mkdir()
    for k in range(2):
        shutil.copy(data_dir / f"part-0000{k}.bin", data / f"part-0000{k}.bin")
    doc = {"seed": 3, "epochs": 2,
           "source": {"type": "records", "paths": str(data / "*.bin"),
                      "record_bytes": RECORD_BYTES},
           "nodes": [{"shuffle": {"mode": "global"}}, {"batch": {"size": 50}}]}

    def ids(batch):
        return batch["data"].numpy()[:, :4].copy().view(np.uint32).ravel().tolist()

    before = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    first = [i for _ in range(6) for i in ids(next(before))]
    sd = before.state_dict()
    old_rest = [i for b in before if b.info.epoch == 0 for i in ids(b)]

    (data / "part-00000.bin").unlink()  # records 0..999; part-00001's are numbered from 0 now
    refused = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    with pytest.raises(flowstate.CheckpointError, match="part-00000.bin was in the checkpoint"):
        refused.load_state_dict(sd)
    loader = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    loader.load_state_dict(sd, data_changed="continue")
    batches = list(loader) + list(loader)  # the rest of epoch 0, then epoch 1
    rest = [i for b in batches if b.info.epoch == 0 for i in ids(b)]
    assert rest == [i for i in old_rest if i >= 1000]
    assert sorted(i for i in first + rest if i >= 1000) == list(range(1000, 2000))
    fresh = flowstate.Loader(flowstate.Pipeline.from_dict(doc))
    fresh_batches = list(fresh) + list(fresh)
    expected = [i for b in fresh_batches if b.info.epoch == 1 for i in ids(b)]
    assert [i for b in batches if b.info.epoch == 1 for i in ids(b)] == expected
    [(step, what)] = loader.data_changes
    assert step == 6
    assert ("part-00000.bin removed: its 1000 records are skipped where 'shuffle' has not yet "
            "delivered them in epoch 0") in what
